"""Long reductions: another correct order of a sum is not a fault.

A softmax row of 2^18 terms (logits of unit variance, like attention
scores) whose normalizer a correct kernel adds in order in float32 is off
by about a hundred u(fp32) where XLA's blocked sum is off by a few: far
beyond the golden kernel's rounding envelope, within what a K-term
working-precision sum reaches (``within_working_sum``). The Detector passes it as ``reordering`` (float32 and bf16 outputs), and a
normalizer a fraction of an ulp off (a few elements one ulp down) is no
truncation; a normalizer off by far more than the working-sum level
(``scale``), a result rounded toward zero (``truncation``) and a cheaper
exp (``approximation``) are still named and not passed.

Fresh seeded logits, float64 references.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat

K = 2 ** 18
BF16 = ml_dtypes.bfloat16


@pytest.fixture(scope="module")
def row():
  """Seeded logits of one long row, XLA's float32 softmax, the float64
  reference and the row's exponentials in float32."""
  rng = np.random.default_rng(2026)
  x = rng.standard_normal((1, K)).astype(np.float32)
  golden = np.asarray(jax.jit(jax.nn.softmax)(jnp.asarray(x)))
  x64 = x.astype(np.float64)
  e64 = np.exp(x64 - x64.max(axis=-1, keepdims=True))
  ref = e64 / e64.sum(axis=-1, keepdims=True)
  e32 = np.exp(x - x.max(axis=-1, keepdims=True)).astype(np.float32)
  return x, golden, ref, e32


def _in_order(e32):
  """A correct softmax whose normalizer is a running float32 sum."""
  total = np.cumsum(e32, axis=-1, dtype=np.float32)[..., -1:]
  return (e32 / total).astype(np.float32)


def _detect(test, golden, ref):
  sig = peat.analyze(test, golden, reference=ref)
  return peat.detect(sig, context={"kernel": "softmax", "reduction": K})


def test_an_in_order_float32_normalizer_passes(row):
  _, golden, ref, e32 = row
  test = _in_order(e32)
  level = np.median(np.abs(test.astype(np.float64) / ref - 1.0))
  u = 2.0 ** -24
  golden_level = np.median(np.abs(golden.astype(np.float64) / ref - 1.0))
  assert level > 8 * golden_level  # far beyond the golden kernel's error
  assert level < 0.3 * np.sqrt(K) * u * 2 ** 1.5  # within a K-term sum's
  d = _detect(test, golden, ref)
  assert (d.model, d.verdict) == ("reordering", "pass"), d.evidence


def test_a_normalizer_a_fraction_of_an_ulp_off_passes(row):
  _, _, ref, _ = row
  golden = ref.astype(np.float32)  # correctly rounded
  test = (ref * (1 - 2.0 ** -28)).astype(np.float32)
  share = np.mean(test != golden)
  assert 0 < share < 0.25  # a few elements one ulp down, not half
  d = _detect(test, golden, ref)
  assert (d.model, d.verdict) == ("reordering", "pass"), d.evidence


def test_bf16_output_of_an_in_order_normalizer_passes(row):
  _, golden, ref, e32 = row
  g16 = golden.astype(BF16)
  d = _detect(_in_order(e32).astype(BF16), g16, ref)
  assert d.verdict == "pass", (d.model, d.evidence)


@pytest.mark.parametrize("dtype, off", [(np.float32, 2e-3), (BF16, 0.25)])
def test_a_normalizer_off_beyond_the_working_sum_fails_as_scale(row, dtype,
                                                               off):
  _, golden, ref, e32 = row
  # float32: ~80x a K-term float32 sum's error; bf16: 64 u(bf16), so the
  # factor stands far above bf16's rounding (a few ulps are read as a
  # dense error no model names, below one as a rounding toward zero).
  test = (_in_order(e32) * np.float32(1 - off)).astype(dtype)
  d = _detect(test, golden.astype(dtype), ref)
  assert d.model == "scale" and d.verdict == "fail", (d.model, d.evidence)


