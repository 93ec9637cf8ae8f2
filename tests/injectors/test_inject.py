"""Tests of the tensor fault injectors (peat_jax.injectors._api, _inject_models).

One body per property, parameterized over error models x dtypes; every test
checks the effect the model promises, on fresh seeded random data.
"""

import math

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from peat_jax import injectors
from peat_jax.injectors import _checks as checks
from peat_jax.injectors import _rounding as fm
from peat_jax.core import PeatError

_slow = pytest.mark.slow
# Bit-level properties: every dtype (float16 runs in the slow set).
DTYPES = (pytest.param(jnp.float32, id="f32"),
          pytest.param(jnp.bfloat16, id="bf16"),
          pytest.param(jnp.float16, id="f16", marks=_slow))
# Broad matrices: float32 always, the 16-bit types in the slow set.
BROAD = (pytest.param(jnp.float32, id="f32"),
         pytest.param(jnp.bfloat16, id="bf16", marks=_slow),
         pytest.param(jnp.float16, id="f16", marks=_slow))

# Every tensor model with parameters that make it act on the test data.
CASES = {
    "exact": {},
    "bitflip": {"count": 3},
    "stuck_at": {"bit": 5, "share": 0.5},
    "random_value": {"count": 3},
    "zero": {"count": 2},
    "nan": {"count": 2, "kind": "inf"},
    "lane": {"stride": 32, "lane": 7, "effect": "bitflip"},
    "indexing": {"mode": "permutation", "count": 5},
    "scale": {"factor": 2.0},
    "saturation": {"max_value": 1.5},
    "ftz": {"fmt": "fp8_e4m3"},
    "truncation": {"fmt": "fp8_e5m2"},
    "precision:bf16": {},
    "precision:fp16": {},
    "precision:tf32": {},
    "precision:fp8_e4m3": {},
    "precision:fp8_e5m2": {},
    "reordering": {"share": 0.5},
    "nondeterminism": {"share": 0.5},
    "parameter": {"delta": 1e-2},
    "approximation": {"rel": 1e-2},
}
# Models whose result depends on the key.
KEYED = {"bitflip", "stuck_at", "random_value", "zero", "nan", "lane",
         "indexing", "reordering", "nondeterminism"}


