"""Tests of the Analyzer (peat_jax.analyzer.signature._signature): signatures vs float64 NumPy."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from peat_jax import analyzer
from peat_jax.analyzer.signature import _api as api
from peat_jax.analyzer.signature import _bits as bits
from peat_jax.analyzer.signature import _layout
from peat_jax.core import PeatError
from peat_jax.analyzer import reference_matmul

SHAPE = (64, 96)
DTYPES = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float64": np.float64,
}
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _golden(dtype, shape=SHAPE, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * np.exp2(rng.integers(-4, 4, shape))
  x = np.where(x == 0, 1.0, x)  # never zeros unless a test wants them
  return x.astype(dtype)


def _leaves(sig):
  return [np.asarray(x) for x in jax.tree.leaves(sig)]


# --------------------------------------------------------------- basics


@pytest.mark.parametrize("name", list(DTYPES))
def test_identical_records(name):
  g = _golden(DTYPES[name])
  s = analyzer.analyze(g, g.copy())
  n = g.size
  assert int(s.n) == n
  assert int(s.dtype_code) == list(DTYPES).index(name)
  assert int(s.n_bit_equal) == n and int(s.n_value_equal) == n
  assert float(s.share_differ) == 0.0
  assert float(s.abs_max) == 0.0 and float(s.rel_rms) == 0.0
  assert int(s.ulp_hist[0]) == n and int(s.ulp_hist[1:].sum()) == 0
  assert not np.asarray(s.bits_xor).any()
  assert not bool(s.is_permutation)
  # Equal elements are never compared by the shift tests.
  assert not np.asarray(s.shift_col_share).any()
  assert not np.asarray(s.shift_row_share).any()
  assert int(s.best_shift_col) == 0 and int(s.best_shift_row) == 0
  assert float(s.scale) == 1.0 and float(s.scale_spread) == 0.0
  assert not bool(s.has_reference) and np.isnan(float(s.noise_ratio))


@pytest.mark.parametrize("name,bit", [("float32", 20), ("bfloat16", 5),
                                      ("float16", 12), ("float64", 40)])
def test_bitflip_lands_in_bit_histogram(name, bit):
  g = _golden(DTYPES[name])
  rng = np.random.default_rng(1)
  idx = rng.choice(g.size, size=37, replace=False)
  t = g.copy()
  flat = t.reshape(-1).view(UINT[g.itemsize])
  flat[idx] ^= UINT[g.itemsize](1) << UINT[g.itemsize](bit)
  s = analyzer.analyze(t, g)
  xor = np.asarray(s.bits_xor)
  assert xor.shape == (8 * g.itemsize,)
  assert xor[bit] == 37 and xor.sum() == 37
  gb = g.reshape(-1).view(UINT[g.itemsize])[idx]
  ups = int(((gb >> UINT[g.itemsize](bit)) & 1 == 0).sum())
  assert int(s.bits_up[bit]) == ups and int(s.bits_down[bit]) == 37 - ups
  assert int(s.n_bit_equal) == g.size - 37
  # A flip of mantissa bit b moves the value by exactly 2**b ULPs.
  assert int(s.ulp_hist[bit + 1]) == 37
  assert int(np.asarray(s.row_ndiff).sum()) == 37
  assert int(np.asarray(s.col_ndiff).sum()) == 37


def test_statistics_match_float64_numpy():
  g = _golden(np.float32)
  rng = np.random.default_rng(2)
  t = (g * (1 + 3e-6 * rng.standard_normal(g.shape))).astype(np.float32)
  s = analyzer.analyze(t, g)
  d = t.astype(np.float64) - g.astype(np.float64)
  ad = np.abs(d)
  rel = ad / np.abs(g.astype(np.float64))
  np.testing.assert_allclose(float(s.abs_max), ad.max(), rtol=1e-6)
  np.testing.assert_allclose(float(s.abs_mean), ad.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(s.abs_rms), np.sqrt((d**2).mean()),
                             rtol=1e-5)
  np.testing.assert_allclose(float(s.rel_max), rel.max(), rtol=1e-6)
  np.testing.assert_allclose(float(s.rel_mean), rel.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(s.rel_rms), np.sqrt((rel**2).mean()),
                             rtol=1e-5)
  np.testing.assert_allclose(float(s.err_mean), d.mean(), rtol=1e-3,
                             atol=1e-9)
  np.testing.assert_allclose(float(s.golden_rms),
                             np.sqrt((g.astype(np.float64)**2).mean()),
                             rtol=1e-6)
  # Exact integer fields.
  assert int(s.n_bit_equal) == int((t.view(np.uint32) ==
                                    g.view(np.uint32)).sum())
  assert int(s.n_err_pos) == int((d > 0).sum())
  assert int(s.n_mag_larger) == int((np.abs(t) > np.abs(g)).sum())
  x = t.view(np.uint32) ^ g.view(np.uint32)
  want = [int(((x >> np.uint32(k)) & 1).sum()) for k in range(32)]
  assert np.asarray(s.bits_xor).tolist() == want
  np.testing.assert_array_equal(s.row_ndiff, (x != 0).sum(axis=1))
  np.testing.assert_array_equal(s.col_ndiff, (x != 0).sum(axis=0))
  lanes = np.bincount(np.nonzero(x != 0)[1] % 32, minlength=32)
  np.testing.assert_array_equal(s.lane_ndiff, lanes)
  # ULP histogram (log2 buckets).
  ti = t.view(np.int32).astype(np.int64)
  gi = g.view(np.int32).astype(np.int64)
  def ordered(i):
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)
  ulp = np.abs(ordered(ti) - ordered(gi))
  buckets = np.where(ulp == 0, 0, np.floor(np.log2(np.maximum(ulp, 1))) + 1).ravel()
  np.testing.assert_array_equal(
      s.ulp_hist, np.bincount(buckets.astype(int), minlength=33))
  # Percentiles: upper bound within one histogram bucket (factor 1.25).
  for j, p in enumerate(analyzer.PERCENTILES):
    exact = np.sort(ad.ravel())[int(np.ceil(p / 100 * ad.size)) - 1]
    got = float(s.abs_pct[j])
    assert exact <= got * (1 + 1e-7) and got <= exact * 1.25 + 1e-30
    exact_r = np.sort(rel.ravel())[int(np.ceil(p / 100 * rel.size)) - 1]
    got_r = float(s.rel_pct[j])
    assert exact_r <= got_r * (1 + 1e-7) and got_r <= exact_r * 1.25
  # Rounding noise: relative-like (slope ~1), unbiased.
  assert 0.8 < float(s.err_slope) < 1.2
  assert abs(float(s.bias)) < 0.1


def test_bf16_rounding_signature():
  g = _golden(np.float32)
  t = g.astype(ml_dtypes.bfloat16).astype(np.float32)
  s = analyzer.analyze(t, g)
  bf16 = analyzer.NARROW_FORMATS.index("bf16")
  assert float(s.repr_test[bf16]) == 1.0
  assert float(s.repr_golden[bf16]) < 0.01
  u = 2.0**-8  # bf16 unit roundoff
  rel = np.abs(t.astype(np.float64) - g) / np.abs(g.astype(np.float64))
  np.testing.assert_allclose(float(s.rel_rms), np.sqrt((rel**2).mean()),
                             rtol=1e-5)
  # Round to nearest: relative error <= u, RMS about u / sqrt(3)-ish.
  assert float(s.rel_max) <= u
  assert u / 6 < float(s.rel_rms) < u / 1.5
  assert abs(float(s.mag_bias)) < 0.1
  # The low 16 mantissa bits of t are zero: only they (and a few carries
  # into bit 16 and above) differ.
  assert int(s.bits_up[:16].sum()) == 0


def test_truncation_is_biased_toward_zero():
  g = _golden(np.float32)
  t = (g.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
  s = analyzer.analyze(t, g)
  assert int(s.n_mag_larger) == 0
  assert float(s.mag_bias) < -0.6
  assert float(s.repr_test[analyzer.NARROW_FORMATS.index("bf16")]) == 1.0


@pytest.mark.parametrize("axis,shift", [(-1, 1), (-1, -3), (0, 2), (0, -1)])
def test_shift_is_found(axis, shift):
  g = _golden(np.float32)
  t = np.roll(g, shift, axis=axis)
  s = analyzer.analyze(t, g)
  if axis == -1:
    assert int(s.best_shift_col) == shift
    assert float(s.shift_col_share[shift + analyzer.SHIFT_RANGE]) > 1 - 1e-6
  else:
    assert int(s.best_shift_row) == shift
    assert float(s.shift_row_share[shift + analyzer.SHIFT_RANGE]) > 1 - 1e-6
  assert bool(s.is_permutation)


def test_transpose_and_permutation():
  g = _golden(np.float32, shape=(48, 48))
  s = analyzer.analyze(g.T.copy(), g)
  assert float(s.transpose_share) == 1.0 and bool(s.is_permutation)
  rng = np.random.default_rng(3)
  perm = rng.permutation(g.reshape(-1)).reshape(g.shape)
  assert bool(analyzer.analyze(perm, g).is_permutation)
  other = g.copy()
  other[0, 0] = np.nextafter(other[0, 0], np.float32(np.inf))
  assert not bool(analyzer.analyze(other, g).is_permutation)


@pytest.mark.parametrize("c", [0.5, 3.0, -2.0])
def test_scale_estimate(c):
  g = _golden(np.float32)
  t = (g.astype(np.float64) * c).astype(np.float32)
  s = analyzer.analyze(t, g)
  np.testing.assert_allclose(float(s.scale), c, rtol=1e-5)  # float32 log2
  assert float(s.scale_spread) < 1e-6


def test_zero_tile_and_lane():
  g = _golden(np.float32)
  t = g.copy()
  t[8:16, 24:32] = 0.0  # one aligned 8x8 tile left zero
  s = analyzer.analyze(t, g)
  assert int(s.n_zeroed) == 64
  assert int(s.tile_ndiff[1, 3]) == 64 and int(s.tile_ndiff.sum()) == 64
  np.testing.assert_array_equal(s.tiles_all, [1, 0, 0])
  np.testing.assert_array_equal(s.tiles_any, [1, 1, 1])
  t = g.copy()
  t[:, 5::32] *= 1.5  # lane 5 corrupted
  lanes = np.asarray(analyzer.analyze(t, g).lane_ndiff)
  assert lanes[5] == t.shape[0] * 3 and lanes.sum() == lanes[5]


def test_special_values_counts():
  g = _golden(np.float32)
  t = g.copy()
  t[0, :3] = np.nan
  t[1, :2] = np.inf
  t[2, 0] = np.finfo(np.float32).max
  g2 = g.copy()
  g2[3, :4] = np.float32(1e-40)  # subnormal golden
  t[3, :4] = 0.0                 # flushed to zero
  s = analyzer.analyze(t, g2)
  assert int(s.n_nan_test) == 3 and int(s.n_inf_test) == 2
  assert int(s.n_nonfinite_new) == 5
  assert int(s.n_saturated) == 3  # 2 Inf + 1 at the float32 max
  assert int(s.n_flushed) == 4 and int(s.n_golden_subnormal) == 4
  assert int(s.n_overflow) == 0 and int(s.dtype_code) == 0
  g3 = g.copy()
  g3[1, :2] = 1e5  # beyond fp16 / fp8 maxima: Inf is an overflow
  assert int(analyzer.analyze(t, g3).n_overflow) == 2
  assert int(s.n_finite_pairs) == g.size - 5
  assert np.isfinite(float(s.abs_rms)) and np.isfinite(float(s.rel_rms))


@pytest.mark.parametrize("fill", [np.nan, np.inf, 0.0])
def test_degenerate_golden_is_defined(fill):
  g = np.full(SHAPE, fill, np.float32)
  t = _golden(np.float32)
  s = analyzer.analyze(t, g)
  if fill == 0.0:
    assert int(s.n_golden_zero) == g.size
    # rel = |d| / tiny: huge but finite, never a division by zero.
    assert np.isfinite(float(s.rel_max)) and float(s.rel_max) > 1e30
    assert int(s.n_finite_pairs) == g.size
  else:
    assert int(s.n_finite_pairs) == 0
    assert float(s.abs_rms) == 0.0 and float(s.abs_pct[0]) == 0.0
  for name in FINITE_FIELDS:
    assert not np.isnan(np.asarray(getattr(s, name), np.float64)).any(), name


@pytest.mark.parametrize("name", list(DTYPES))
def test_representable_is_the_exact_round_trip(name):
  """The integer rule equals an exact round trip (ml_dtypes, no flushing),
  subnormals and range edges included."""
  rng = np.random.default_rng(7)
  edges = [0.0, -0.0, 1e-40, 1e-45, 2.0**-24, 2.0**-25, 2.0**-9, 2.0**-10,
           448.0, 464.0, 480.0, 57344.0, 61440.0, 65504.0, 65520.0,
           1 + 2.0**-10, 1 + 2.0**-11, 3e38, np.inf, np.nan, 1e-310]
  x = np.concatenate([edges, rng.standard_normal(400) *
                      np.exp2(rng.integers(-40, 40, 400))])
  with np.errstate(over="ignore", invalid="ignore"):
    x = np.concatenate([x] + [x.astype(d).astype(np.float64) for d in (
        ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2)])
    x = x.astype(DTYPES[name])
  u = x.view(UINT[x.itemsize])
  with jax.enable_x64(name == "float64"):
    got = jax.jit(lambda v: bits._representable(v, x.dtype))(u)
  xd = x.astype(np.float64)
  with np.errstate(over="ignore", invalid="ignore"):
    for fmt, mask in zip(analyzer.NARROW_FORMATS, got):
      if fmt == "tf32":
        x32 = xd.astype(np.float32)
        want = (x32.astype(np.float64) == xd) & (
            (x32.view(np.uint32) & 0x1FFF) == 0)
      else:
        nd = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16,
              "fp8_e4m3": ml_dtypes.float8_e4m3fn,
              "fp8_e5m2": ml_dtypes.float8_e5m2}[fmt]
        want = xd.astype(nd).astype(np.float64) == xd
      np.testing.assert_array_equal(np.asarray(mask), want & np.isfinite(xd),
                                    err_msg=fmt)


# ----------------------------------------------- reference / noise floor


def test_noise_floor_ratio_with_reference():
  rng = np.random.default_rng(4)
  a = rng.standard_normal((64, 256)).astype(np.float32)
  b = rng.standard_normal((256, 96)).astype(np.float32)
  r = reference_matmul(a, b)
  g = np.asarray(jnp.matmul(a, b, precision="highest"))
  t = np.asarray(jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                            preferred_element_type=jnp.float32))
  s = analyzer.analyze(t, g, reference=r)
  assert bool(s.has_reference)
  err_g = np.abs(g.astype(np.float64) - r)
  np.testing.assert_allclose(float(s.ref_golden_abs_max), err_g.max(),
                             rtol=1e-5)
  np.testing.assert_allclose(float(s.ref_golden_abs_rms),
                             np.sqrt((err_g**2).mean()), rtol=1e-5)
  assert float(s.noise_ratio) > 10  # bf16 inputs: far above the floor
  assert float(s.share_golden_closer) > 0.9
  same = analyzer.analyze(g, g, reference=r)
  assert float(same.noise_ratio) == 1.0
  assert float(same.share_test_closer) == 0.0


# ------------------------------------------------ batched and streaming


def test_batch_matches_single_records():
  """Batched (pure-JAX pass) == one record at a time (on CPU the native
  pass): counts exactly, floats to 1e-4 (summation order; err_corr, from
  differences of sums, moves most: 2.4e-5 here)."""
  rng = np.random.default_rng(5)
  gs = np.stack([_golden(np.float32, seed=i) for i in range(3)])
  ts = (gs * (1 + 1e-6 * rng.standard_normal(gs.shape))).astype(np.float32)
  ts[1, 2, 3] = np.nan
  sb = analyzer.analyze_batch(ts, gs)
  for i in range(3):
    si = analyzer.analyze(ts[i], gs[i])
    for name in analyzer.Signature._fields:
      got = np.asarray(getattr(sb, name))[i]
      want = np.asarray(getattr(si, name))
      if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=name)
      else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_streaming_accumulates_over_steps():
  rng = np.random.default_rng(6)
  g1, g2 = _golden(np.float32, seed=1), _golden(np.float32, seed=2)
  t1 = (g1 * (1 + 1e-6 * rng.standard_normal(SHAPE))).astype(np.float32)
  t2 = (g2 * (1 + 1e-5 * rng.standard_normal(SHAPE))).astype(np.float32)
  state = analyzer.signature_init(SHAPE, np.float32)
  state = analyzer.signature_update(state, t1, g1)
  state = analyzer.signature_update(state, t2, g2)
  s = analyzer.signature_finalize(state)
  s1, s2 = analyzer.analyze(t1, g1), analyzer.analyze(t2, g2)
  assert int(s.n) == 2 * g1.size
  assert int(s.n_bit_equal) == int(s1.n_bit_equal) + int(s2.n_bit_equal)
  np.testing.assert_array_equal(s.bits_xor, np.asarray(s1.bits_xor) +
                                np.asarray(s2.bits_xor))
  np.testing.assert_array_equal(s.ulp_hist, np.asarray(s1.ulp_hist) +
                                np.asarray(s2.ulp_hist))
  assert float(s.abs_max) == max(float(s1.abs_max), float(s2.abs_max))
  d = np.concatenate([(t1.astype(np.float64) - g1).ravel(),
                      (t2.astype(np.float64) - g2).ravel()])
  np.testing.assert_allclose(float(s.abs_rms), np.sqrt((d**2).mean()),
                             rtol=1e-5)
  np.testing.assert_allclose(float(s.abs_mean), np.abs(d).mean(), rtol=1e-5)


# ------------------------------------------- compilation, determinism


def test_second_call_does_not_recompile():
  g = _golden(np.float32)
  analyzer.analyze(g * 2, g)
  before = api._compiled()
  assert before >= 1
  with jax.log_compiles(True):
    s = analyzer.analyze(_golden(np.float32, seed=9), g)
  jax.block_until_ready(s)
  assert api._compiled() == before


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_a_new_shape_in_a_seen_bucket_compiles_nothing(dtype):
  """On CPU records run padded to their size bucket: a shape not seen
  before, in a bucket seen, reuses the executables (analyze with its
  reference, the screen, the decomposition)."""
  if not api._bucketed():
    pytest.skip("records are padded to size buckets on CPU")
  rng = np.random.default_rng(3)

  def pair(shape):
    r = rng.standard_normal(shape)
    g = r.astype(dtype)
    t = (r * (1 + 2.0 ** -12 * rng.standard_normal(shape))).astype(dtype)
    return t, g, r

  assert _layout.bucket(40 * 150) == _layout.bucket(96 * 80)
  first = pair((40, 150))
  analyzer.analyze(*first)
  analyzer.screen(*first)
  analyzer.decomposition(*first)
  before = api._compiled()
  second = pair((96, 80))
  sig = analyzer.analyze(*second)
  scr_sig, _ = analyzer.screen(*second)
  dec = analyzer.decomposition(*second)
  assert api._compiled() == before
  # The results are the record's own: its rows, columns and tiles.
  assert np.shape(sig.row_ndiff) == (96,) and np.shape(sig.col_ndiff) == (80,)
  assert np.shape(sig.tile_ndiff) == (12, 10)
  assert np.shape(dec.out_rows) == (96,) and np.shape(dec.out_cols) == (80,)
  assert np.shape(scr_sig.row_abs_mean) == (96,)
  assert int(sig.n) == 96 * 80


def test_bitwise_deterministic():
  g = _golden(np.float32)
  t = (g * np.float32(1.0001)).astype(np.float32)
  a = _leaves(analyzer.analyze(t, g))
  b = _leaves(analyzer.analyze(t.copy(), g.copy()))
  for x, y in zip(a, b):
    assert x.tobytes() == y.tobytes()


# ----------------------------------------------------------- bad input


@pytest.mark.parametrize("kind", ["dtype_mismatch", "shape_mismatch",
                                  "int_dtype", "complex_dtype", "empty",
                                  "not_array", "reference_shape",
                                  "batched_0d"])
def test_bad_input_raises_peat_error(kind):
  g = _golden(np.float32, shape=(4, 8))
  with pytest.raises(PeatError) as err:
    if kind == "dtype_mismatch":
      analyzer.analyze(g.astype(np.float16), g)
    elif kind == "shape_mismatch":
      analyzer.analyze(g[:2], g)
    elif kind == "int_dtype":
      analyzer.analyze(g.astype(np.int32), g.astype(np.int32))
    elif kind == "complex_dtype":
      analyzer.analyze(g.astype(np.complex64), g.astype(np.complex64))
    elif kind == "empty":
      analyzer.analyze(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    elif kind == "not_array":
      analyzer.analyze([1.0, 2.0], g)
    elif kind == "reference_shape":
      analyzer.analyze(g, g, reference=np.zeros((3, 3)))
    elif kind == "batched_0d":
      analyzer.analyze_batch(np.float32(1), np.float32(1))
  msg = str(err.value)
  assert "expected" in msg and "Fix" in msg


def test_streaming_misuse_raises():
  state = analyzer.signature_init(SHAPE, np.float32)
  with pytest.raises(PeatError, match="no record"):
    analyzer.signature_finalize(state)
  g = _golden(np.float32, shape=(4, 8))
  with pytest.raises(PeatError, match="2-D view"):
    analyzer.signature_update(state, g, g)
  with pytest.raises(PeatError, match="dtype"):
    analyzer.signature_init(SHAPE, np.int8)


# Fields that must never be NaN (the ref_* fields are NaN without reference).
FINITE_FIELDS = [
    f for f in analyzer.Signature._fields
    if not (f.startswith("ref_") or f in ("noise_ratio", "share_test_closer",
                                          "share_golden_closer"))
]


def test_every_field_is_documented():
  import pathlib
  doc = (pathlib.Path(__file__).parents[2] / "docs" / "signature.md"
         ).read_text()
  for name in analyzer.Signature._fields:
    assert f"`{name}`" in doc, name
    assert name in analyzer.Signature.__doc__, name


def test_analyze_split_equals_analyze_with_reference():
  """A reference split on the device gives the host split's signature."""
  g = _golden(np.float32, seed=21)
  t = (g * (1 + 1e-6 * np.random.default_rng(21).standard_normal(
      g.shape))).astype(np.float32)
  r = g.astype(np.float64) * (1 + 1e-9)
  with jax.enable_x64(True):
    hi, lo = jax.jit(analyzer.split_on_device)(jnp.asarray(r))
  want = analyzer.analyze(t, g, r)
  got = analyzer.analyze_split(t, g, hi, lo)
  for name in analyzer.Signature._fields:
    np.testing.assert_array_equal(np.asarray(getattr(got, name)),
                                  np.asarray(getattr(want, name)),
                                  err_msg=name)
  with pytest.raises(PeatError, match="ref_lo has shape"):
    analyzer.analyze_split(t, g, hi, lo[:1])


