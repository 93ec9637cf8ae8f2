"""Op-level playback at every site kernel the sites know, scalar outputs
included.

A correct port of each kernel, written with its documented KUT signature
(tests/kernels/test_conventions.py), is played back on the captured inputs
of real training steps and passes: GPT's mean cross-entropy (a float32
scalar), layer norm, attention with
a mask, erf GELU and dots; Llama's RMSNorm, RoPE, SwiGLU and grouped-query
causal attention; the CNN's convolutions; token softmax over axis 1 and a
class-major log-softmax. The scalar case is in the CI set; the rest, a
golden run and a capture per model, is slow.
"""

import os
import sys

import pytest

import peat_jax as peat
from peat_jax import models

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "kernels"))
import test_conventions as conventions  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.pop(0)

TASKS = {
    "gpt": lambda: models.get_task("gpt", batch_size=2, context=16),
    "llama": lambda: models.get_task("llama", batch_size=2),
    "cnn": lambda: models.get_task("cnn", batch_size=2),
    "pooled": conventions._pooled_task,  # pylint: disable=protected-access
}
#: (task, kernels captured and played back)
CASES = [
    ("gpt", ("cross_entropy",)),
    pytest.param("gpt", ("layer_norm", "attention", "gelu", "dot_general"),
                 marks=pytest.mark.slow),
    pytest.param("llama", ("rms_norm", "rope", "silu", "attention"),
                 marks=pytest.mark.slow),
    pytest.param("cnn", ("conv_general_dilated",), marks=pytest.mark.slow),
    pytest.param("pooled", ("softmax", "log_softmax"), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, kernels", CASES)
def test_a_correct_port_passes_op_level_playback(name, kernels, tmp_path):
  d = tmp_path / "c"
  peat.profile(TASKS[name](), d, steps=1, checkpoint_every=1,
               capture_kernel=kernels, capture_phase="fwd", capture_steps=[0],
               budget_bytes=1 << 28)
  for kernel in kernels:
    spec = f"conventions:{kernel}"
    peat.register_kut(spec, conventions.PORTS[kernel], kernel=kernel)
    r = peat.playback_ops(d, spec)
    assert r.records, kernel
    for rec in r.records:
      diag = rec["diagnosis"]
      assert diag["verdict"] == "pass", (rec["site"], diag["model"],
                                         diag.get("evidence"))
    if kernel == "cross_entropy":
      assert all(rec["signature"]["n"] == 1 for rec in r.records)


def test_a_scalar_stored_as_one_element_is_read_in_the_sites_shape():
  """Captures written before 0-d arrays kept their shape hold a scalar
  output as ``[1]``; op-level playback reads it as the site's ``[]``, and
  leaves a scan-stacked output (one more axis) alone."""
  import types  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from peat_jax.profiler.capture import _oplevel  # pylint: disable=g-import-not-at-top
  site = types.SimpleNamespace(out_shapes=((), (4,)))
  old = [np.array([2.5], np.float32), np.arange(4, dtype=np.float32)]
  got = _oplevel._site_shaped(site, old)  # pylint: disable=protected-access
  assert got[0].shape == () and float(got[0]) == 2.5
  assert got[1].shape == (4,)
  stacked = _oplevel._site_shaped(  # pylint: disable=protected-access
      types.SimpleNamespace(out_shapes=((),)), [np.ones(3, np.float32)])
  assert stacked[0].shape == (3,)
