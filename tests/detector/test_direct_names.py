"""The fewest words that say the output exactly, and the worse cause first.

Where a call's inputs are at hand the slip search may find a slip whose
output equals what a shorter name already says: every differing element
zero (a missed write, ``zero``, where the search also finds an input row
read as zero), ``t / g`` one constant (``scale``, where it also fits a
constant of the kernel). The shorter name wins and the slip is said
beside it. A flush of a few tiny values (``ftz``, a warn) on top of a
failing slip is the second cause, not the first; a normalization that
rounds only its activation to bf16 is ``precision:bf16``; a constant is
named on a per-example output of a few elements but only a candidate on
a scalar; a sign bit is called stuck only where every magnitude stays
golden's. float32 and bfloat16 inputs, fresh seeded data.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import detector

DN = (((1,), (0,)), ((), ()))
DOT_KW = {"dimension_numbers": DN, "precision": None,
          "preferred_element_type": None}
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _rms_norm(x, s, eps):
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)
  return (y * s.astype(jnp.float32)).astype(x.dtype)


def _rms_ref(x, s, eps):
  x, s = np.asarray(x, np.float64), np.asarray(s, np.float64)
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * s


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_zeroed_row_is_a_missed_write_not_an_input_read_as_zero(dtype):
  rng = np.random.default_rng(41)
  x = jnp.asarray(rng.standard_normal((48, 96)).astype(DTYPES[dtype]))
  s = jnp.asarray((1 + 0.1 * rng.standard_normal(96)).astype(np.float32))
  g = _rms_norm(x, s, 1e-6)
  row = int(rng.integers(48))
  t = g.at[row].set(0)
  d = detector.diagnose_call("rms_norm", (x, s), {"eps": 1e-6}, t, g,
                             reference=_rms_ref(x, s, 1e-6), reduction=96)
  assert (d.model, d.verdict) == ("zero", "fail"), d.evidence


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_a_record_wide_factor_is_scale_and_a_flush_under_it_second(
    dtype, factor):
  """Three rows of tiny operands: their outputs are flushed when scaled
  (XLA on the CPU flushes subnormals), a warn under the failing scale."""
  rng = np.random.default_rng(42)
  a = rng.standard_normal((40, 200)).astype(np.float32)
  a[:3] *= 1e-37
  a = jnp.asarray(a.astype(DTYPES[dtype]))
  b = jnp.asarray((0.1 * rng.standard_normal((200, 33))).astype(
      DTYPES[dtype]))
  g = jax.lax.dot_general(a, b, DN, preferred_element_type=jnp.float32)
  t = g * factor
  r = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  d = detector.diagnose_call("dot_general", (a, b), DOT_KW, t, g,
                             reference=r, reduction=200)
  assert (d.model, d.verdict) == ("scale", "fail"), d.evidence
  assert d.params["factor"] == pytest.approx(factor, rel=1e-3)
  assert d.secondary is None or d.secondary.model != "scale"


def _ln(x, s, b, eps):
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) / np.sqrt(v + eps) * s + b


def test_a_layer_norm_on_bf16_activations_with_f32_parameters_is_precision():
  rng = np.random.default_rng(43)
  x = rng.standard_normal((84, 96)).astype(np.float32)
  s = (1 + 0.1 * rng.standard_normal(96)).astype(np.float32)
  b = (0.1 * rng.standard_normal(96)).astype(np.float32)
  xb = np.asarray(x.astype(ml_dtypes.bfloat16), np.float64)
  t = _ln(xb, np.float64(s), np.float64(b), 1e-5).astype(np.float32)
  r = _ln(*(np.asarray(v, np.float64) for v in (x, s, b)), 1e-5)
  g = r.astype(np.float32)
  d = detector.diagnose_call("layer_norm", (x, s, b), {"eps": 1e-5}, t, g,
                             reference=r, reduction=96)
  assert (d.model, d.verdict) == ("precision:bf16", "warn"), d.evidence
  assert d.params.get("where") == "activation", d.params


def _ce(logits, labels, smoothing=0.0):
  z = np.asarray(logits, np.float64)
  lse = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
  nll = lse - np.take_along_axis(z, labels[:, None], -1)[:, 0]
  return (1 - smoothing) * nll + smoothing * (lse - z.mean(-1))


@pytest.mark.parametrize("rows,named", [(7, True), (1, False)])
def test_a_constant_is_named_on_a_few_values_not_on_one(rows, named):
  rng = np.random.default_rng(44)
  logits = rng.standard_normal((rows, 45)).astype(np.float32)
  labels = rng.integers(0, 45, rows).astype(np.int32)
  r = _ce(logits, labels)
  t, g = _ce(logits, labels, 0.1).astype(np.float32), r.astype(np.float32)
  d = detector.diagnose_call("cross_entropy", (logits, labels),
                             {"reduction": "none"}, t, g, reference=r)
  if named:
    assert d.model == "parameter", d.evidence
    assert d.params["estimate"] == pytest.approx(0.1, rel=0.02)
  else:
    assert d.model == "unknown", d.evidence
    assert "no constant can be told from another" in d.evidence
  assert d.verdict == "fail"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_formula_that_crosses_zero_is_no_stuck_sign_bit(dtype):
  """A softmax VJP without its diagonal term: one-signed where golden's
  values take both signs, magnitudes changed (not ``stuck_at``); the same
  output with the sign bit forced on golden's values is ``stuck_at``."""
  rng = np.random.default_rng(45)
  x = 2 * rng.standard_normal((64, 197))
  dy = 1e-2 * rng.standard_normal((64, 197))
  p = np.exp(x - x.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  dot = np.sum(dy * p, -1, keepdims=True)
  r = p * (dy - dot)
  dt = DTYPES[dtype]
  g = r.astype(dt)
  ctx = {"kernel": "softmax", "reduction": 197}
  wrong = peat.detect(peat.analyze(jnp.asarray((-p * dot).astype(dt)),
                                   jnp.asarray(g), reference=r), context=ctx)
  assert wrong.model != "stuck_at" and wrong.verdict == "fail", wrong.evidence
  u = np.asarray(g).view(np.uint32 if dtype == "float32" else np.uint16)
  sign = u.dtype.type(1 << (8 * u.dtype.itemsize - 1))
  stuck = (u | sign).view(g.dtype)
  found = peat.detect(peat.analyze(jnp.asarray(stuck), jnp.asarray(g),
                                   reference=r), context=ctx)
  assert (found.model, found.verdict) == ("stuck_at", "fail"), found.evidence
