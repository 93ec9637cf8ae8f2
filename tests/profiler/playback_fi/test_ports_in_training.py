"""Port mismatches and a benign split-K matmul in training (playback).

The KUTs are plain JAX ports (peat_jax.kernels.ports) registered at the
composite sites of a small model trained for real: a dense layer, layer
norm, GELU, softmax gating and a 40-class head (40 = 2 x 16 + 8: a partial
last tile). Each port must be named by its cause at every checkpoint, with
the constant estimated where the probe fits one; the split-K matmul, whose
partial last tile sums its K terms in two halves, must pass.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
import optax
import pytest

import peat_jax as peat
from peat_jax.kernels import ports
from peat_jax.models import layers

pytestmark = pytest.mark.slow  # six KUTs compiled and played: ~1 minute

class _Model(nnx.Module):
  """Dense, layer norm, GELU, softmax gating, a 40-class head."""

  def __init__(self, rngs):
    key = rngs.params()
    k1, k2, k3 = jax.random.split(key, 3)
    self.w1 = nnx.Param(0.15 * jax.random.normal(k1, (24, 96)))
    self.scale = nnx.Param(1.0 + 0.1 * jax.random.normal(k2, (96,)))
    self.bias = nnx.Param(jnp.zeros((96,)))
    self.w2 = nnx.Param(0.2 * jax.random.normal(k3, (96, 40)))

  def __call__(self, x):
    h = layers.layer_norm(x @ self.w1[...], self.scale[...],
                          self.bias[...])
    h = layers.gelu(h)
    h = h * layers.softmax(h)
    return h @ self.w2[...]


def _loss(model, batch):
  logp = jax.nn.log_softmax(model(batch["x"]))
  return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], 1))


def _batch(position):
  rng = np.random.default_rng(500 + int(position))
  return {"x": rng.standard_normal((32, 24)).astype(np.float32),
          "y": rng.integers(0, 40, 32).astype(np.int32)}


TASK = peat.nnx_task(_Model, optax.adam(1e-2), _loss, _batch,
                     name="ports_task", default_steps=6,
                     default_checkpoint_every=3)


KUTS = {
    "test:ln_eps_1e-5": (functools.partial(ports.layer_norm_eps,
                                           port_eps=1e-5), "layer_norm",
                         "parameter"),
    "test:ln_eps_in_std": (ports.layer_norm_eps_std, "layer_norm",
                           "parameter"),
    "test:ln_fast_rsqrt": (ports.layer_norm_fast_rsqrt, "layer_norm",
                           "approximation"),
    "test:gelu_tanh": (ports.gelu_tanh, "gelu", "approximation"),
    "test:softmax_fast_exp": (ports.softmax_fast_exp, "softmax",
                              "approximation"),
    "test:split_k_edge": (ports.dot_general_split_k_edge, "dot_general",
                          None),
}
for _name, (_fn, _kernel, _) in KUTS.items():
  peat.register_kut(_name, _fn, kernel=_kernel)


@pytest.fixture(scope="module")
def played(tmp_path_factory):
  d = tmp_path_factory.mktemp("ports")
  golden = peat.golden_train(TASK, str(d / "golden"), steps=6,
                             checkpoint_every=3, seed=0).workdir
  return peat.playback_many(TASK, golden, list(KUTS), campaign_dir=d / "c")


@pytest.mark.parametrize("spec", [s for s, v in KUTS.items() if v[2]])
def test_port_is_named_by_its_cause_at_every_checkpoint(played, spec):
  _, kernel, want = KUTS[spec]
  recs = [r for r in played[spec].records if r["kernel"] == kernel]
  assert len(recs) >= 2  # one per checkpoint
  for r in recs:
    d = r["diagnosis"]
    assert d["model"] == want, (r["site"], r["step"], d["evidence"])
    assert d["verdict"] in ("warn", "fail")
  if spec == "test:ln_eps_1e-5":
    assert all("1e-05" in r["diagnosis"]["evidence"] for r in recs), [
        r["diagnosis"]["evidence"] for r in recs]


def test_split_k_matmul_with_a_partial_last_tile_passes(played):
  recs = played["test:split_k_edge"].records
  assert recs and all(r["kernel"] == "dot_general" for r in recs)
  # The head (40 columns: a partial tile of 8) differs from golden there.
  head = [r for r in recs if r["signature"]["share_differ"] > 0]
  assert head, "the split-K edge must change some output"
  for r in recs:
    assert r["diagnosis"]["verdict"] == "pass", (r["site"],
                                                 r["diagnosis"]["evidence"])
