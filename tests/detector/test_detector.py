"""Tests of the Detector on errors of known cause, built by hand.

The calibration suite (tests/test_calibration.py) covers the injectors and
the native kernel variants on captured training inputs.
"""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.analyzer import analyze
from peat_jax.detector import detect, detect_batch, verdict


def _matmul_case(seed):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((96, 160)).astype(np.float32)
  b = rng.standard_normal((160, 128)).astype(np.float32)
  return a, b, a @ b, a.astype(np.float64) @ b.astype(np.float64)


def _flip(g, rng, count, bit):
  t = g.copy().view(np.uint32)
  t.flat[rng.choice(g.size, count, replace=False)] ^= np.uint32(1 << bit)
  return t.view(np.float32)


def _stuck(g, rng, count, bit):
  t = g.copy().view(np.uint32)
  t.flat[rng.choice(g.size, count, replace=False)] |= np.uint32(1 << bit)
  return t.view(np.float32)


def _bf16(x):
  return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def _make(kind, a, b, g, rng):
  if kind == "exact":
    return g.copy()
  if kind == "reordering":
    return a[:, :80] @ b[:80] + a[:, 80:] @ b[80:]
  if kind == "precision:bf16":
    return _bf16(g)
  if kind == "precision:bf16 inputs":
    return _bf16(a) @ _bf16(b)
  if kind == "bf16 toward zero":
    return (g.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
  if kind == "bitflip":
    return _flip(g, rng, 3, int(rng.integers(12, 30)))
  if kind == "stuck_at":
    return _stuck(g, rng, 300, int(rng.integers(0, 23)))
  if kind == "lane":
    t = g.copy()
    t[:, int(rng.integers(0, 32))::32] *= 3.0
    return t
  if kind == "zero":
    t = g.copy()
    t[32:48, 64:80] = 0.0
    return t
  if kind == "scale":
    return g * np.float32(0.75)
  if kind == "indexing":
    return np.roll(g, 2, axis=1)
  if kind == "nan":
    t = g.copy()
    t.flat[rng.choice(g.size, 5, replace=False)] = np.inf
    return t
  if kind == "random_value":
    t = g.copy()
    t.flat[rng.choice(g.size, 7, replace=False)] = rng.uniform(-50, 50, 7)
    return t
  raise ValueError(kind)


EXPECTED = {
    "exact": ("exact", "pass"), "reordering": ("reordering", "pass"),
    "precision:bf16": ("precision:bf16", "warn"),
    "precision:bf16 inputs": ("precision:bf16", "warn"),
    "bf16 toward zero": ("precision:bf16", "warn"),
    "bitflip": ("bitflip", "fail"),
    "stuck_at": ("stuck_at", "fail"), "lane": ("lane", "fail"),
    "zero": ("zero", "fail"), "scale": ("scale", "fail"),
    "indexing": ("indexing", "fail"), "nan": ("nan", "fail"),
    "random_value": ("random_value", "fail"),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_known_cause_is_named_with_evidence(kind, seed):
  a, b, g, r = _matmul_case(seed)
  rng = np.random.default_rng(100 + seed)
  t = _make(kind, a, b, g, rng).astype(np.float32)
  diag = detect(analyze(jnp.asarray(t), jnp.asarray(g), r))
  model, grade = EXPECTED[kind]
  assert diag.model == model, (diag.model, diag.evidence, diag.candidates)
  assert diag.verdict == grade
  assert 0.0 < diag.confidence <= 1.0
  assert any(ch.isdigit() for ch in diag.evidence)  # numbers behind it
  assert diag.candidates[0].model == diag.model
  if kind == "bf16 toward zero":  # the rounding mode in the evidence
    assert diag.params["rounding"] == "toward_zero", diag.params


def test_inferred_parameters():
  a, b, g, r = _matmul_case(5)
  rng = np.random.default_rng(7)
  d = detect(analyze(jnp.asarray(_flip(g, rng, 4, 21)), jnp.asarray(g), r))
  assert d.model == "bitflip" and d.params["bits"] == [21]
  d = detect(analyze(jnp.asarray(_stuck(g, rng, 400, 9)), jnp.asarray(g), r))
  assert (d.params["bit"], d.params["polarity"]) == (9, 1)
  d = detect(analyze(jnp.asarray(np.roll(g, -3, axis=1)), jnp.asarray(g)))
  assert {k: d.params[k] for k in ("kind", "axis", "shift")} == {
      "kind": "shift", "axis": "columns", "shift": -3}
  d = detect(analyze(jnp.asarray(g * np.float32(2.0)), jnp.asarray(g)))
  assert d.params["factor"] == 2.0
  t = g.copy()
  t[:, 5::32] = 0.0
  d = detect(analyze(jnp.asarray(t), jnp.asarray(g)))
  assert {k: d.params[k] for k in ("stride", "lane", "what")} == {
      "stride": 32, "lane": 5, "what": "zeroed"}


def test_short_reduction_cancellation_is_not_a_bitflip():
  """A 9-term reduction (a 3x3x1 convolution) summed in another order:
  about a fifth of the outputs differ, those near zero by thousands of
  their own ULPs, yet no error exceeds rounding of the output's scale. Not
  `bitflip` (a fault touches few elements); a real flip among such noise
  still is one."""
  rng = np.random.default_rng(9)
  a = rng.standard_normal((4096, 9)).astype(np.float32)
  b = rng.standard_normal((9, 16)).astype(np.float32)
  def ordered(ks):  # one rounding per multiply and per add, in this order
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in ks:
      c = (c + a[:, k:k + 1] * b[k]).astype(np.float32)
    return c

  g = ordered([0, 1, 2, 3, 4, 5, 6, 7, 8])
  t = ordered([0, 1, 2, 3, 4, 5, 7, 6, 8])  # two terms swapped
  r = a.astype(np.float64) @ b.astype(np.float64)
  sig = analyze(jnp.asarray(t), jnp.asarray(g), r)
  hist = np.asarray(sig.ulp_hist)
  assert 0.01 < float(sig.share_differ) < 0.25
  assert np.nonzero(hist)[0][-1] >= 5  # some output moved >= 16 ULPs
  d = detect(sig)
  assert d.model == "reordering" and d.verdict == "pass", (d.model,
                                                           d.evidence)
  flipped = _flip(t, rng, 3, 27)
  d = detect(analyze(jnp.asarray(flipped), jnp.asarray(g), r))
  assert d.model == "bitflip" and 27 in d.params["bits"], d.evidence


def _class_token_gradient(rng, order):
  """A (B*T, D) float32 gradient that is zero but for each image's class
  token row (the last ViT block), summed over K in the given order."""
  b, t, k, d = 8, 17, 96, 64
  x = np.zeros((b * t, k), np.float32)
  x[::t] = rng.standard_normal((b, k))
  w = rng.standard_normal((k, d)).astype(np.float32)
  c = np.zeros((b * t, d), np.float32)
  for i in order(k):
    c = (c + x[:, i:i + 1] * w[i]).astype(np.float32)
  return c, x.astype(np.float64) @ w.astype(np.float64)


def test_sparse_gradient_noise_is_not_indexing():
  """Rows of equal zeros match every shift of a sparse array; the shift
  tests compare only positions where t differs and is nonzero, so
  summation-order noise on the class-token rows is `reordering` while a
  real shift, transpose or zeroing of the same array is still named."""
  rng = np.random.default_rng(5)
  g, r = _class_token_gradient(rng, lambda k: range(k))
  rng = np.random.default_rng(5)
  t, _ = _class_token_gradient(rng, lambda k: reversed(range(k)))
  assert 0.02 < float(np.mean(t != g)) < 0.06  # 1 row in 17, most differ
  sig = analyze(jnp.asarray(t), jnp.asarray(g), r)
  assert not np.asarray(sig.shift_row_share).any()
  assert not np.asarray(sig.shift_col_share).any()
  d = detect(sig)
  assert d.model == "reordering" and d.verdict != "fail", (d.model,
                                                           d.evidence)
  d = detect(analyze(jnp.asarray(np.roll(g, -2, axis=1)), jnp.asarray(g), r))
  assert (d.model, d.params["kind"], d.params["shift"]) == (
      "indexing", "shift", -2), d.evidence
  sq = g[:64, :64]
  d = detect(analyze(jnp.asarray(sq.T.copy()), jnp.asarray(sq)))
  assert (d.model, d.params["kind"]) == ("indexing", "transpose"), d.evidence
  zeroed = np.where(rng.random(g.shape) < 0.5, np.float32(0), g)
  d = detect(analyze(jnp.asarray(zeroed), jnp.asarray(g), r))
  assert d.model == "zero", d.evidence


def test_transpose_is_indexing():
  rng = np.random.default_rng(3)
  g = rng.standard_normal((64, 64)).astype(np.float32)
  d = detect(analyze(jnp.asarray(g.T.copy()), jnp.asarray(g)))
  assert (d.model, d.params["kind"]) == ("indexing", "transpose")


def test_nondeterminism_from_a_repeat_signature():
  a, b, g, r = _matmul_case(4)
  t1 = a[:, :80] @ b[:80] + a[:, 80:] @ b[80:]
  t2 = a[:, 80:] @ b[80:] + a[:, :80] @ b[:80]
  t2 = (a[:, :40] @ b[:40] + a[:, 40:] @ b[40:]).astype(np.float32)
  sig = analyze(jnp.asarray(t1), jnp.asarray(g), r)
  rep = analyze(jnp.asarray(t2), jnp.asarray(t1))
  d = detect(sig, repeat=rep)
  assert d.model == "nondeterminism" and d.verdict == "warn"
  same = detect(sig, repeat=analyze(jnp.asarray(t1), jnp.asarray(t1)))
  assert same.model == "reordering"


def test_16_bit_records_need_or_infer_a_dtype():
  rng = np.random.default_rng(0)
  g = rng.standard_normal((32, 64)).astype(ml_dtypes.bfloat16)
  t = g.copy().view(np.uint16)
  t.flat[[3, 70, 400]] ^= np.uint16(1 << 12)
  sig = analyze(jnp.asarray(t.view(ml_dtypes.bfloat16)), jnp.asarray(g))
  d = detect(sig, dtype=jnp.bfloat16)
  assert d.model == "bitflip" and d.params["bits"] == [12]
  with pytest.raises(peat.PeatError, match="float32, float64, bfloat16"):
    detect(sig, dtype=np.int32)


def test_batch_and_verdict():
  a, b, g, r = _matmul_case(9)
  rng = np.random.default_rng(1)
  tests = np.stack([g, _bf16(g), _flip(g, rng, 2, 25)])
  goldens = np.stack([g, g, g])
  from peat_jax.analyzer import analyze_batch
  diags = detect_batch(analyze_batch(jnp.asarray(tests), jnp.asarray(goldens)))
  assert [d.model for d in diags] == ["exact", "precision:bf16", "bitflip"]
  v = verdict({("fwd/a", 0): diags[0], ("fwd/b", 0): diags[1],
               ("fwd/c", 0): diags[2]})
  assert v.verdict == "fail" and v.deciding == (("fwd/c", 0),)
  assert verdict(diags[:2]).verdict == "warn"
  assert verdict(diags[:1]).verdict == "pass"
  with pytest.raises(peat.PeatError, match="at least one"):
    verdict({})


def test_bad_input():
  with pytest.raises(peat.PeatError, match="Signature from peat_jax.analyze"):
    detect(np.zeros(3))
  from peat_jax.analyzer import analyze_batch
  x = jnp.ones((2, 4, 4))
  with pytest.raises(peat.PeatError, match="detect_batch"):
    detect(analyze_batch(x, x))