def test_analyze_split_many_to_host_equals_device_fields():
  """Packed transfer (one array per dtype) == each field fetched alone."""
  rng = np.random.default_rng(22)
  recs = [_golden(np.float32, shape=s, seed=i)
          for i, s in enumerate([(8, 16), (3, 5, 7), (40,)])]
  tests = [(g * (1 + 1e-6 * rng.standard_normal(g.shape))).astype(np.float32)
           for g in recs]
  with jax.enable_x64(True):
    halves = [jax.jit(analyzer.split_on_device)(jnp.asarray(g, jnp.float64))
              for g in recs]
  his, los = [h for h, _ in halves], [l for _, l in halves]
  dev = analyzer.analyze_split_many(tests, recs, his, los)
  host = analyzer.analyze_split_many(tests, recs, his, los, to_host=True)
  for d, h in zip(dev, host):
    for name in analyzer.Signature._fields:
      want = np.asarray(jax.device_get(getattr(d, name)))
      got = getattr(h, name)
      assert isinstance(got, np.ndarray) and got.dtype == want.dtype, name
      np.testing.assert_array_equal(got, want, err_msg=name)
  with pytest.raises(PeatError, match="record 1: ref_hi"):
    analyzer.analyze_split_many(tests, recs, [his[0], his[0], his[2]], los)
