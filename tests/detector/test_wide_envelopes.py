"""Faults whose size is within a 16-bit format's rounding envelope for some
elements, and outputs too small for shares: the Detector must still name
them by what only the fault explains.

* a scale by 1/2 in bfloat16/float16 moves the small elements by less than
  the 64 u envelope (0.25 relative in bfloat16), yet fits t = 0.5 r with no
  residual: ``scale``, whatever share lies beyond;
* a layer norm scaled by 1/2 fits an "epsilon" three times the variance:
  no epsilon slip (analyzer.probes._forms.EPS_MAX_SHARE), ``scale``;
* an output of 8 elements with 2 doubled (bit 7 of bfloat16, the lowest
  exponent bit) is 25% of it at 25x golden's error: no summation order;
* a bit stuck at 1 in 20% of a bfloat16 softmax: the outliers' sorted
  values line up with golden's among densely packed probabilities, but one
  bit, set in every one of them, explains them: ``stuck_at``.

Fresh seeded inputs; the calibration on captured site inputs is
``python -m peat_jax.tools.calibrate`` (docs/detector.md).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import injectors
from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access
from peat_jax.models import layers


def _normal(seed, shape, scale=1.0, offset=0.0):
  x = np.random.default_rng(seed).standard_normal(shape) * scale + offset
  return jnp.asarray(x.astype(np.float32))


def _run(case, dtype, fault, params, seed=3):
  inputs = tuple(x.astype(dtype) for x in case.inputs)
  g = jax.jit(case.golden_fn)(*inputs)
  r = cal.reference_of(case, inputs)
  t = injectors.inject(fault, jax.random.PRNGKey(seed), g, **params)
  ctx = {"kernel": case.kernel, "reduction": case.reduction}
  return cal.diagnose(t, g, r, ctx, probe=cal.probe_of(case, inputs),
                      dtype=t.dtype)


def _matmul(m, k, n, seed):
  return cal.CalibrationCase(
      "matmul", "random", jnp.matmul,
      (_normal(seed, (m, k)), _normal(seed + 1, (k, n), 0.1)), reduction=k)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("factor", [0.5, 0.25])
def test_scale_in_16_bit_formats_is_scale(dtype, factor):
  diag = _run(_matmul(96, 256, 160, 5), dtype, "scale", {"factor": factor})
  assert diag.model == "scale", diag.evidence
  assert diag.params["factor"] == pytest.approx(factor, rel=1e-3)
  assert diag.verdict == "fail"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scaled_layer_norm_is_no_epsilon_slip(dtype):
  x = _normal(7, (128, 192), 1.3, 0.4)
  case = cal.CalibrationCase(
      "layer_norm", "random", layers.layer_norm,
      (x, 1.0 + _normal(8, (192,), 0.1), _normal(9, (192,), 0.1)),
      reduction=192)
  diag = _run(case, dtype, "scale", {"factor": 0.5})
  assert diag.model == "scale", diag.evidence
  assert diag.verdict == "fail"


def test_epsilon_slip_is_still_parameter():
  """The control: eps 1e-5 where the model uses 1e-6, on small-variance
  rows, is still found (and estimated) by the probe."""
  x = _normal(11, (128, 192), 0.01)
  sc, b = 1.0 + _normal(12, (192,), 0.1), _normal(13, (192,), 0.1)
  case = cal.CalibrationCase("layer_norm", "random", layers.layer_norm,
                             (x, sc, b), reduction=192)
  g = jax.jit(layers.layer_norm)(x, sc, b)
  t = jax.jit(functools.partial(layers.layer_norm, eps=1e-5))(x, sc, b)
  r = cal.reference_of(case, case.inputs)
  diag = cal.diagnose(t, g, r, {"kernel": "layer_norm", "reduction": 192},
                      probe=cal.probe_of(case, case.inputs),
                      dtype=t.dtype)
  assert diag.model == "parameter", diag.evidence
  assert "1e-05" in diag.evidence


@pytest.mark.parametrize("rows", [(0, 2), (1, 3), (0, 1)])
def test_flipped_small_logits_of_a_tiny_output_are_faults(rows):
  """A classifier head: 4 rows of 2 logits, one column 5x the other; bit 7
  (bfloat16's lowest exponent bit) flipped in two of the small logits
  stays within their row-scaled envelope."""
  w = _normal(21, (384, 2), 0.1) * jnp.asarray([0.2, 1.0])
  case = cal.CalibrationCase("matmul", "random", jnp.matmul,
                             (_normal(20, (4, 384)), w), reduction=384)
  inputs = tuple(x.astype(jnp.bfloat16) for x in case.inputs)
  g = jax.jit(jnp.matmul)(*inputs)
  r = cal.reference_of(case, inputs)
  bits = np.asarray(g).view(np.uint16).copy()
  for i in rows:
    bits[i, 0] ^= np.uint16(1 << 7)
  t = jnp.asarray(bits.view(jnp.bfloat16))
  diag = cal.diagnose(t, g, r, {"kernel": "matmul", "reduction": 384},
                      probe=cal.probe_of(case, inputs), dtype=t.dtype)
  assert diag.model not in ("exact", "reordering"), diag.evidence
  assert diag.verdict == "fail"


@pytest.mark.parametrize("seed", [0, 1])
def test_stuck_bit_in_a_bf16_softmax_is_stuck_at(seed):
  logits = _normal(30 + seed, (64, 128), 2.0)
  case = cal.CalibrationCase("softmax", "random", layers.softmax, (logits,),
                             reduction=128)
  diag = _run(case, "bfloat16", "stuck_at",
              {"bit": 6, "value": 1, "share": 0.2}, seed=seed)
  assert diag.model == "stuck_at", diag.evidence
  assert diag.params["bit"] == 6


def _f16_matmul(seed):
  a = _normal(seed, (256, 384)).astype(jnp.float16)
  b = _normal(seed + 1, (384, 192), 0.05).astype(jnp.float16)
  return cal.CalibrationCase("matmul", "random", jnp.matmul, (a, b),
                             reduction=384)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("bit", [3, 4, 5])
def test_few_mantissa_flips_of_a_16_bit_output_are_bitflips(dtype, bit):
  """Flips of 8-32 ulps in a few elements of an otherwise bitwise golden
  16-bit output stay inside the 64 u envelope; one bit each, they are
  flips."""
  diag = _run(_matmul(128, 256, 192, 40), dtype, "bitflip",
              {"count": 6, "bits": bit})
  assert diag.model == "bitflip", diag.evidence
  assert diag.verdict == "fail"


@pytest.mark.parametrize("seed", [50, 51])
def test_rare_reordering_differences_of_a_16_bit_output_pass(seed):
  """The control: a split-K sum in float32, rounded once to float16,
  differs from golden in a fraction of a percent of the elements, by many
  of their own ulps where the sum cancels, and in several bits: not a
  flip."""
  case = _f16_matmul(seed)
  a, b = case.inputs
  g = jax.jit(jnp.matmul)(a, b)
  h = a.shape[1] // 2
  f32 = lambda x: x.astype(jnp.float32)
  t = (f32(a[:, :h]) @ f32(b[:h]) + f32(a[:, h:]) @ f32(b[h:])).astype(
      jnp.float16)
  r = cal.reference_of(case, case.inputs)
  diag = cal.diagnose(t, g, r, {"kernel": "matmul", "reduction": 384},
                      probe=cal.probe_of(case, case.inputs), dtype=t.dtype)
  assert diag.verdict != "fail", (diag.model, diag.evidence)
  assert diag.model in ("exact", "reordering"), diag.evidence