def data(seed: int, shape=(32, 64), dtype=jnp.float32, scale=1.0):
  """Seeded normal data without zeros, cast to ``dtype``."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * scale
  x = np.where(np.abs(x) < 1e-3, 1e-3, x)
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def _noop(name, dtype):
  """Rounding the test data into a format with as many mantissa bits."""
  if not name.startswith("precision:"):
    return False
  f = fm.FORMATS[name.split(":")[1]]
  return f.mantissa_bits >= ml_dtypes.finfo(dtype).nmant


def bits(a):
  a = np.asarray(a)
  return a.view(fm.uint_dtype(a.dtype)).astype(np.uint64)


def test_every_design_error_model_has_an_injector():
  design = {"exact", "reordering", "accumulation", "truncation", "ftz",
            "saturation", "bitflip", "stuck_at", "random_value", "zero", "nan",
            "lane", "indexing", "scale", "nondeterminism", "precision",
            "parameter", "approximation"}
  names = {n.split(":")[0] for n in injectors.ERROR_MODELS}
  assert design == names
  for f in ("bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2"):
    assert f"precision:{f}" in injectors.ERROR_MODELS
    assert f"accumulation:{f}" in injectors.ERROR_MODELS
  assert set(CASES) == set(injectors.TENSOR_ERROR_MODELS)


def test_port_patterns_are_what_their_model_says():
  """parameter: one factor per row, larger on rows of small mean square;
  approximation: t / x - 1 is one function of the value, bounded by rel."""
  x = np.asarray(data(4, (16, 64)), np.float64)
  x[3] *= 0.25  # a small row
  y = np.asarray(injectors.inject("parameter", jax.random.key(0),
                                  jnp.asarray(x, jnp.float32), delta=1e-3),
                 np.float64)
  ratio = y / x - 1
  np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones_like(ratio),
                             rtol=1e-3, atol=1e-6)
  ms = np.mean(x * x, -1)
  np.testing.assert_allclose(ratio[:, 0], 1e-3 * np.mean(ms) / ms,
                             rtol=1e-2, atol=1e-6)
  z = np.asarray(injectors.inject("approximation", jax.random.key(0),
                                  jnp.asarray(x, jnp.float32), rel=1e-3),
                 np.float64)
  err = z / x - 1
  frac = np.abs(np.frexp(x)[0]) * 2 - 1
  want = 1e-3 * frac * (1 - frac) * (1 - 2 * frac) / (np.sqrt(3) / 18)
  np.testing.assert_allclose(err, want, atol=2e-7)
  assert np.max(np.abs(err)) > 0.9e-3
  assert np.max(np.abs(err)) <= 1e-3 * (1 + 1e-3)


@pytest.mark.parametrize("dtype", BROAD)
@pytest.mark.parametrize("name", sorted(CASES))
def test_deterministic_jit_vmap_and_key_dependent(name, dtype):
  x = data(1, (16, 64), dtype)
  keys = jax.random.split(jax.random.key(3), 4)
  y1 = injectors.inject(name, keys[0], x, **CASES[name])
  y1b = injectors.inject(name, keys[0], x, **CASES[name])
  assert y1.shape == x.shape and y1.dtype == x.dtype
  np.testing.assert_array_equal(bits(y1), bits(y1b))
  if name in KEYED:
    y2 = injectors.inject(name, keys[1], x, **CASES[name])
    assert (bits(y1) != bits(y2)).any()
  if name != "exact" and not _noop(name, dtype):
    assert (bits(y1) != bits(x)).any(), "the injection changed nothing"
  elif name == "exact":
    np.testing.assert_array_equal(bits(y1), bits(x))
  # vmapped over keys inside jit: bitwise the single calls.
  f = lambda k: injectors.inject(name, k, x, **CASES[name])
  batched = jax.jit(jax.vmap(f))(keys)
  for i in range(4):
    np.testing.assert_array_equal(bits(batched[i]), bits(f(keys[i])))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", (1, 7))
def test_bitflip_fixed_bit_flips_exactly_count_elements_in_that_bit(
    dtype, count):
  x = data(4, dtype=dtype)
  bit = 20 if dtype == jnp.float32 else 12
  y = injectors.inject("bitflip", jax.random.key(5), x, count=count, bits=bit)
  diff = bits(x) ^ bits(y)
  assert int((diff != 0).sum()) == count
  assert set(np.unique(diff[diff != 0]).tolist()) == {1 << bit}


@pytest.mark.parametrize("dtype", DTYPES)
def test_bitflip_draws_distinct_bits_per_element_within_fields(dtype):
  x = data(6, dtype=dtype)
  e, m = fm.fields(dtype)
  y = injectors.inject("bitflip", jax.random.key(7), x, count=10,
                 bits_per_element=3, field_weights=(0, 0, 1))
  diff = bits(x) ^ bits(y)
  hit = diff[diff != 0]
  assert hit.size == 10
  assert all(bin(int(d)).count("1") == 3 for d in hit)
  assert (hit < (1 << m)).all(), "only mantissa bits may flip"
  y = injectors.inject("bitflip", jax.random.key(7), x, count=5,
                 field_weights=(1, 0, 0))
  diff = bits(x) ^ bits(y)
  assert set(diff[diff != 0].tolist()) == {1 << (e + m)}


def test_bitflip_bit_distribution_follows_documented_weights():
  # 4000 single-bit flips in float32; field shares vs bit_probabilities.
  x = data(8, (4, 4))
  for weights in (None, (1.0, 2.0, 1.0)):
    kw = {} if weights is None else {"field_weights": weights}
    c = injectors.campaign("bitflip", jax.random.key(9), x, n=4000,
                     summarize=lambda y: y, **kw)
    diff = bits(c.outputs) ^ bits(x)[None]
    pos = np.log2(diff[diff != 0].astype(np.float64)).astype(int)
    assert pos.size == 4000
    p = injectors.bit_probabilities(jnp.float32, weights)
    for lo, hi in ((0, 23), (23, 31), (31, 32)):
      want = p[lo:hi].sum()
      got = ((pos >= lo) & (pos < hi)).mean()
      assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / 4000) + 1e-9
  assert np.isclose(injectors.bit_probabilities(jnp.float32).sum(), 1.0)
  assert np.isclose(injectors.bit_probabilities(jnp.float32, (1, 1, 1))[31], 1 / 3)


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**31 - 1),
                  count=st.sampled_from((1, 40)), per=st.sampled_from((1, 3)))
def test_bitflip_with_the_same_key_is_an_involution(seed, count, per):
  x = data(seed % 1000, (16, 64))
  k = jax.random.key(seed)
  y = injectors.inject("bitflip", k, x, count=count, bits_per_element=per)
  z = injectors.inject("bitflip", k, y, count=count, bits_per_element=per)
  np.testing.assert_array_equal(bits(z), bits(x))
  assert int((bits(x) != bits(y)).sum()) == count


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", (0, 1))
@pytest.mark.parametrize("share", (0.25, 1.0))
def test_stuck_at_forces_the_bit_in_the_chosen_share(dtype, value, share):
  bit = 3
  x = data(10, dtype=dtype)
  # Start from the opposite polarity so that every chosen element changes.
  u = bits(x).astype(fm.uint_dtype(dtype))
  u = (u & ~np.asarray(1 << bit, u.dtype)) if value else (u | (1 << bit))
  x = jnp.asarray(u.view(jnp.dtype(dtype)))
  y = injectors.inject("stuck_at", jax.random.key(1), x, bit=bit, value=value,
                 share=share)
  diff = bits(x) ^ bits(y)
  changed = diff != 0
  n = x.size  # each element hit independently with probability share
  assert abs(int(changed.sum()) - share * n) <= 4 * np.sqrt(n * share) + 0.5
  assert set(np.unique(diff[changed]).tolist()) == {1 << bit}
  assert (((bits(y)[changed] >> bit) & 1) == value).all()


@pytest.mark.parametrize("dtype", BROAD)
@pytest.mark.parametrize("mode", ("bits", "normal"))
def test_random_value_replaces_count_elements_with_finite_values(dtype, mode):
  x = data(12, dtype=dtype)
  y = injectors.inject("random_value", jax.random.key(2), x, count=9, mode=mode)
  assert int((bits(x) != bits(y)).sum()) == 9
  assert np.isfinite(np.asarray(y, np.float32)).all()


@pytest.mark.parametrize("dtype", BROAD)
def test_zero_elements_rows_and_tiles(dtype):
  x = data(13, (32, 48), dtype)
  y = np.asarray(injectors.inject("zero", jax.random.key(0), x, count=5),
                 np.float32)
  assert int((y == 0).sum()) == 5
  y = np.asarray(injectors.inject("zero", jax.random.key(0), x, mode="rows",
                            count=3), np.float32)
  assert int((y == 0).all(axis=1).sum()) == 3 and int((y == 0).sum()) == 144
  y = np.asarray(injectors.inject("zero", jax.random.key(0), x, mode="tiles",
                            count=2, tile=(8, 16)), np.float32)
  z = (y == 0).reshape(4, 8, 3, 16).transpose(0, 2, 1, 3).reshape(12, -1)
  assert sorted(z.sum(axis=1).tolist()) == [0] * 10 + [128, 128]


@pytest.mark.parametrize("dtype", BROAD)
@pytest.mark.parametrize("kind", ("nan", "inf", "+inf", "-inf"))
def test_nan_kinds(dtype, kind):
  x = data(14, dtype=dtype)
  y = np.asarray(injectors.inject("nan", jax.random.key(4), x, count=6, kind=kind),
                 np.float32)
  bad = ~np.isfinite(y)
  assert int(bad.sum()) == 6
  if kind == "nan":
    assert np.isnan(y[bad]).all()
  else:
    assert np.isinf(y[bad]).all()
  if kind == "+inf":
    assert (y[bad] > 0).all()
  if kind == "-inf":
    assert (y[bad] < 0).all()


@pytest.mark.parametrize("dtype", BROAD)
@pytest.mark.parametrize("effect,extra", [
    ("zero", {}), ("bitflip", {"bits": 4}), ("stuck_at", {"bit": 4}),
    ("random_value", {}), ("nan", {}), ("scale", {"factor": -1.0})])
def test_lane_corrupts_only_one_lane_of_the_stride(dtype, effect, extra):
  x = data(15, (16, 64), dtype)
  y = injectors.inject("lane", jax.random.key(5), x, stride=32, lane=7,
                 effect=effect, **extra)
  changed = (bits(x) != bits(y)).reshape(-1)
  idx = np.nonzero(changed)[0]
  assert idx.size > 0 and (idx % 32 == 7).all()
  if effect in ("zero", "bitflip", "random_value", "nan", "scale"):
    assert idx.size == x.size // 32
  # Along an axis: column 3 of every row, stride 8.
  y = injectors.inject("lane", jax.random.key(5), x, stride=8, lane=3, axis=0,
                 effect=effect, **extra)
  rows = np.nonzero((bits(x) != bits(y)).any(axis=1))[0]
  assert rows.size > 0 and (rows % 8 == 3).all()


@pytest.mark.parametrize("dtype", BROAD)
def test_indexing_modes_misplace_golden_values(dtype):
  x = data(16, (24, 32), dtype)
  k = jax.random.key(6)
  y = injectors.inject("indexing", k, x, mode="shift", shift=3, axis=0)
  np.testing.assert_array_equal(bits(y), bits(np.roll(np.asarray(x), 3, 0)))
  y = injectors.inject("indexing", k, x, mode="transpose")
  np.testing.assert_array_equal(bits(y),
                                bits(np.asarray(x).T.reshape(24, 32)))
  sq = data(17, (16, 16), dtype)
  np.testing.assert_array_equal(
      bits(injectors.inject("indexing", k, sq, mode="transpose")),
      bits(np.asarray(sq).T))
  y = injectors.inject("indexing", k, x, mode="tile_swap", tile=(8, 8))
  moved = (bits(x) != bits(y)).reshape(3, 8, 4, 8).any(axis=(1, 3))
  assert int(moved.sum()) == 2
  for count in (2, None):
    y = injectors.inject("indexing", k, x, mode="permutation", count=count)
    np.testing.assert_array_equal(np.sort(bits(y), axis=None),
                                  np.sort(bits(x), axis=None))
    # Every chosen element moves (a cycle); equal values may hide a move.
    moved = int((bits(x) != bits(y)).sum())
    assert (count or x.size) * 0.9 <= moved <= (count or x.size)


@pytest.mark.parametrize("dtype", BROAD)
@pytest.mark.parametrize("factor", (2.0, -0.5, 1.25))
def test_scale_multiplies_every_element(dtype, factor):
  x = data(18, dtype=dtype)
  y = injectors.inject("scale", jax.random.key(0), x, factor=factor)
  want = (np.asarray(x, np.float64) * factor).astype(np.float32).astype(
      jnp.dtype(dtype))
  np.testing.assert_array_equal(bits(y), bits(want))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ("fp8_e4m3", "fp8_e5m2", "fp16"))
@pytest.mark.parametrize("mode", ("clip", "inf"))
def test_saturation_clips_at_format_max_or_overflows(dtype, fmt, mode):
  fmax = fm.FORMATS[fmt].max
  if fmax >= float(ml_dtypes.finfo(dtype).max):
    pytest.skip("format max beyond the data type's range")
  x = data(19, dtype=dtype, scale=fmax)  # about a third exceed the max
  y = np.asarray(injectors.inject("saturation", jax.random.key(0), x, fmt=fmt,
                            mode=mode), np.float64)
  xs = np.asarray(x, np.float64)
  big = np.abs(xs) > fmax
  assert 0 < big.sum() < x.size
  np.testing.assert_array_equal(y[~big], xs[~big])
  if mode == "clip":
    lim = float(fm.largest_at_most(fmax, dtype))
    np.testing.assert_array_equal(y[big], np.sign(xs[big]) * lim)
    assert lim <= fmax
  else:
    np.testing.assert_array_equal(y[big], np.sign(xs[big]) * np.inf)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ftz_flushes_subnormals_to_signed_zero(dtype):
  rng = np.random.default_rng(20)
  e, m = fm.fields(dtype)
  ut = fm.uint_dtype(dtype)
  n = 512
  mant = rng.integers(1, 1 << m, n).astype(ut)
  sign = (rng.integers(0, 2, n).astype(ut) << (e + m)).astype(ut)
  sub = (mant | sign).view(jnp.dtype(dtype))  # all subnormal, none zero
  normal = np.asarray(data(21, (n,), dtype))
  x = jnp.asarray(np.concatenate([sub, normal]))
  y = injectors.inject("ftz", jax.random.key(0), x)
  yb = bits(y)
  np.testing.assert_array_equal(yb[:n], bits(sign.view(jnp.dtype(dtype))))
  np.testing.assert_array_equal(yb[n:], bits(normal))
  # With a format: flush below that format's smallest normal.
  z = np.asarray(injectors.inject("ftz", jax.random.key(0), x, fmt="fp8_e4m3"),
                 np.float64)
  xs = np.asarray(x, np.float64)
  tiny = np.abs(xs) < 2.0**-6
  assert (z[tiny] == 0).all() and (z[~tiny] == xs[~tiny]).all()


# Reference round-toward-zero for values inside a format's normal range:
# clear the low float32 mantissa bits (independent of the implementation).
_FMT_RANGE = {"bf16": (2.0**-100, 2.0**100), "fp16": (2.0**-14, 60000.0),
              "tf32": (2.0**-100, 2.0**100), "fp8_e4m3": (2.0**-6, 440.0),
              "fp8_e5m2": (2.0**-14, 57000.0)}


def _fmt_data(seed, fmt, dtype, n=4096):
  lo, hi = _FMT_RANGE[fmt]
  lo = max(lo, float(ml_dtypes.finfo(dtype).smallest_normal))
  hi = min(hi, float(ml_dtypes.finfo(dtype).max) / 2)
  rng = np.random.default_rng(seed)
  mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
  x = mag * rng.choice([-1.0, 1.0], n)
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", sorted(fm.FORMATS))
def test_truncation_rounds_toward_zero_into_the_format(dtype, fmt):
  x = _fmt_data(22, fmt, dtype)
  y = injectors.inject("truncation", jax.random.key(0), x, fmt=fmt)
  xs = np.asarray(x, np.float32)
  f = fm.FORMATS[fmt]
  drop = 23 - f.mantissa_bits
  want = (xs.view(np.uint32) & np.uint32((0xFFFFFFFF << drop) & 0xFFFFFFFF)
          ).view(np.float32)
  np.testing.assert_array_equal(np.asarray(y, np.float32),
                                want.astype(jnp.dtype(dtype)).astype(
                                    np.float32))
  err = np.asarray(y, np.float64) - np.asarray(x, np.float64)
  assert (np.abs(np.asarray(y, np.float64)) <= np.abs(xs)).all()
  if f.mantissa_bits < ml_dtypes.finfo(dtype).nmant:
    # Biased toward zero: the signed error opposes the sign of x.
    assert (err * np.sign(xs) <= 0).all() and (err != 0).mean() > 0.7


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", sorted(fm.FORMATS))
def test_precision_output_is_representable_and_within_half_ulp(dtype, fmt):
  x = _fmt_data(23, fmt, dtype)
  y = injectors.inject(f"precision:{fmt}", jax.random.key(0), x)
  f = fm.FORMATS[fmt]
  ys = np.asarray(y, np.float64)
  xs = np.asarray(x, np.float64)
  if f.dtype is not None:  # representable: a round trip through fmt is exact
    rt = np.asarray(y, np.float32).astype(f.dtype).astype(np.float64)
    np.testing.assert_array_equal(rt, ys)
  else:
    assert (np.asarray(y, np.float32).view(np.uint32) & 0x1FFF == 0).all()
  narrower = f.mantissa_bits < ml_dtypes.finfo(dtype).nmant
  bound = 2.0**-(min(f.mantissa_bits, ml_dtypes.finfo(dtype).nmant) + 1)
  rel = np.abs(ys - xs) / np.abs(xs)
  assert rel.max() <= bound
  if narrower:
    assert rel.max() > bound / 4  # the rounding did happen
    # Unbiased, unlike truncation.
    err = (ys - xs) * np.sign(xs)
    assert abs(np.mean(err > 0) - np.mean(err < 0)) < 0.1
  if f.dtype is not None and dtype == jnp.float32:
    np.testing.assert_array_equal(
        ys, np.asarray(x).astype(f.dtype).astype(np.float64))


def test_precision_bf16_relative_error_and_saturate_option():
  x = data(24, (64, 64))
  y = np.asarray(injectors.inject("precision:bf16", jax.random.key(0), x),
                 np.float64)
  assert (np.abs(y - np.asarray(x, np.float64)) / np.abs(np.asarray(
      x, np.float64))).max() <= 2.0**-8
  big = data(25, (256,), scale=1000.0)
  y = np.asarray(injectors.inject("precision:fp8_e4m3", jax.random.key(0), big))
  assert np.isnan(y).any()  # overflow of a format without Inf
  y = np.asarray(injectors.inject("precision:fp8_e4m3", jax.random.key(0), big,
                            saturate=True))
  assert np.isfinite(y).all() and np.abs(y).max() == 448.0


@pytest.mark.parametrize("dtype", BROAD)
@pytest.mark.parametrize("name", ("reordering", "nondeterminism"))
def test_tensor_form_of_rounding_noise_moves_values_by_ulps(name, dtype):
  x = data(26, dtype=dtype)
  y = injectors.inject(name, jax.random.key(1), x, share=0.5, ulps=2)
  d = bits(y).astype(np.int64) - bits(x).astype(np.int64)
  assert set(np.unique(np.abs(d)).tolist()) == {0, 2}
  assert abs(int((d != 0).sum()) - x.size / 2) < 4 * np.sqrt(x.size / 4)


def test_unknown_name_lists_the_known_ones():
  x = data(27)
  with pytest.raises(PeatError, match="expected one of .*'bitflip'"):
    injectors.inject("bitflop", jax.random.key(0), x)
  with pytest.raises(PeatError, match="Formats: .*'fp8_e4m3'"):
    injectors.inject("precision:fp32", jax.random.key(0), x)
  with pytest.raises(PeatError, match="no injector"):
    injectors.inject("unknown", jax.random.key(0), x)
  with pytest.raises(PeatError, match="injecting_kernel"):
    injectors.inject("accumulation:fp16", jax.random.key(0), x)


@pytest.mark.parametrize("name,params,match", [
    ("bitflip", {"count": 0}, r"'count' expected an integer >= 1, got 0"),
    ("bitflip", {"count": 5000}, r"'count' expected <= 2048"),
    ("bitflip", {"bits": 40}, r"'bits' expected positions < 32"),
    ("bitflip", {"cout": 1}, r"unknown parameter\(s\) \['cout'\]"),
    ("bitflip", {"field_weights": (0, 0, 0)}, r"'field_weights' expected"),
    ("bitflip", {"bits_per_element": 30, "field_weights": (0, 0, 1)},
     r"'bits_per_element' expected <= 23"),
    ("bitflip", {"bits": 3, "bits_per_element": 2},
     r"expected at their defaults when 'bits' is given"),
    ("stuck_at", {}, r"missing required parameter 'bit'"),
    ("stuck_at", {"bit": 3, "value": 2}, r"'value' expected an integer >= 0"
     r" and <= 1, got 2"),
    ("stuck_at", {"bit": 3, "share": 0.0}, r"'share' expected a real number"
     r" > 0.0"),
    ("lane", {"stride": 32, "lane": 40}, r"'lane' expected < stride"),
    ("lane", {"effect": "zero", "bit": 3}, r"unknown parameter"),
    ("lane", {"effect": "melt"}, r"'effect' expected one of"),
    ("zero", {"mode": "rows", "count": 33}, r"'count' expected <= 32"),
    ("indexing", {"mode": "tile_swap", "tile": (32, 64)},
     r"at least two full"),
    ("saturation", {"fmt": "fp64"}, r"'fmt' expected one of"),
    ("scale", {"factor": float("nan")}, r"'factor' expected a real number"),
])
def test_bad_params_say_expected_and_got(name, params, match):
  with pytest.raises(PeatError, match=match):
    injectors.inject(name, jax.random.key(0), data(28), **params)


def test_bad_keys_and_arrays_are_rejected():
  x = data(29)
  with pytest.raises(PeatError, match="PRNG key"):
    injectors.inject("bitflip", 3, x)
  with pytest.raises(PeatError, match="PRNG key"):
    injectors.inject("bitflip", jax.random.split(jax.random.key(0), 2), x)
  with pytest.raises(PeatError, match="dtype int32"):
    injectors.inject("bitflip", jax.random.key(0), jnp.arange(8))
  with pytest.raises(PeatError, match="jax.Array"):
    injectors.inject("bitflip", jax.random.key(0), [1.0, 2.0])
  # A raw uint32 key works too, and PeatError is a ValueError.
  injectors.inject("bitflip", jax.random.PRNGKey(0), x)
  assert issubclass(PeatError, ValueError)


def test_second_call_does_not_recompile():
  x = data(30)
  injectors.inject("bitflip", jax.random.key(0), x, count=4)
  fn = checks._compiled("bitflip", checks._freeze(
      injectors.injection_params("bitflip", count=4)))
  before = fn._cache_size()
  injectors.inject("bitflip", jax.random.key(1), x, count=4)
  assert fn._cache_size() == before == 1
  traces = []

  @jax.jit
  def step(k, x):
    traces.append(1)
    return injectors.inject("precision:bf16", k, x).sum()

  step(jax.random.key(0), x)
  step(jax.random.key(1), x + 1)
  assert len(traces) == 1
  assert step._cache_size() == 1


PUBLIC = ("inject", "ERROR_MODELS", "TENSOR_ERROR_MODELS",
          "COMPUTATION_ERROR_MODELS", "injection_params", "bit_probabilities",
          "injecting_kernel", "inject_tree", "inject_gradients",
          "InjectGradientsState", "campaign", "kernel_campaign", "replay",
          "Campaign", "InjectionRecord")


def test_public_names_exist_and_match_the_facade_where_exported():
  import peat_jax  # pylint: disable=g-import-not-at-top
  for name in PUBLIC:
    assert hasattr(injectors, name), name
    if hasattr(peat_jax, name):
      assert getattr(peat_jax, name) is getattr(injectors, name)