def test_rounding_toward_zero_is_still_truncation(row):
  _, golden, ref, _ = row
  test = ref.astype(np.float32)
  up = np.abs(test.astype(np.float64)) > np.abs(ref)
  test[up] = np.nextafter(test[up], np.float32(0))
  d = _detect(test, golden, ref)
  assert d.model == "truncation" and d.verdict != "pass", (d.model,
                                                           d.evidence)


def test_a_cheaper_exp_is_not_passed(row):
  x, golden, ref, _ = row
  # exp through a 2^-10-step table of 2^f: a port's approximation.
  z = (x - x.max()).astype(np.float64) / np.log(2.0)
  i = np.floor(z)
  f = np.round((z - i) * 1024.0) / 1024.0
  e = (np.exp2(i) * np.exp2(f)).astype(np.float32)
  test = (e / np.cumsum(e, dtype=np.float32)[..., -1:]).astype(np.float32)
  d = _detect(test, golden, ref)
  assert d.verdict != "pass" and d.model != "reordering", (d.model,
                                                           d.evidence)


def test_an_in_order_sum_that_loses_terms_warns():
  """Logits of standard deviation 2: most terms fall below half an ulp of
  the running float32 sum and are lost, biasing it down by ~2.4 sqrt(K)
  u, beyond the working-sum level: looked at (warn), not failed."""
  rng = np.random.default_rng(2027)
  x = (2.0 * rng.standard_normal((1, K))).astype(np.float32)
  golden = np.asarray(jax.jit(jax.nn.softmax)(jnp.asarray(x)))
  x64 = x.astype(np.float64)
  e64 = np.exp(x64 - x64.max())
  ref = e64 / e64.sum()
  test = _in_order(np.exp(x - x.max()).astype(np.float32))
  level = np.median(np.abs(test.astype(np.float64) / ref - 1.0))
  assert level > 0.3 * np.sqrt(K) * 2.0 ** -24 * 2 ** 1.5
  d = _detect(test, golden, ref)
  assert d.verdict == "warn", (d.model, d.evidence)


def test_a_long_dot_product_in_order_passes_and_a_flip_fails():
  """64 dot products of 65,536 terms accumulated in order in float32 (one
  thread's accumulator; every 8th row cancels to near zero): ~8x the
  golden kernel's error, another order. A flipped exponent bit in one
  output is still a fault."""
  k = 1 << 16
  rng = np.random.default_rng(2028)
  a = (rng.standard_normal((64, k)) + 1.0).astype(np.float32)
  a[::8, k // 2:] -= 2.0
  b = (rng.standard_normal((k,)) + 1.0).astype(np.float32)
  golden = np.asarray(jax.jit(jnp.dot)(jnp.asarray(a), jnp.asarray(b)))
  ref = a.astype(np.float64) @ b.astype(np.float64)
  test = np.cumsum(a * b, axis=-1, dtype=np.float32)[:, -1]
  ctx = {"kernel": "dot_general", "reduction": k}
  sig = peat.analyze(test, golden, reference=ref)
  d = peat.detect(sig, context=ctx)
  assert float(np.asarray(sig.noise_ratio)) > 4  # far beyond golden's
  assert (d.model, d.verdict) == ("reordering", "pass"), d.evidence
  bad = test.copy()
  bad[8] *= np.float32(2.0 ** 8)
  d = peat.detect(peat.analyze(bad, golden, reference=ref), context=ctx)
  assert (d.model, d.verdict) == ("bitflip", "fail"), d.evidence
  # Outliers (outputs beyond the golden envelope, as where a real q.k of
  # 65,536 terms cancels) within the working-sum level at the output's
  # scale are that order too; beyond it they are not.
  bound = 0.3 * np.sqrt(k) * 2.0 ** -24 * 2 ** 1.5
  rms = float(np.asarray(sig.golden_rms))
  for scale, verdict in ((0.5, "pass"), (8.0, "fail")):
    moved = sig._replace(n_out=jnp.int32(2), n_beyond=jnp.int32(2),
                         out_abs_max=jnp.float32(scale * bound * rms))
    d = peat.detect(moved, context=ctx)
    assert d.verdict == verdict, (scale, d.model, d.evidence)
