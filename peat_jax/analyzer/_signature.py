"""The Analyzer: pseudo-error signatures of a kernel under test vs its golden.

A *signature* is a fixed set of statistics of one pseudo-error (KUT output `t`
minus golden output `g` at one site and step), optionally against a float64
*reference* `r`. It is computed in three layers:

1. The statistics pass: one read of the elements that returns a
   `SignatureState`: mergeable partial statistics (counts, sums, maxima,
   histograms, per-row/per-column vectors). On CPU it is the native kernel
   `peat_jax/kernels/csrc/signature.cc` (`_accumulate_native`, an XLA FFI
   call), elsewhere and for batches pure JAX (`_accumulate`,
   `_accumulate_bits`); `_accumulate_auto` picks by platform when lowering.
2. `_merge(a, b)`: combines two states (the streaming form's update).
3. `_finalize(state)`: turns a state into the user-facing `Signature`.

Public entry points:

* `analyze(test, golden, reference=None) -> Signature` for one record;
* `analyze_batch(tests, goldens, references=None) -> Signature` for many
  records of the same shape stacked on a leading axis (one call, `vmap`);
* `signature_init` / `signature_update` / `signature_finalize`: streaming
  accumulation over steps with pure functions over a NamedTuple state.

Every field is documented in `Signature` and in `docs/signature.md`.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax.core._errors import PeatError

Array = jax.Array

# --------------------------------------------------------------------------
# Constants (public through the docs: they fix the Signature's layout).
# --------------------------------------------------------------------------

#: Shifts tried by the shift tests: -SHIFT_RANGE .. +SHIFT_RANGE.
SHIFT_RANGE = 8
#: At most this many rows (evenly spread) are used by the shift/transpose tests.
SHIFT_SAMPLE_ROWS = 16
#: ... and their first SHIFT_WINDOW columns; about SHIFT_WINDOW elements per
#: shift (more rows when rows are short).
SHIFT_WINDOW = 512
#: A shift or transpose share is 0 unless at least this many informative
#: positions (t differs from g, t not +-0) were compared.
SHIFT_MIN_COMPARED = 8
#: Percentiles are read from a histogram of at most this many elements.
PCT_SAMPLE = 1 << 16
#: Histogram buckets: float32 bit pattern >> 21 (exponent + 2 mantissa bits).
HIST_BUCKETS = 1024
#: Percentiles reported by `abs_pct` / `rel_pct` / `ulp_pct`.
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
#: Tile edges for the aligned-block counts.
TILE_SIZES = (8, 16, 32)
#: Lanes: column index modulo this.
LANES = 32
#: Narrow formats whose representability is counted, in this order.
NARROW_FORMATS = ("bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2")

# Flag bits counted exactly over all elements (index into `SignatureState.flags`).
_F_BIT_EQUAL = 0
_F_VALUE_EQUAL = 1
_F_NAN_T = 2
_F_NAN_G = 3
_F_INF_T = 4
_F_INF_G = 5
_F_FINITE_PAIR = 6
_F_NONFINITE_NEW = 7
_F_ZEROED = 8
_F_FLUSHED = 9
_F_SATURATED = 10
_F_SAT_FP16 = 11
_F_SAT_E4M3 = 12
_F_GOLDEN_SUBNORMAL = 13
_F_POS_ERR = 14
_F_NEG_ERR = 15
_F_MAG_LARGER = 16
_F_MAG_SMALLER = 17
_F_SIGN_FLIP = 18
_F_RATIO_OK = 19
_F_LOG_OK = 20
_F_GOLDEN_ZERO = 21
_F_OVERFLOW = 22
_N_FLAGS = 23

_DTYPE_CODE = {"float32": 0, "bfloat16": 1, "float16": 2, "float64": 3}
_SUPPORTED = {
    np.dtype(np.float32): "float32",
    np.dtype(jnp.bfloat16): "bfloat16",
    np.dtype(np.float16): "float16",
    np.dtype(np.float64): "float64",
}


def _bits_of(dtype) -> int:
  return np.dtype(dtype).itemsize * 8


# --------------------------------------------------------------------------
# Public pytrees.
# --------------------------------------------------------------------------


class SignatureState(NamedTuple):
  """Mergeable partial statistics of one or more pseudo-errors (streaming).

  All fields are arrays; the shapes depend only on the record shape and
  dtype. Counts are int32 (wrap-around sums for the uint32 hashes); float
  fields are in the compute dtype (float32, or float64 for float64 inputs).
  Sums of squares are stored *scaled* by the matching maximum (the LAPACK
  `nrm2` trick) so that they cannot overflow: `x_sqs = sum((x / x_max)**2)`.
  """

  steps: Array  # int32: records merged into this state
  dtype_code: Array  # int32: 0 float32, 1 bfloat16, 2 float16, 3 float64
  n: Array  # int32: elements seen
  flags: Array  # int32[32]: counts of the _F_* conditions
  bits_up: Array  # int32[nbits]: bit k is 1 in t and 0 in g
  bits_down: Array  # int32[nbits]: bit k is 0 in t and 1 in g
  ulp_cum: Array  # int32[nbits]: finite pairs with ULP distance >= 2**k
  row_ndiff: Array  # int32[R]
  row_abs_max: Array  # f[R]
  row_abs_sum: Array  # f[R]
  row_abs_sqs: Array  # f[R], scaled by row_abs_max
  col_ndiff: Array  # int32[C]
  col_abs_sum: Array  # f[C]
  tile_ndiff: Array  # int32[R//8, C//8]
  err_sum: Array  # f: sum of signed t - g
  mag_err_sum: Array  # f: sum of sign(g) * sign(d) * rel
  rel_max: Array
  rel_sum: Array
  rel_sqs: Array  # scaled by rel_max
  g_absmax: Array
  g_sqs: Array  # scaled by g_absmax
  ratio_min: Array
  ratio_max: Array
  logratio_sum: Array
  slope_sums: Array  # f[5]: sum x, y, xy, xx, yy with x=log2|g|, y=log2|t-g|
  hash_t: Array  # uint32[2]: order-free sums: mixed hash, plain bit pattern
  hash_g: Array  # uint32[2]
  shift_col_match: Array  # int32[2*SHIFT_RANGE+1]
  shift_col_n: Array
  shift_row_match: Array
  shift_row_n: Array
  transpose_match: Array  # int32
  transpose_n: Array  # int32
  hist_abs: Array  # int32[HIST_BUCKETS]
  hist_rel: Array
  pct_n: Array  # int32: finite pairs in the percentile histograms
  sample_n: Array  # int32: elements in the sample
  repr_t: Array  # int32[5]: sampled t representable in NARROW_FORMATS
  repr_g: Array  # int32[5]
  ref_steps: Array  # int32: records that had a reference
  ref_n: Array  # int32: elements with finite t, g and r
  ref_t_max: Array  # max |t - r|
  ref_t_sqs: Array  # scaled by ref_t_max
  ref_g_max: Array  # max |g - r|
  ref_g_sqs: Array
  ref_t_rel_sum: Array
  ref_g_rel_sum: Array
  ref_t_closer: Array  # int32: |t - r| < |g - r|
  ref_g_closer: Array  # int32: |g - r| < |t - r|
  ref_t_shrunk: Array  # int32: |t| < |r| (t moved toward zero from r)
  ref_t_grown: Array  # int32: |t| > |r|
  ref_g_shrunk: Array  # int32: |g| < |r|
  ref_g_grown: Array  # int32: |g| > |r|
  zeroed_g_max: Array  # max |g| over zeroed elements (t == 0, g != 0)


# Merge rules (default: add).
_MAX_FIELDS = ("dtype_code", "row_abs_max", "rel_max", "g_absmax", "ratio_max", "ref_t_max",
               "ref_g_max", "zeroed_g_max")
_MIN_FIELDS = ("ratio_min",)
_SCALED = (("row_abs_sqs", "row_abs_max"), ("rel_sqs", "rel_max"),
           ("g_sqs", "g_absmax"), ("ref_t_sqs", "ref_t_max"),
           ("ref_g_sqs", "ref_g_max"))


class Signature(NamedTuple):
  """Statistics of one pseudo-error `t - g` (see docs/signature.md).

  Notation: `t` test (KUT) output, `g` golden output, `r` float64 reference;
  n elements; a *finite pair* is an element where t and g are both finite;
  `d = t - g` and `|d|` are computed in float32 (float64 for float64 inputs)
  and saturate at that dtype's largest finite value; `rel = |d| /
  max(|g|, tiny)` with `tiny` the smallest normal number of the input dtype
  (so golden zeros never divide by zero) and saturates likewise. Means and
  RMS are over finite pairs (0 when there is none). Shares are counts / n.
  The record is viewed as 2-D (R, C) with C the last axis (C = n, R = 1 for
  0-D and 1-D arrays).

  Fields (counts are int32, everything else float32 unless said otherwise):
    n: element count.
    n_bit_equal: elements whose bit patterns are identical.
    n_value_equal: elements with t == g (so +0 == -0, NaN != NaN).
    n_nan_test, n_nan_golden, n_inf_test, n_inf_golden: NaN/Inf counts.
    n_finite_pairs: elements where both t and g are finite.
    n_nonfinite_new: t is NaN or Inf where g is finite (error model `nan`).
    n_zeroed: t == 0 where g is finite and nonzero (`zero`).
    n_flushed: g is subnormal and t == 0 (`ftz`).
    n_golden_subnormal: g is subnormal (denominator for `n_flushed`).
    n_saturated: g finite, |g| < max of t's dtype, and t is +-Inf or
      +-max of t's dtype (`saturation`).
    n_saturated_fp16: |t| == 65504 and |g| > 65504 (clipped at fp16 max).
    n_saturated_fp8_e4m3: |t| == 448 and |g| > 448.
    n_sign_flip: finite pairs, both nonzero, sign bits differ.
    n_err_pos, n_err_neg: finite pairs with d > 0, d < 0.
    n_mag_larger, n_mag_smaller: finite pairs with |t| > |g|, |t| < |g|
      (`truncation` makes |t| <= |g| everywhere).
    n_golden_zero: g == 0.
    n_overflow: t is +-Inf where g is finite and |g| > 448 (the fp8_e4m3
      maximum, the smallest narrow-format maximum): a conversion overflowed.
    dtype_code: int32: 0 float32, 1 bfloat16, 2 float16, 3 float64.
    share_differ: (n - n_bit_equal) / n.
    repr_test, repr_golden: float32[5]: share of elements of t (of g) that
      are exactly representable (finite, round-trip equal) in bf16, fp16,
      tf32 (10 mantissa bits, float32 range), fp8_e4m3 (e4m3fn), fp8_e5m2,
      in that order (NARROW_FORMATS), decided exactly from the bit pattern
      (`_representable`). `precision:<fmt>` drives repr_test[fmt] to 1
      while repr_golden[fmt] stays low.
    abs_max, abs_mean, abs_rms: max, mean, sqrt(mean(d**2)) of |d|.
    rel_max, rel_mean, rel_rms: same for rel.
    abs_pct, rel_pct: float32[4]: the PERCENTILES (50, 90, 99, 99.9) of |d|
      and rel over finite pairs, read from a histogram of the float32 bit
      pattern >> 21 (4 buckets per octave): each value is the upper edge of
      the bucket holding the percentile, clipped to the exact max, so it is
      an upper bound within a factor 1.25 of the exact order statistic
      (values below 2**-126 fall in coarser buckets). When n > PCT_SAMPLE
      (65536) the histogram holds a jittered stratified sample of
      PCT_SAMPLE elements (one per stratum of n // PCT_SAMPLE elements).
    err_mean: mean of signed d. bias: err_mean / abs_rms (0 if abs_rms is
      0 or err_mean undefined), in [-1, 1]: about 0 for unbiased rounding
      noise.
    mag_bias: mean(sign(g) * sign(d) * rel) / rel_rms, in [-1, 1]: the
      bias toward larger (> 0) or smaller (< 0) magnitudes, scale-free;
      about -0.8 for `truncation` (round toward zero), about 0 for round to
      nearest.
    golden_absmax, golden_rms: max |g| and sqrt(mean(g**2)), finite pairs.
    ulp_hist: int32[nbits+1]: finite pairs by ULP distance (distance of the
      bit patterns in t's format, +0 and -0 equal): bucket 0 holds distance
      0, bucket k holds 2**(k-1) <= distance < 2**k.
    ulp_pct: float32[4]: percentiles of the ULP distance as bucket upper
      edges 2**k - 1 (exact within a factor 2).
    bits_xor, bits_up, bits_down: int32[nbits]: per bit position k (0 =
      least significant mantissa bit, nbits-1 = sign), the elements where
      bit k differs / is 1 in t and 0 in g / is 0 in t and 1 in g. For
      float32 bits 0..22 are mantissa, 23..30 exponent, 31 sign.
    row_ndiff: int32[R], row_abs_max: [R], row_abs_mean: [R]: differing
      elements, max and mean |d| per row (mean over the row's C elements).
    col_ndiff: int32[C], col_abs_mean: [C]: the same per column (mean over R).
    lane_ndiff: int32[32]: differing elements by column index mod 32.
    tile_ndiff: int32[R//8, C//8]: differing elements per aligned 8x8 tile
      of the largest (8k, 8m) top-left sub-array.
    tiles_total, tiles_any, tiles_all: int32[3]: for tile edges 8, 16, 32,
      the aligned tiles, those with at least one differing element and
      those where every element differs (`zero`, `lane`, tiles of garbage).
    scale: exp2(mean(log2|t| - log2|g|)) * sign, over elements where g is
      normal and t finite and nonzero (1.0 when there is none); relative
      accuracy about 1e-6 (float32 log2).
    scale_spread: (ratio_max - ratio_min) / |scale| of t/g over the same
      elements (0 when there is none): ~0 for `scale` and for `exact`.
    err_slope, err_corr: least-squares slope and correlation of
      y = log2|d| on x = log2|g| over finite pairs with d != 0 and g != 0:
      slope ~1 means relative-like (rounding), ~0 absolute-like (0 when
      undefined).
    is_permutation: bool: the multisets of bit patterns of t and g are
      equal (two order-free 32-bit sums: of a mixing hash of the patterns
      and of the patterns) and n_bit_equal < n.
    shift_col_share, shift_row_share: float32[17]: for s = -8..8 (index s+8),
      the share of compared elements where t[i, j] == g[i, j - s] (columns)
      or t[i, j] == g[i - s, j] (rows), bitwise. Compared: positions among
      the first min(C, 512) columns of min(R, 16, max(2, ceil(512 /
      min(C, 512)))) evenly spread rows where t differs from g bitwise, t
      is not +-0 and the source is in range; the share is 0 when fewer
      than SHIFT_MIN_COMPARED (8) were compared (so index 8, s = 0, is
      always 0).
    best_shift_col, best_shift_row: int32: the s != 0 with the largest share
      (0 if every share is 0).
    transpose_share: share of t[i, j] == g[j, i] over the same compared
      positions (0 unless R == C).
    has_reference: bool.
    ref_test_abs_max, ref_test_abs_rms, ref_golden_abs_max,
    ref_golden_abs_rms: max and RMS of |t - r| and |g - r| over elements
      where t, g, r are finite (r kept in double-float, so the differences
      are exact to ~2**-48 relative).
    ref_test_rel_mean, ref_golden_rel_mean: mean of |t - r| / max(|r|,
      tiny) and |g - r| / max(|r|, tiny).
    noise_ratio: ref_test_abs_rms / ref_golden_abs_rms (1 when both are 0,
      +Inf when only the golden one is 0): <= ~1 means within the noise
      floor.
    share_test_closer, share_golden_closer: share of elements where t (g)
      is strictly closer to r.
    ref_test_shrunk, ref_test_grown, ref_golden_shrunk, ref_golden_grown:
      share of elements (t, g, r finite, r != 0) where |t| < |r| / |t| > |r|
      (and the same for g; r's sign and zero from the bits of its float32
      high part): round toward zero gives ref_test_grown = 0.
    zeroed_golden_absmax: max |g| over the zeroed elements (those counted
      in n_zeroed: t == +-0, g finite and nonzero), 0 when none: below a
      format's smallest normal, the zeros are flushes (`ftz`), not missed
      writes.
    The ref_* fields, noise_ratio and the share_*_closer fields are NaN
    when no reference was given.
  """

  n: Array
  n_bit_equal: Array
  n_value_equal: Array
  n_nan_test: Array
  n_nan_golden: Array
  n_inf_test: Array
  n_inf_golden: Array
  n_finite_pairs: Array
  n_nonfinite_new: Array
  n_zeroed: Array
  n_flushed: Array
  n_golden_subnormal: Array
  n_saturated: Array
  n_saturated_fp16: Array
  n_saturated_fp8_e4m3: Array
  n_sign_flip: Array
  n_err_pos: Array
  n_err_neg: Array
  n_mag_larger: Array
  n_mag_smaller: Array
  n_golden_zero: Array
  n_overflow: Array
  dtype_code: Array
  share_differ: Array
  repr_test: Array
  repr_golden: Array
  abs_max: Array
  abs_mean: Array
  abs_rms: Array
  rel_max: Array
  rel_mean: Array
  rel_rms: Array
  abs_pct: Array
  rel_pct: Array
  err_mean: Array
  bias: Array
  mag_bias: Array
  golden_absmax: Array
  golden_rms: Array
  ulp_hist: Array
  ulp_pct: Array
  bits_xor: Array
  bits_up: Array
  bits_down: Array
  row_ndiff: Array
  row_abs_max: Array
  row_abs_mean: Array
  col_ndiff: Array
  col_abs_mean: Array
  lane_ndiff: Array
  tile_ndiff: Array
  tiles_total: Array
  tiles_any: Array
  tiles_all: Array
  scale: Array
  scale_spread: Array
  err_slope: Array
  err_corr: Array
  is_permutation: Array
  shift_col_share: Array
  shift_row_share: Array
  best_shift_col: Array
  best_shift_row: Array
  transpose_share: Array
  has_reference: Array
  ref_test_abs_max: Array
  ref_test_abs_rms: Array
  ref_golden_abs_max: Array
  ref_golden_abs_rms: Array
  ref_test_rel_mean: Array
  ref_golden_rel_mean: Array
  noise_ratio: Array
  share_test_closer: Array
  share_golden_closer: Array
  ref_test_shrunk: Array
  ref_test_grown: Array
  ref_golden_shrunk: Array
  ref_golden_grown: Array
  zeroed_golden_absmax: Array


# --------------------------------------------------------------------------
# Validation (Python, before tracing).
# --------------------------------------------------------------------------


def _check_dtype(dtype, what: str) -> np.dtype:
  dtype = np.dtype(dtype)
  if dtype not in _SUPPORTED:
    raise PeatError(
        f"{what} has dtype {dtype}; expected one of float32, bfloat16, "
        "float16, float64. Fix: analyze the floating-point output of the "
        "kernel (cast integer or complex outputs yourself, e.g. compare the "
        "real and imaginary parts separately).")
  return dtype


def _check_pair(test, golden, *, batched: bool) -> tuple[tuple[int, ...],
                                                         np.dtype]:
  """Validates shapes and dtypes; returns (record shape, dtype)."""
  for what, x in (("test", test), ("golden", golden)):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      raise PeatError(
          f"{what}: expected an array (jax.Array or numpy.ndarray); got "
          f"{type(x).__name__}. Fix: pass jnp.asarray(...) of the output.")
  dt = _check_dtype(test.dtype, "test")
  dg = _check_dtype(golden.dtype, "golden")
  if dt != dg:
    raise PeatError(
        f"test dtype {dt} != golden dtype {dg}; expected equal dtypes. Fix: "
        "compare outputs of the same format (cast the KUT output to the "
        "golden dtype only if that is what the model consumes).")
  if tuple(test.shape) != tuple(golden.shape):
    raise PeatError(
        f"test shape {tuple(test.shape)} != golden shape "
        f"{tuple(golden.shape)}; expected equal shapes. Fix: compare the "
        "same site's outputs (check the site name and layout).")
  shape = tuple(test.shape)
  if batched:
    if len(shape) < 1:
      raise PeatError(
          "batched records: expected a leading batch axis; got a 0-d array."
          " Fix: stack records with jnp.stack(records).")
    shape = shape[1:]
    if test.shape[0] == 0:
      raise PeatError("batched records: the batch axis is empty (0 records);"
                      " expected at least 1. Fix: skip empty batches.")
  if math.prod(shape) == 0:
    raise PeatError(
        f"record shape {shape} has no elements; expected at least 1. Fix: "
        "skip sites whose output is empty.")
  if math.prod(shape) >= 2**31 - 1:
    raise PeatError(
        f"record of {math.prod(shape)} elements; expected < 2**31 - 1 (int32"
        " counts). Fix: analyze the record in slices (stream them with "
        "signature_update).")
  return shape, dt


def _split_reference(reference, shape, *, batched: bool):
  """Returns (hi, lo) float32 double-float of the float64 reference."""
  r = np.asarray(jax.device_get(reference))
  if not (np.issubdtype(r.dtype, np.floating) or r.dtype == jnp.bfloat16):
    raise PeatError(
        f"reference has dtype {r.dtype}; expected a floating-point array "
        "(float64). Fix: compute it with the peat_jax reference helpers.")
  r = r.astype(np.float64)
  want = tuple(shape)
  got = tuple(r.shape[1:]) if batched else tuple(r.shape)
  if got != want:
    raise PeatError(
        f"reference record shape {got} != test shape {want}; expected equal."
        " Fix: compute the reference from the same site's inputs.")
  with np.errstate(over="ignore", invalid="ignore"):
    hi = r.astype(np.float32)
    lo = (r - hi.astype(np.float64)).astype(np.float32)
    lo = np.where(np.isfinite(lo), lo, np.float32(0))
  return hi, lo


# --------------------------------------------------------------------------
# Element-wise helpers (traced).
# --------------------------------------------------------------------------


def _uint(dtype):
  return {16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint64}[_bits_of(dtype)]


def _sint(dtype):
  return {16: jnp.int16, 32: jnp.int32, 64: jnp.int64}[_bits_of(dtype)]


def _from_bits(u: Array, dtype) -> Array:
  """Values of dtype `dtype` from their unsigned bit patterns."""
  return lax.bitcast_convert_type(u, dtype)


def _words(x: Array) -> list[Array]:
  """Splits unsigned bit patterns into uint32 words (low word first)."""
  if x.dtype == jnp.uint64:
    return [(x & jnp.uint64(0xFFFFFFFF)).astype(jnp.uint32),
            (x >> jnp.uint64(32)).astype(jnp.uint32)]
  return [x.astype(jnp.uint32)]


def _ordered(bits_s: Array) -> Array:
  """Maps signed bit patterns to integers monotone in the float value."""
  nbits = bits_s.dtype.itemsize * 8
  mag = bits_s & jnp.array((1 << (nbits - 1)) - 1, bits_s.dtype)
  return jnp.where(bits_s < 0, -mag, mag)


def _hash32(u: Array, mul: int, add: int) -> Array:
  """A 32-bit integer mixing function of uint32 words (murmur-like)."""
  h = u * jnp.uint32(mul) + jnp.uint32(add)
  h = h ^ (h >> 15)
  h = h * jnp.uint32(0x2C1B3C6D)
  h = h ^ (h >> 12)
  return h


# NARROW_FORMATS as (mantissa bits, smallest and largest normal exponent,
# largest significand at the largest exponent as a (mantissa bits + 1)-bit
# integer: all ones, but 1.110b for e4m3fn, whose 1.111b is NaN); tf32 is
# 10 mantissa bits with float32's range.
_NARROW_SPECS = {
    "bf16": (7, -126, 127, 255),
    "fp16": (10, -14, 15, 2047),
    "tf32": (10, -126, 127, 2047),
    "fp8_e4m3": (3, -6, 8, 14),
    "fp8_e5m2": (2, -14, 15, 7),
}


def _mix32(u: Array) -> Array:
  """One multiply-xorshift round on uint32 words (the multiset hash's mix)."""
  h = (u ^ (u >> 16)) * jnp.uint32(0x45D9F3B)
  return h ^ (h >> 16)


def _representable(u: Array, dtype) -> list[Array]:
  """Per NARROW_FORMATS: the value with bit pattern u is exactly representable.

  Exact, in integer arithmetic on the bit pattern (a float round trip and
  comparison would be blurred by XLA:CPU's denormal flushing): x is finite
  and either +-0, or the lowest set bit of x's significand is at or above
  the format's resolution at x (its highest set bit minus the format's
  mantissa bits, never below the format's smallest subnormal) and x is at
  most the format's maximum. The rule of `Representable` in
  csrc/signature.h. Takes bit patterns that do not come from float
  arithmetic of the same XLA fusion (see `_accumulate_bits`).

  Args:
    u: unsigned bit patterns of values of float dtype `dtype`.
    dtype: the values' dtype.

  Returns:
    A list of 5 bool arrays shaped like u.
  """
  dtype = np.dtype(dtype)
  finfo = jnp.finfo(dtype)
  nbits = _bits_of(dtype)
  nmant = finfo.nmant
  bias = finfo.maxexp - 1
  ut = u.dtype
  si = jnp.int32
  mag = u & jnp.array((1 << (nbits - 1)) - 1, ut)
  expf = (mag >> jnp.array(nmant, ut)).astype(si)
  man = mag & jnp.array((1 << nmant) - 1, ut)
  normal = expf != 0
  sig = jnp.where(normal, man | jnp.array(1 << nmant, ut), man)
  q = jnp.where(normal, expf, 1) - (bias + nmant)
  low = q + lax.population_count((sig & (~sig + jnp.array(1, ut))) -
                                 jnp.array(1, ut)).astype(si)
  span = (nbits - 1) - lax.clz(sig).astype(si)  # highest set bit of sig
  high = q + span
  finite = expf != (2 * bias + 1)
  zero = mag == 0
  out = []
  for fmt in NARROW_FORMATS:
    m, emin, emax, max_top = _NARROW_SPECS[fmt]
    shift = span - m
    top = jnp.where(shift >= 0,
                    sig >> jnp.maximum(shift, 0).astype(ut),
                    sig << jnp.maximum(-shift, 0).astype(ut))
    in_range = (high < emax) | ((high == emax) &
                                (top <= jnp.array(max_top, ut)))
    fits = in_range & (low >= jnp.maximum(high - m, emin - m))
    out.append(finite & (zero | fits))
  return out


def _div_by_max(a: Array, m: Array) -> Array:
  """a / m for 0 <= a <= m (m broadcast against a), safe for any m.

  XLA rewrites a division by a broadcast into a multiplication by its
  reciprocal, which is subnormal (flushed to zero on CPU) for m >= 2**126.
  So a and m are first scaled by two exact powers of two that bring m into
  [1, 2); 0 where m is 0.
  """
  finfo = jnp.finfo(m.dtype)
  uint = {4: jnp.uint32, 8: jnp.uint64}[m.dtype.itemsize]
  sint = {4: jnp.int32, 8: jnp.int64}[m.dtype.itemsize]
  bias = finfo.maxexp - 1
  expo = ((lax.bitcast_convert_type(m, uint) >> finfo.nmant).astype(sint) &
          (2 * bias + 1)) - bias
  lo = expo // 2
  hi = expo - lo

  def pow2(k):  # 2**-k, k in [-64, 64]: a normal number
    return lax.bitcast_convert_type(((bias - k).astype(uint)) << finfo.nmant,
                                    m.dtype)

  s1, s2 = pow2(lo), pow2(hi)
  mn = (m * s1) * s2
  return jnp.where(m > 0, ((a * s1) * s2) / jnp.where(m > 0, mn, 1.0), 0.0)


def _row_scaled_sumsq(a: Array, axis: int) -> tuple[Array, Array]:
  """(max, sum((a / max)**2)) along `axis` of a nonnegative finite array."""
  m = jnp.max(a, axis=axis)
  s = jnp.sum(jnp.square(_div_by_max(a, jnp.expand_dims(m, axis))),
              axis=axis)
  return m, s


def _combine_scaled(m: Array, s: Array) -> tuple[Array, Array]:
  """Reduces per-row (max, scaled sumsq) vectors to scalars."""
  mm = jnp.max(m)
  f = _div_by_max(m, mm)
  return mm, jnp.sum(s * f * f)


def _merge_scaled(m1, s1, m2, s2):
  mm = jnp.maximum(m1, m2)
  safe = jnp.where(mm > 0, mm, 1.0)
  f1 = jnp.where(mm > 0, m1 / safe, 0.0)
  f2 = jnp.where(mm > 0, m2 / safe, 0.0)
  return mm, s1 * f1 * f1 + s2 * f2 * f2


def _hist_index(v: Array) -> Array:
  """Bucket of a nonnegative float32 value: bit pattern >> 21."""
  b = lax.bitcast_convert_type(v.astype(jnp.float32), jnp.uint32)
  return (b >> 21).astype(jnp.int32)


def _sample_index(n: int) -> np.ndarray | None:
  """Jittered stratified sample of PCT_SAMPLE indices (None: use all)."""
  if n <= PCT_SAMPLE:
    return None
  w = n // PCT_SAMPLE
  k = np.arange(PCT_SAMPLE, dtype=np.uint64)
  h = (k * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & np.uint64(
      0xFFFFFFFF)
  h ^= h >> np.uint64(15)
  h = (h * np.uint64(0x2C1B3C6D)) & np.uint64(0xFFFFFFFF)
  h ^= h >> np.uint64(12)
  return (k * np.uint64(w) + h % np.uint64(w)).astype(np.int32)


# --------------------------------------------------------------------------
# The accumulation pass.
# --------------------------------------------------------------------------


def _element_words(ut: Array, ug: Array,
                   dtype) -> tuple[list[Array], list[Array]]:
  """Per-element uint32 words whose per-bit counts give the exact counts.

  Takes the bit patterns `ut`, `ug` of records of dtype `dtype` (see
  `_accumulate_bits` for why not the values).

  Returns (words, hash_words): words = [flags, up..., down..., ulp...] where
  `flags` packs the _F_* conditions, `up`/`down` are the bits forced to 1/0
  (two words each for float64) and `ulp` is the smeared ULP distance (bit k
  set iff distance >= 2**k); hash_words are 4 order-free hash terms.
  """
  nbits = _bits_of(dtype)
  cdt = jnp.float64 if dtype == jnp.float64 else jnp.float32
  finfo = jnp.finfo(dtype)
  fmax = jnp.asarray(finfo.max, cdt)
  t = _from_bits(ut, dtype)
  g = _from_bits(ug, dtype)
  st = lax.bitcast_convert_type(ut, _sint(dtype))
  sg = lax.bitcast_convert_type(ug, _sint(dtype))
  tc = t.astype(cdt)
  gc = g.astype(cdt)
  fin_t = jnp.isfinite(t)
  fin_g = jnp.isfinite(g)
  fp = fin_t & fin_g
  d = jnp.where(fp, tc - gc, 0.0)
  at = jnp.abs(tc)
  ag = jnp.abs(gc)
  # Zero and subnormal tests use bit patterns: XLA on CPU flushes subnormal
  # operands of float comparisons and arithmetic to zero.
  # Shifts, not masks: LLVM turns `bits & 0x7f..f` back into fabs().
  one = jnp.array(1, ut.dtype)
  sh_e = jnp.array(finfo.nmant + 1, ut.dtype)
  t0 = (ut << one) == 0
  g0 = (ug << one) == 0
  gexp = (ug << one) >> sh_e
  gsub = (gexp == 0) & ~g0
  gnorm = fin_g & (gexp != 0)
  f = [None] * _N_FLAGS
  f[_F_BIT_EQUAL] = ut == ug
  f[_F_VALUE_EQUAL] = ((ut == ug) & ~jnp.isnan(t)) | (t0 & g0)
  f[_F_NAN_T] = jnp.isnan(t)
  f[_F_NAN_G] = jnp.isnan(g)
  f[_F_INF_T] = jnp.isinf(t)
  f[_F_INF_G] = jnp.isinf(g)
  f[_F_FINITE_PAIR] = fp
  f[_F_NONFINITE_NEW] = fin_g & ~fin_t
  f[_F_ZEROED] = fin_g & ~g0 & t0
  f[_F_FLUSHED] = gsub & t0
  f[_F_SATURATED] = fin_g & (ag < fmax) & (jnp.isinf(t) | (at == fmax))
  f[_F_SAT_FP16] = fp & (at == 65504.0) & (ag > 65504.0)
  f[_F_SAT_E4M3] = fp & (at == 448.0) & (ag > 448.0)
  f[_F_GOLDEN_SUBNORMAL] = gsub
  f[_F_POS_ERR] = d > 0
  f[_F_NEG_ERR] = d < 0
  f[_F_MAG_LARGER] = fp & (at > ag)
  f[_F_MAG_SMALLER] = fp & (at < ag)
  f[_F_SIGN_FLIP] = fp & ~t0 & ~g0 & ((st < 0) != (sg < 0))
  f[_F_RATIO_OK] = fp & gnorm & ~t0
  f[_F_LOG_OK] = fp & (d != 0) & ~g0
  f[_F_GOLDEN_ZERO] = g0
  f[_F_OVERFLOW] = fin_g & jnp.isinf(t) & (ag > 448.0)
  flags = jnp.zeros(t.shape, jnp.uint32)
  for k, x in enumerate(f):
    flags = flags | (x.astype(jnp.uint32) << k)
  # ULP distance, smeared: bit k set iff distance >= 2**k.
  ot = _ordered(st)
  og = _ordered(sg)
  uu = _uint(dtype)
  if nbits == 16:
    ulp = jnp.abs(ot.astype(jnp.int32) - og.astype(jnp.int32)).astype(
        jnp.uint32)
  else:
    ulp = jnp.where(ot >= og, ot.astype(uu) - og.astype(uu),
                    og.astype(uu) - ot.astype(uu))
  ulp = jnp.where(fp, ulp, jnp.zeros((), ulp.dtype))
  sh = 1
  while sh < nbits:
    ulp = ulp | (ulp >> sh)
    sh *= 2
  words = [flags] + _words(ut & ~ug) + _words(ug & ~ut) + _words(ulp)
  hw = []
  for u in (ut, ug):
    ws = _words(u)
    w = ws[0] if len(ws) == 1 else ws[0] ^ _hash32(ws[1], 0x27D4EB2F, 7)
    # The mixed and the plain pattern (both summed with wrap-around).
    hw += [_mix32(w), w]
  return words, hw


_FLOAT_OPS = {
    "err_sum": "add", "mag_err_sum": "add", "rel_sum": "add", "rel": "ss",
    "g": "ss", "ratio_min": "min", "ratio_max": "max", "logratio_sum": "add",
    "sx": "add", "sy": "add", "sxy": "add", "sxx": "add", "syy": "add",
}


def _element_floats(ut: Array, ug: Array, dtype) -> dict[str, Array]:
  """Per-element float quantities reduced by the statistics pass.

  Takes bit patterns, as `_element_words`.

  Keys as in _FLOAT_OPS: "add" ones are summed, "min"/"max" reduced, "ss"
  ones kept as (max, scaled sum of squares).
  """
  cdt = jnp.float64 if dtype == jnp.float64 else jnp.float32
  finfo = jnp.finfo(dtype)
  tiny = jnp.asarray(finfo.tiny, cdt)
  big = jnp.asarray(jnp.finfo(cdt).max, cdt)
  t = _from_bits(ut, dtype)
  g = _from_bits(ug, dtype)
  tc = t.astype(cdt)
  gc = g.astype(cdt)
  fp = jnp.isfinite(t) & jnp.isfinite(g)
  d = jnp.where(fp, tc - gc, 0.0)
  ad = jnp.minimum(jnp.abs(d), big)
  at = jnp.abs(tc)
  ag = jnp.abs(gc)
  rel = jnp.where(fp, jnp.minimum(ad / jnp.maximum(ag, tiny), big), 0.0)
  one = jnp.array(1, ut.dtype)
  sh_e = jnp.array(finfo.nmant + 1, ut.dtype)
  ratio_ok = fp & (((ug << one) >> sh_e) != 0) & ((ut << one) != 0)
  log_ok = fp & (d != 0) & ((ug << one) != 0)
  ratio = jnp.where(ratio_ok, tc / jnp.where(ratio_ok, gc, 1.0), 0.0)
  lr = jnp.where(ratio_ok, jnp.log2(jnp.where(ratio_ok, at, 1.0)) -
                 jnp.log2(jnp.where(ratio_ok, ag, 1.0)), 0.0)
  x = jnp.where(log_ok, jnp.log2(jnp.where(log_ok, ag, 1.0)), 0.0)
  y = jnp.where(log_ok, jnp.log2(jnp.where(log_ok, ad, 1.0)), 0.0)
  return dict(
      err_sum=d, mag_err_sum=jnp.where(gc < 0, -rel, rel) * jnp.sign(d),
      rel_sum=rel, rel=rel, g=jnp.where(fp, ag, 0.0),
      ratio_min=jnp.where(ratio_ok, ratio, jnp.inf),
      ratio_max=jnp.where(ratio_ok, ratio, -jnp.inf), logratio_sum=lr,
      sx=x, sy=y, sxy=x * y, sxx=x * x, syy=y * y)


def _float_init(shape, cdt):
  out = {}
  for k, op in _FLOAT_OPS.items():
    z = jnp.zeros(shape, cdt)
    out[k] = {"add": z, "min": z + jnp.inf, "max": z - jnp.inf,
              "ss": (z, z)}[op]
  return out


def _float_update(acc, vals):
  """Element-wise accumulation (no reduction) of _element_floats values."""
  out = {}
  for k, op in _FLOAT_OPS.items():
    a, x = acc[k], vals[k]
    if op == "add":
      out[k] = a + x
    elif op == "min":
      out[k] = jnp.minimum(a, x)
    elif op == "max":
      out[k] = jnp.maximum(a, x)
    else:
      m, s = a
      m2 = jnp.maximum(m, x)
      safe = jnp.where(m2 > 0, m2, 1.0)
      out[k] = (m2, s * jnp.square(m / safe) + jnp.square(x / safe))
  return out


def _float_reduce(acc, *, scaled: bool):
  """Reduces accumulators (or raw values if not `scaled`) to scalars."""
  out = {}
  for k, op in _FLOAT_OPS.items():
    a = acc[k]
    if op == "add":
      out[k] = jnp.sum(a)
    elif op == "min":
      out[k] = jnp.min(a)
    elif op == "max":
      out[k] = jnp.max(a)
    elif scaled:
      out[k] = _combine_scaled(a[0].reshape(-1), a[1].reshape(-1))
    else:
      out[k] = _row_scaled_sumsq(a.reshape(-1), 0)
  return out


def _float_merge(a, b):
  out = {}
  for k, op in _FLOAT_OPS.items():
    if op == "add":
      out[k] = a[k] + b[k]
    elif op == "min":
      out[k] = jnp.minimum(a[k], b[k])
    elif op == "max":
      out[k] = jnp.maximum(a[k], b[k])
    else:
      out[k] = _merge_scaled(a[k][0], a[k][1], b[k][0], b[k][1])
  return out


#: Words per lane added per step of the counting scan (bit-sliced CSA tree).
_GROUP = 16
#: Lanes (elements side by side) of the counting scan; its planes stay in cache.
_WIDTH = 1024


def _csa_add(a: list[Array], b: list[Array]) -> list[Array]:
  """Adds two bit-sliced counters (lists of planes, LSB first)."""
  if len(a) < len(b):
    a, b = b, a
  out, carry = [], None
  for i, x in enumerate(a):
    y = b[i] if i < len(b) else None
    if y is None and carry is None:
      out.append(x)
      continue
    if y is None:
      out.append(x ^ carry)
      carry = x & carry
    elif carry is None:
      out.append(x ^ y)
      carry = x & y
    else:
      xy = x ^ y
      out.append(xy ^ carry)
      carry = (x & y) | (carry & xy)
  if carry is not None:
    out.append(carry)
  return out


def _csa_tree(words: list[Array]) -> list[Array]:
  """Bit-sliced sum of 1-bit counters: per bit position, how many are set."""
  cs = [[w] for w in words]
  while len(cs) > 1:
    nxt = [_csa_add(cs[i], cs[i + 1]) for i in range(0, len(cs) - 1, 2)]
    if len(cs) % 2:
      nxt.append(cs[-1])
    cs = nxt
  return cs[0]


def _accumulate_planes(acc: tuple[Array, ...], add: list[Array]):
  """acc += add for bit-sliced counters; acc has fixed length (no overflow)."""
  out, carry = [], None
  for i, p in enumerate(acc):
    y = add[i] if i < len(add) else None
    if y is None and carry is None:
      out.append(p)
    elif y is None:
      out.append(p ^ carry)
      carry = p & carry
    elif carry is None:
      out.append(p ^ y)
      carry = p & y
    else:
      py = p ^ y
      out.append(py ^ carry)
      carry = (p & y) | (carry & py)
  return tuple(out)


def _plane_counts(planes: tuple[Array, ...]) -> Array:
  """int32[32] per-bit totals of a bit-sliced counter of (width,) planes."""
  shifts = jnp.arange(32, dtype=jnp.uint32)
  total = jnp.zeros((32,), jnp.int32)
  for l, p in enumerate(planes):
    c = jnp.sum(((p[:, None] >> shifts) & 1).astype(jnp.int32), axis=0,
                dtype=jnp.int32)
    total = total + (c << l)
  return total


def _count_pass(t: Array, g: Array, dtype):
  """Exact per-bit counts of `_element_words` over flat t, g (one pass).

  `t`, `g` are the records' bit patterns (unsigned), of dtype `dtype`.

  Carry-save (bit-sliced) counting: a `lax.scan` takes _GROUP x _WIDTH
  elements per step, adds the _GROUP words of each lane with a tree of
  bitwise full adders (per bit position, all 32 at once), and adds that
  small count into per-word accumulators of L bit planes (plane l holds
  bit l of each lane's count). Only bitwise element-wise operations run in
  the loop; the planes are reduced once at the end. Elements that do not
  fill a step are counted directly.

  Returns:
    flags int32[32], bits_up int32[nbits], bits_down int32[nbits],
    ulp_cum int32[nbits], hash_t uint32[2], hash_g uint32[2], and the
    reduced `_element_floats` (dict; "ss" entries as (max, scaled sumsq)).
  """
  n = t.shape[0]
  nbits = _bits_of(dtype)
  # Small records use narrower steps (powers of two, 32 .. _WIDTH lanes).
  width = _WIDTH
  while width > 32 and _GROUP * width * 16 > n:
    width //= 2
  per_step = _GROUP * width
  steps = n // per_step
  main = steps * per_step
  k = 2 if nbits == 64 else 1
  nw = 1 + 3 * k
  nplanes = max(1, int(math.ceil(math.log2(_GROUP * (steps + 1) + 1))))
  zero = jnp.zeros((width,), jnp.uint32)
  planes = tuple(tuple(zero for _ in range(nplanes)) for _ in range(nw))
  hsum = [jnp.uint32(0)] * 4

  def add_block(planes, ws):
    out = []
    for i, w in enumerate(ws):
      cnt = _csa_tree([w[j] for j in range(_GROUP)])
      out.append(_accumulate_planes(planes[i], cnt))
    return tuple(out)

  cdt = jnp.float64 if dtype == jnp.float64 else jnp.float32
  fl = None
  if steps == 1:
    tb, gb = t[:main].reshape(_GROUP, width), g[:main].reshape(_GROUP, width)
    ws, hw = _element_words(tb, gb, dtype)
    planes = add_block(planes, ws)
    hsum = [jnp.sum(x, dtype=jnp.uint32) for x in hw]
    fl = _float_reduce(_element_floats(tb, gb, dtype), scaled=False)
  elif steps:

    def body(acc, tg):
      planes, hsh, facc = acc
      ws, hw = _element_words(*tg, dtype)  # each (_GROUP, width)
      hsh = tuple(h + jnp.sum(x, axis=0, dtype=jnp.uint32)
                  for h, x in zip(hsh, hw))
      facc = _float_update(facc, _element_floats(*tg, dtype))
      return (add_block(planes, ws), hsh, facc), None

    init = (planes, tuple(zero for _ in range(4)),
            _float_init((_GROUP, width), cdt))
    (planes, hsh, facc), _ = lax.scan(
        body, init,
        (t[:main].reshape(steps, _GROUP, width),
         g[:main].reshape(steps, _GROUP, width)))
    hsum = [jnp.sum(h, dtype=jnp.uint32) for h in hsh]
    fl = _float_reduce(facc, scaled=True)
  if main < n:
    # The tail's words, zero-padded to one block (zero words count nothing).
    ws, hw = _element_words(t[main:], g[main:], dtype)
    ws = [jnp.pad(w, (0, per_step - (n - main))).reshape(_GROUP, width)
          for w in ws]
    planes = add_block(planes, ws)
    hsum = [a + jnp.sum(x, dtype=jnp.uint32) for a, x in zip(hsum, hw)]
    ft = _float_reduce(_element_floats(t[main:], g[main:], dtype),
                       scaled=False)
    fl = ft if fl is None else _float_merge(fl, ft)
  per_word = [_plane_counts(p) for p in planes]
  flags = per_word[0]

  def cat(ws):
    return jnp.concatenate(ws)[:nbits]

  bits_up = cat(per_word[1:1 + k])
  bits_down = cat(per_word[1 + k:1 + 2 * k])
  ulp_cum = cat(per_word[1 + 2 * k:1 + 3 * k])
  return (flags, bits_up, bits_down, ulp_cum, jnp.stack(hsum[:2]),
          jnp.stack(hsum[2:]), fl)


def _view2d(shape) -> tuple[int, int]:
  if len(shape) <= 1:
    return 1, int(math.prod(shape))
  return int(math.prod(shape[:-1])), int(shape[-1])


def _shift_tests(tb: Array, gb: Array, rows: int, cols: int):
  """Bitwise match counts of t against shifted/transposed g (sampled rows).

  Two static gathers (no Python loop in the traced graph): g at every
  column shift of the sampled rows, and g's rows at every row shift. Only
  informative positions are compared: t differs from g there (bitwise) and
  is not +-0. Equal elements say nothing about where t's values came from,
  and on sparse arrays (a gradient that is zero but for a few rows) equal
  zeros would match any shift; a KUT that zeroes elements is not a shift.
  """
  cw = min(cols, SHIFT_WINDOW)
  nsamp = min(rows, SHIFT_SAMPLE_ROWS, max(2, -(-SHIFT_WINDOW // cw)))
  ridx = np.unique(np.linspace(0, rows - 1, nsamp).round().astype(np.int64))
  shifts = np.arange(-SHIFT_RANGE, SHIFT_RANGE + 1)
  ts = tb[ridx][:, :cw]  # (S, cw)
  gs = gb[ridx]
  # Informative positions: t != g bitwise and t not +-0 (sign bit dropped).
  inf = (ts != gs[:, :cw]) & ((ts << 1) != 0)  # (S, cw)
  # Columns: t[i, j] vs g[i, j - s].
  src = np.arange(cw)[None, :] - shifts[:, None]  # (17, cw)
  ok = (src >= 0) & (src < cols)
  gsh = gs[:, np.clip(src, 0, cols - 1)]  # (S, 17, cw)
  cmp_c = inf[:, None, :] & ok[None]
  col_m = jnp.sum((ts[:, None, :] == gsh) & cmp_c, axis=(0, 2),
                  dtype=jnp.int32)
  col_n = jnp.sum(cmp_c, axis=(0, 2), dtype=jnp.int32)
  # Rows: t[i, j] vs g[i - s, j].
  rsrc = ridx[None, :] - shifts[:, None]  # (17, S)
  rok = (rsrc >= 0) & (rsrc < rows)
  grs = gb[np.clip(rsrc, 0, rows - 1)][:, :, :cw]  # (17, S, cw)
  cmp_r = inf[None] & rok[:, :, None]
  row_m = jnp.sum((ts[None] == grs) & cmp_r, axis=(1, 2), dtype=jnp.int32)
  row_n = jnp.sum(cmp_r, axis=(1, 2), dtype=jnp.int32)
  if rows == cols and rows > 1:
    gt = gb[:cw, ridx].T  # g[j, i] for sampled i, j < cw
    tr_m = jnp.sum((ts == gt) & inf, dtype=jnp.int32)
    tr_n = jnp.sum(inf, dtype=jnp.int32)
  else:
    tr_m, tr_n = jnp.int32(0), jnp.int32(0)
  return col_m, col_n, row_m, row_n, tr_m, tr_n


def _sampled_stats(ut: Array, ug: Array, dtype) -> dict[str, Array]:
  """Percentile histograms and representability of the sampled elements.

  The sample is `_sample_index(n)` (all elements when n <= PCT_SAMPLE);
  |d| and rel are computed on it with the formulas of `_accumulate`.

  Args:
    ut: bit patterns of the test record (see `_accumulate_bits`).
    ug: bit patterns of the golden record, same shape.
    dtype: the records' float dtype.

  Returns:
    hist_abs, hist_rel, pct_n, sample_n, repr_t, repr_g (SignatureState
    fields).
  """
  cdt = jnp.float64 if dtype == jnp.float64 else jnp.float32
  tiny = jnp.asarray(jnp.finfo(dtype).tiny, cdt)
  big = jnp.asarray(jnp.finfo(cdt).max, cdt)
  ut_f, ug_f = ut.reshape(-1), ug.reshape(-1)
  idx = _sample_index(ut_f.shape[0])
  if idx is not None:
    ut_f, ug_f = ut_f[idx], ug_f[idx]
  t_f, g_f = _from_bits(ut_f, dtype), _from_bits(ug_f, dtype)
  fp_f = jnp.isfinite(t_f) & jnp.isfinite(g_f)
  d = jnp.where(fp_f, t_f.astype(cdt) - g_f.astype(cdt), 0.0)
  ad_f = jnp.minimum(jnp.abs(d), big)
  rel_f = jnp.where(
      fp_f, jnp.minimum(ad_f / jnp.maximum(jnp.abs(g_f.astype(cdt)), tiny),
                        big), 0.0)
  hw = fp_f.astype(jnp.int32)
  return dict(
      hist_abs=jnp.zeros((HIST_BUCKETS,), jnp.int32).at[
          _hist_index(ad_f)].add(hw),
      hist_rel=jnp.zeros((HIST_BUCKETS,), jnp.int32).at[
          _hist_index(rel_f)].add(hw),
      pct_n=jnp.sum(hw, dtype=jnp.int32),
      sample_n=jnp.int32(t_f.shape[0]),
      repr_t=jnp.stack([jnp.sum(r, dtype=jnp.int32)
                        for r in _representable(ut_f, dtype)]),
      repr_g=jnp.stack([jnp.sum(r, dtype=jnp.int32)
                        for r in _representable(ug_f, dtype)]))


def _accumulate(t: Array, g: Array, ref_hi: Array | None,
                ref_lo: Array | None) -> SignatureState:
  """One record -> SignatureState (pure JAX). Pure; shapes are static."""
  hi_bits = None
  if ref_hi is not None:
    hi_bits = lax.bitcast_convert_type(ref_hi.astype(jnp.float32), jnp.uint32)
  return _accumulate_bits(lax.bitcast_convert_type(t, _uint(t.dtype)),
                          lax.bitcast_convert_type(g, _uint(g.dtype)),
                          hi_bits, ref_lo, t.dtype)


def _accumulate_bits(ut: Array, ug: Array, ref_hi_bits: Array | None,
                     ref_lo: Array | None, dtype) -> SignatureState:
  """One record, given as bit patterns, -> SignatureState (pure JAX).

  The zero and subnormal tests are integer tests of the bit patterns. When
  the same XLA:CPU fusion also does float arithmetic on the values bitcast
  from them, LLVM may rewrite such a test into a float comparison, which
  XLA:CPU's denormal flushing then answers "zero" for a subnormal. Passing
  bit patterns that come from a separate executable (`_bits_jit`) rules
  that out; `_accumulate` (traced, e.g. on GPU, where nothing is flushed)
  bitcasts in place.

  Args:
    ut: unsigned bit patterns of the test record.
    ug: unsigned bit patterns of the golden record.
    ref_hi_bits: optional uint32 bit patterns of the float32 high part of the
      reference (its sign and zero tests are bit tests too).
    ref_lo: optional float32 low part.
    dtype: the records' float dtype.

  Returns:
    The `SignatureState`.
  """
  dtype = np.dtype(dtype)
  cdt = jnp.float64 if dtype == jnp.float64 else jnp.float32
  finfo = jnp.finfo(dtype)
  cfinfo = jnp.finfo(cdt)
  tiny = jnp.asarray(finfo.tiny, cdt)
  big = jnp.asarray(cfinfo.max, cdt)
  shape = ut.shape
  n = int(math.prod(shape))
  rows, cols = _view2d(shape)
  ut = ut.reshape(rows, cols)
  ug = ug.reshape(rows, cols)
  t = _from_bits(ut, dtype)
  g = _from_bits(ug, dtype)
  tc = t.astype(cdt)
  gc = g.astype(cdt)

  fin_t = jnp.isfinite(t)
  fin_g = jnp.isfinite(g)
  fp = fin_t & fin_g
  bit_eq = ut == ug
  differ = ~bit_eq
  d = jnp.where(fp, tc - gc, 0.0)
  ad = jnp.minimum(jnp.abs(d), big)
  ag = jnp.abs(gc)
  rel = jnp.minimum(ad / jnp.maximum(ag, tiny), big)
  rel = jnp.where(fp, rel, 0.0)

  flags, bits_up, bits_down, ulp_cum, hash_t, hash_g, fl = _count_pass(
      ut.reshape(-1), ug.reshape(-1), dtype)
  rel_max, rel_sqs = fl["rel"]
  g_absmax, g_sqs = fl["g"]

  # Rows.
  row_ndiff = jnp.sum(differ, axis=1, dtype=jnp.int32)
  row_abs_max, row_abs_sqs = _row_scaled_sumsq(ad, 1)
  row_abs_sum = jnp.sum(ad, axis=1)
  # Columns.
  col_ndiff = jnp.sum(differ, axis=0, dtype=jnp.int32)
  col_abs_sum = jnp.sum(ad, axis=0)
  # Tiles (8x8 over the aligned top-left part).
  r8, c8 = rows // 8, cols // 8
  if r8 and c8:
    tile_ndiff = jnp.sum(
        differ[:r8 * 8, :c8 * 8].reshape(r8, 8, c8, 8), axis=(1, 3),
        dtype=jnp.int32)
  else:
    tile_ndiff = jnp.zeros((r8, c8), jnp.int32)

  slope_sums = jnp.stack([fl[k] for k in ("sx", "sy", "sxy", "sxx", "syy")])

  shifts = _shift_tests(ut, ug, rows, cols)

  sampled = _sampled_stats(ut, ug, dtype)

  # Reference (double-float r = hi + lo, float32 halves).
  if ref_hi_bits is not None:
    hb = ref_hi_bits.reshape(rows, cols)
    hi = lax.bitcast_convert_type(hb, jnp.float32).astype(cdt)
    lo = ref_lo.reshape(rows, cols).astype(cdt)
    ok = fp & jnp.isfinite(hi)
    et = jnp.where(ok, jnp.minimum(jnp.abs((tc - hi) - lo), big), 0.0)
    eg = jnp.where(ok, jnp.minimum(jnp.abs((gc - hi) - lo), big), 0.0)
    den = jnp.maximum(jnp.abs(hi), tiny)
    m1, s1 = _row_scaled_sumsq(et, 1)
    ref_t_max, ref_t_sqs = _combine_scaled(m1, s1)
    m2, s2 = _row_scaled_sumsq(eg, 1)
    ref_g_max, ref_g_sqs = _combine_scaled(m2, s2)
    ref = dict(
        ref_steps=jnp.int32(1), ref_n=jnp.sum(ok, dtype=jnp.int32),
        ref_t_max=ref_t_max, ref_t_sqs=ref_t_sqs, ref_g_max=ref_g_max,
        ref_g_sqs=ref_g_sqs,
        # Only where t, g, r are finite (den is NaN where r is).
        ref_t_rel_sum=jnp.sum(jnp.where(ok, jnp.minimum(et / den, big), 0.0)),
        ref_g_rel_sum=jnp.sum(jnp.where(ok, jnp.minimum(eg / den, big), 0.0)),
        ref_t_closer=jnp.sum(ok & (et < eg), dtype=jnp.int32),
        ref_g_closer=jnp.sum(ok & (eg < et), dtype=jnp.int32))
    # Direction of each side's error relative to r: toward zero (|x| < |r|)
    # or away from it. Round toward zero moves every element toward zero.
    # r's sign and zero tests use its high part's bits (exact for subnormal
    # parts, which float comparisons under flushing would read as zero).
    r_nonzero = (hb << jnp.uint32(1)) != 0
    pos = r_nonzero & ((hb >> jnp.uint32(31)) == 0)
    for side, x in (("t", tc), ("g", gc)):
      dx = (x - hi) - lo
      moved = ok & r_nonzero & (dx != 0)
      ref[f"ref_{side}_shrunk"] = jnp.sum(moved & ((dx < 0) == pos),
                                          dtype=jnp.int32)
      ref[f"ref_{side}_grown"] = jnp.sum(moved & ((dx > 0) == pos),
                                         dtype=jnp.int32)
  else:
    z = jnp.zeros((), cdt)
    zi = jnp.int32(0)
    ref = dict(ref_steps=zi, ref_n=zi, ref_t_max=z,
               ref_t_sqs=z, ref_g_max=z, ref_g_sqs=z, ref_t_rel_sum=z,
               ref_g_rel_sum=z, ref_t_closer=zi, ref_g_closer=zi,
               ref_t_shrunk=zi, ref_t_grown=zi, ref_g_shrunk=zi,
               ref_g_grown=zi)
  # The elements counted in n_zeroed (bit tests: t is +-0, g finite, not 0).
  one = jnp.array(1, ut.dtype)
  zeroed = fin_g & ((ug << one) != 0) & ((ut << one) == 0)
  ref["zeroed_g_max"] = jnp.max(jnp.where(zeroed, jnp.abs(gc), 0.0))

  return SignatureState(
      steps=jnp.int32(1), dtype_code=jnp.int32(
          _DTYPE_CODE[_SUPPORTED[np.dtype(dtype)]]), n=jnp.int32(n), flags=flags, bits_up=bits_up,
      bits_down=bits_down, ulp_cum=ulp_cum, row_ndiff=row_ndiff,
      row_abs_max=row_abs_max, row_abs_sum=row_abs_sum,
      row_abs_sqs=row_abs_sqs, col_ndiff=col_ndiff, col_abs_sum=col_abs_sum,
      tile_ndiff=tile_ndiff, err_sum=fl["err_sum"],
      mag_err_sum=fl["mag_err_sum"], rel_max=rel_max,
      rel_sum=fl["rel_sum"], rel_sqs=rel_sqs, g_absmax=g_absmax, g_sqs=g_sqs,
      ratio_min=fl["ratio_min"], ratio_max=fl["ratio_max"],
      logratio_sum=fl["logratio_sum"],
      slope_sums=slope_sums, hash_t=hash_t, hash_g=hash_g,
      shift_col_match=shifts[0], shift_col_n=shifts[1],
      shift_row_match=shifts[2], shift_row_n=shifts[3],
      transpose_match=shifts[4], transpose_n=shifts[5], **sampled, **ref)


# Float outputs of the native pass, in the order of csrc/signature.h.
_NATIVE_FLOATS = (
    "err_sum", "mag_err_sum", "rel_max", "rel_sum", "rel_sqs", "g_absmax",
    "g_sqs", "ratio_min", "ratio_max", "logratio_sum", "sx", "sy", "sxy",
    "sxx", "syy", "zeroed_g_max", "ref_t_max", "ref_t_sqs", "ref_g_max",
    "ref_g_sqs", "ref_t_rel_sum", "ref_g_rel_sum")
# Reference counts of the native pass, in the order of csrc/signature.h.
_NATIVE_REF_COUNTS = ("ref_n", "ref_t_closer", "ref_g_closer",
                      "ref_t_shrunk", "ref_t_grown", "ref_g_shrunk",
                      "ref_g_grown")


def _accumulate_native(t: Array, g: Array, ref_hi: Array | None,
                       ref_lo: Array | None) -> SignatureState:
  """`_accumulate` on CPU: the full pass is the native kernel.

  `peat_jax/kernels/csrc/signature.cc` reads t and g (and the reference)
  once and returns every statistic but the shift tests (`_shift_tests`,
  a few thousand elements, in JAX); the sampled statistics
  (`_sampled_stats`) are taken from the same sample, on the same formulas. Same state as `_accumulate`: counts,
  histograms and hashes exactly, float sums up to summation order (the
  native sums run per lane in float32, combined in float64; sums of squares
  in float64); see tests/test_analyzer_native.py for the tolerances.

  Args:
    t: test record.
    g: golden record (same shape and dtype).
    ref_hi: optional float32 high part of the reference.
    ref_lo: optional float32 low part.

  Returns:
    The `SignatureState` of this record.
  """
  from peat_jax.kernels import _ffi  # pylint: disable=g-import-not-at-top

  dtype = t.dtype
  shape = t.shape
  n = int(math.prod(shape))
  nbits = _bits_of(dtype)
  rows, cols = _view2d(shape)
  t = t.reshape(rows, cols)
  g = g.reshape(rows, cols)
  has_ref = ref_hi is not None
  if has_ref:
    ref_hi = ref_hi.reshape(rows, cols).astype(jnp.float32)
    ref_lo = ref_lo.reshape(rows, cols).astype(jnp.float32)
  (ints, hashes, floats, row_ndiff, row_abs_max, row_abs_sum, row_abs_sqs,
   col_ndiff, col_abs_sum, tile_ndiff, hist_abs, hist_rel,
   sample_counts) = _ffi.signature_pass(t, g, ref_hi, ref_lo)
  nf = len(NARROW_FORMATS)
  sampled = dict(hist_abs=hist_abs, hist_rel=hist_rel,
                 pct_n=sample_counts[0], sample_n=sample_counts[1],
                 repr_t=sample_counts[2:2 + nf],
                 repr_g=sample_counts[2 + nf:2 + 2 * nf])
  k = _ffi.SIGNATURE_FLAG_SLOTS
  fl = {name: floats[i] for i, name in enumerate(_NATIVE_FLOATS)}
  refc = {name: ints[k + 3 * nbits + i]
          for i, name in enumerate(_NATIVE_REF_COUNTS)}
  ut = lax.bitcast_convert_type(t, _uint(dtype))
  ug = lax.bitcast_convert_type(g, _uint(dtype))
  shifts = _shift_tests(ut, ug, rows, cols)
  ref = {name: fl[name] for name in _NATIVE_FLOATS if name.startswith("ref")}
  ref.update(refc)
  ref["ref_steps"] = jnp.int32(1 if has_ref else 0)
  return SignatureState(
      steps=jnp.int32(1),
      dtype_code=jnp.int32(_DTYPE_CODE[_SUPPORTED[np.dtype(dtype)]]),
      n=jnp.int32(n), flags=ints[:k], bits_up=ints[k:k + nbits],
      bits_down=ints[k + nbits:k + 2 * nbits],
      ulp_cum=ints[k + 2 * nbits:k + 3 * nbits], row_ndiff=row_ndiff,
      row_abs_max=row_abs_max, row_abs_sum=row_abs_sum,
      row_abs_sqs=row_abs_sqs, col_ndiff=col_ndiff, col_abs_sum=col_abs_sum,
      tile_ndiff=tile_ndiff, err_sum=fl["err_sum"],
      mag_err_sum=fl["mag_err_sum"], rel_max=fl["rel_max"],
      rel_sum=fl["rel_sum"], rel_sqs=fl["rel_sqs"], g_absmax=fl["g_absmax"],
      g_sqs=fl["g_sqs"], ratio_min=fl["ratio_min"],
      ratio_max=fl["ratio_max"], logratio_sum=fl["logratio_sum"],
      slope_sums=jnp.stack([fl[x] for x in ("sx", "sy", "sxy", "sxx",
                                            "syy")]),
      hash_t=hashes[:2], hash_g=hashes[2:],
      shift_col_match=shifts[0], shift_col_n=shifts[1],
      shift_row_match=shifts[2], shift_row_n=shifts[3],
      transpose_match=shifts[4], transpose_n=shifts[5],
      zeroed_g_max=fl["zeroed_g_max"], **sampled, **ref)


def _merge(a: SignatureState, b: SignatureState) -> SignatureState:
  """Combines two states of the same record shape (associative)."""
  out = {}
  for name in SignatureState._fields:
    x, y = getattr(a, name), getattr(b, name)
    if name in _MAX_FIELDS:
      out[name] = jnp.maximum(x, y)
    elif name in _MIN_FIELDS:
      out[name] = jnp.minimum(x, y)
    else:
      out[name] = x + y
  for sq, mx in _SCALED:
    _, out[sq] = _merge_scaled(getattr(a, mx), getattr(a, sq), getattr(b, mx),
                               getattr(b, sq))
  return SignatureState(**out)


# --------------------------------------------------------------------------
# Finalization.
# --------------------------------------------------------------------------


def _hist_pct(hist: Array, total: Array, vmax: Array) -> Array:
  """Upper bucket edges of PERCENTILES from a bit-pattern histogram."""
  cum = jnp.cumsum(hist)
  edges = lax.bitcast_convert_type(
      ((jnp.arange(HIST_BUCKETS, dtype=jnp.uint32) + 1) << 21),
      jnp.float32)  # upper edge of bucket i (bucket 1023's edge is NaN bits)
  edges = jnp.where(jnp.isfinite(edges), edges, jnp.inf)
  out = []
  for p in PERCENTILES:
    need = jnp.ceil(total.astype(jnp.float32) * (p / 100.0))
    need = jnp.maximum(need, 1.0).astype(jnp.int32)
    i = jnp.minimum(jnp.sum(cum < need, dtype=jnp.int32), HIST_BUCKETS - 1)
    out.append(jnp.where(total > 0, jnp.minimum(edges[i], vmax), 0.0))
  return jnp.stack(out).astype(jnp.float32)


def _finalize(s: SignatureState) -> Signature:
  """SignatureState -> Signature (pure)."""
  f32 = jnp.float32
  cdt = s.row_abs_max.dtype
  n = s.n
  nf = n.astype(f32)
  fl = s.flags
  nfp = fl[_F_FINITE_PAIR]
  nfp_c = jnp.maximum(nfp, 1).astype(cdt)

  def share(c):
    return c.astype(f32) / nf

  abs_max, abs_sqs = _combine_scaled(s.row_abs_max, s.row_abs_sqs)

  def rms(vmax, sqs, count):
    # sqrt(mean(x**2)) = max * sqrt(sum((x / max)**2) / count); the mean of
    # squares <= 1 up to rounding, clamped so that RMS <= max (no overflow
    # to Inf when max is near the dtype's largest value).
    return vmax * jnp.sqrt(jnp.minimum(sqs / count, 1.0))

  abs_rms = rms(abs_max, abs_sqs, nfp_c)
  abs_mean = jnp.sum(s.row_abs_sum) / nfp_c
  rel_rms = rms(s.rel_max, s.rel_sqs, nfp_c)
  err_mean = s.err_sum / nfp_c

  def bounded(mean, rms_):
    # mean / rms, in [-1, 1] (|mean| <= rms); 0 where rms is 0 or the mean
    # is undefined (a float sum of huge terms can reach Inf - Inf). Scaled
    # by powers of two first (_div_by_max): 1 / rms is flushed to zero on
    # CPU when rms >= 2**126.
    r = jnp.clip(_div_by_max(mean, rms_), -1.0, 1.0)
    return jnp.where((rms_ > 0) & ~jnp.isnan(r), r, 0.0)

  bias = bounded(err_mean, abs_rms)
  mag_bias = bounded(s.mag_err_sum / nfp_c, rel_rms)
  # ULP histogram from cumulative counts.
  c = s.ulp_cum
  ulp_hist = jnp.concatenate([
      (nfp - c[0])[None], c[:-1] - c[1:], c[-1:]]).astype(jnp.int32)
  cum = jnp.cumsum(ulp_hist)
  ulp_pct = []
  for p in PERCENTILES:
    need = jnp.maximum(jnp.ceil(nfp.astype(f32) * (p / 100.0)), 1.0)
    k = jnp.sum(cum < need.astype(jnp.int32), dtype=jnp.int32)
    ulp_pct.append(jnp.where(nfp > 0, jnp.exp2(k.astype(f32)) - 1.0, 0.0))
  rows = s.row_ndiff.shape[0]
  cols = s.col_ndiff.shape[0]
  steps_c = jnp.maximum(s.steps, 1).astype(cdt)
  # Lanes.
  pad = (-cols) % LANES
  lane_ndiff = jnp.sum(
      jnp.pad(s.col_ndiff, (0, pad)).reshape(-1, LANES), axis=0)
  # Tiles.
  tot, anyd, alld = [], [], []
  tile = s.tile_ndiff
  for ts in TILE_SIZES:
    k = ts // 8
    r, cc = tile.shape[0] // k, tile.shape[1] // k
    if r and cc:
      m = jnp.sum(tile[:r * k, :cc * k].reshape(r, k, cc, k), axis=(1, 3))
      full = ts * ts * s.steps
      tot.append(jnp.int32(r * cc))
      anyd.append(jnp.sum(m > 0, dtype=jnp.int32))
      alld.append(jnp.sum(m == full, dtype=jnp.int32))
    else:
      tot.append(jnp.int32(0))
      anyd.append(jnp.int32(0))
      alld.append(jnp.int32(0))
  # Scale.
  nr = fl[_F_RATIO_OK]
  has_r = nr > 0
  mean_log = s.logratio_sum / jnp.maximum(nr, 1).astype(cdt)
  sign = jnp.where(s.ratio_max < 0, -1.0, 1.0)
  scale = jnp.where(has_r, sign * jnp.exp2(mean_log), 1.0)
  spread = jnp.where(
      has_r, (s.ratio_max - s.ratio_min) / jnp.where(has_r, jnp.abs(scale),
                                                      1.0), 0.0)
  spread = jnp.where(jnp.isnan(spread), jnp.inf, spread)
  # Slope of log2|d| on log2|g|.
  nl = fl[_F_LOG_OK].astype(cdt)
  nl1 = jnp.maximum(nl, 1.0)
  sx, sy, sxy, sxx, syy = (s.slope_sums[i] for i in range(5))
  cxy = sxy / nl1 - (sx / nl1) * (sy / nl1)
  cxx = jnp.maximum(sxx / nl1 - (sx / nl1) ** 2, 0.0)
  cyy = jnp.maximum(syy / nl1 - (sy / nl1) ** 2, 0.0)
  okx = (nl >= 2) & (cxx > 1e-6)
  slope = jnp.where(okx, cxy / jnp.where(okx, cxx, 1.0), 0.0)
  oky = okx & (cyy > 1e-6)
  corr = jnp.where(oky, cxy / jnp.sqrt(jnp.where(oky, cxx * cyy, 1.0)), 0.0)
  corr = jnp.clip(corr, -1.0, 1.0)
  # Shifts.
  def shares(m, nn):
    return jnp.where(nn >= SHIFT_MIN_COMPARED,
                     m.astype(f32) / jnp.maximum(nn, 1).astype(f32), 0.0)
  col_sh = shares(s.shift_col_match, s.shift_col_n)
  row_sh = shares(s.shift_row_match, s.shift_row_n)

  def best(sh):
    masked = sh.at[SHIFT_RANGE].set(-1.0)
    i = jnp.argmax(masked)
    return jnp.where(masked[i] > sh[SHIFT_RANGE], i - SHIFT_RANGE,
                     0).astype(jnp.int32)
  # Reference.
  has_ref = s.ref_steps > 0
  nref = jnp.maximum(s.ref_n, 1).astype(cdt)
  rt_rms = rms(s.ref_t_max, s.ref_t_sqs, nref)
  rg_rms = rms(s.ref_g_max, s.ref_g_sqs, nref)
  ratio = jnp.where(rg_rms > 0, rt_rms / jnp.where(rg_rms > 0, rg_rms, 1.0),
                    jnp.where(rt_rms > 0, jnp.inf, 1.0))
  nan = jnp.asarray(jnp.nan, f32)

  def refv(x):
    return jnp.where(has_ref, x.astype(f32), nan)

  return Signature(
      n=n,
      n_bit_equal=fl[_F_BIT_EQUAL],
      n_value_equal=fl[_F_VALUE_EQUAL],
      n_nan_test=fl[_F_NAN_T],
      n_nan_golden=fl[_F_NAN_G],
      n_inf_test=fl[_F_INF_T],
      n_inf_golden=fl[_F_INF_G],
      n_finite_pairs=nfp,
      n_nonfinite_new=fl[_F_NONFINITE_NEW],
      n_zeroed=fl[_F_ZEROED],
      n_flushed=fl[_F_FLUSHED],
      n_golden_subnormal=fl[_F_GOLDEN_SUBNORMAL],
      n_saturated=fl[_F_SATURATED],
      n_saturated_fp16=fl[_F_SAT_FP16],
      n_saturated_fp8_e4m3=fl[_F_SAT_E4M3],
      n_sign_flip=fl[_F_SIGN_FLIP],
      n_err_pos=fl[_F_POS_ERR],
      n_err_neg=fl[_F_NEG_ERR],
      n_mag_larger=fl[_F_MAG_LARGER],
      n_mag_smaller=fl[_F_MAG_SMALLER],
      n_golden_zero=fl[_F_GOLDEN_ZERO],
      n_overflow=fl[_F_OVERFLOW],
      dtype_code=s.dtype_code,
      share_differ=share(n - fl[_F_BIT_EQUAL]),
      repr_test=s.repr_t.astype(f32) / s.sample_n.astype(f32),
      repr_golden=s.repr_g.astype(f32) / s.sample_n.astype(f32),
      abs_max=abs_max.astype(f32),
      abs_mean=abs_mean.astype(f32),
      abs_rms=abs_rms.astype(f32),
      rel_max=s.rel_max.astype(f32),
      rel_mean=(s.rel_sum / nfp_c).astype(f32),
      rel_rms=rel_rms.astype(f32),
      abs_pct=_hist_pct(s.hist_abs, s.pct_n, abs_max.astype(f32)),
      rel_pct=_hist_pct(s.hist_rel, s.pct_n, s.rel_max.astype(f32)),
      err_mean=err_mean.astype(f32),
      bias=bias.astype(f32),
      mag_bias=mag_bias.astype(f32),
      golden_absmax=s.g_absmax.astype(f32),
      golden_rms=rms(s.g_absmax, s.g_sqs, nfp_c).astype(f32),
      ulp_hist=ulp_hist,
      ulp_pct=jnp.stack(ulp_pct).astype(f32),
      bits_xor=s.bits_up + s.bits_down,
      bits_up=s.bits_up,
      bits_down=s.bits_down,
      row_ndiff=s.row_ndiff,
      row_abs_max=s.row_abs_max.astype(f32),
      row_abs_mean=(s.row_abs_sum / (cols * steps_c)).astype(f32),
      col_ndiff=s.col_ndiff,
      col_abs_mean=(s.col_abs_sum / (rows * steps_c)).astype(f32),
      lane_ndiff=lane_ndiff,
      tile_ndiff=s.tile_ndiff,
      tiles_total=jnp.stack(tot) * s.steps,
      tiles_any=jnp.stack(anyd),
      tiles_all=jnp.stack(alld),
      scale=scale.astype(f32),
      scale_spread=spread.astype(f32),
      err_slope=slope.astype(f32),
      err_corr=corr.astype(f32),
      is_permutation=jnp.all(s.hash_t == s.hash_g) & (fl[_F_BIT_EQUAL] < n),
      shift_col_share=col_sh,
      shift_row_share=row_sh,
      best_shift_col=best(col_sh),
      best_shift_row=best(row_sh),
      transpose_share=shares(s.transpose_match, s.transpose_n),
      has_reference=has_ref,
      ref_test_abs_max=refv(s.ref_t_max),
      ref_test_abs_rms=refv(rt_rms),
      ref_golden_abs_max=refv(s.ref_g_max),
      ref_golden_abs_rms=refv(rg_rms),
      ref_test_rel_mean=refv(s.ref_t_rel_sum / nref),
      ref_golden_rel_mean=refv(s.ref_g_rel_sum / nref),
      noise_ratio=refv(ratio),
      share_test_closer=refv(s.ref_t_closer.astype(f32) / nref),
      share_golden_closer=refv(s.ref_g_closer.astype(f32) / nref),
      ref_test_shrunk=refv(s.ref_t_shrunk.astype(f32) / nref),
      ref_test_grown=refv(s.ref_t_grown.astype(f32) / nref),
      ref_golden_shrunk=refv(s.ref_g_shrunk.astype(f32) / nref),
      ref_golden_grown=refv(s.ref_g_grown.astype(f32) / nref),
      zeroed_golden_absmax=s.zeroed_g_max.astype(f32),
  )


# --------------------------------------------------------------------------
# Jitted entry points.
# --------------------------------------------------------------------------


def _accumulate_auto(t: Array, g: Array, ref_hi: Array | None,
                     ref_lo: Array | None) -> SignatureState:
  """The statistics pass for the platform the computation is compiled for.

  `lax.platform_dependent`: on CPU the native pass (`_accumulate_native`),
  on every other platform the pure-JAX pass (`_accumulate`). The choice is
  made when lowering, by platform only: a failing native call raises, it
  never falls back.
  """
  if ref_hi is None:
    return lax.platform_dependent(
        t, g, cpu=lambda a, b: _accumulate_native(a, b, None, None),
        default=lambda a, b: _accumulate(a, b, None, None))
  return lax.platform_dependent(t, g, ref_hi, ref_lo, cpu=_accumulate_native,
                                default=_accumulate)


def signature_pure(t: Array, g: Array, ref_hi: Array | None = None,
                   ref_lo: Array | None = None) -> Signature:
  """Pure, traceable form of `analyze` (no validation; use inside jit).

  On CPU the statistics pass is the native kernel, elsewhere pure JAX
  (`_accumulate_auto`).

  Args:
    t: test record (validated dtype and shape; see `analyze`).
    g: golden record.
    ref_hi: optional float32 high part of the float64 reference.
    ref_lo: optional float32 low part (reference = ref_hi + ref_lo).

  Returns:
    The `Signature`.
  """
  return _finalize(_accumulate_auto(t, g, ref_hi, ref_lo))


# `analyze`: the statistics pass and the finalization in one executable
# (the state's ~55 arrays are never materialized: less per-call overhead).
_analyze_jit = jax.jit(
    lambda t, g: _finalize(_accumulate_auto(t, g, None, None)))
_analyze_ref_jit = jax.jit(
    lambda t, g, hi, lo: _finalize(_accumulate_auto(t, g, hi, lo)))
_analyze_many_jit = jax.jit(lambda ts, gs, his, los: [
    _finalize(_accumulate_auto(t, g, hi, lo))
    for t, g, hi, lo in zip(ts, gs, his, los)])
_analyze_many_packed_jit = jax.jit(
    lambda ts, gs, his, los: _pack(_analyze_many_jit(ts, gs, his, los)))
_PACK_LAYOUTS: dict = {}  # record shapes/dtypes -> _unpack_plan
# The streaming form: the pass and the finalization separately.
_accumulate_jit = jax.jit(lambda t, g: _accumulate_auto(t, g, None, None))
_accumulate_ref_jit = jax.jit(_accumulate_auto)
_finalize_jit = jax.jit(_finalize)
_merge_jit = jax.jit(_merge)
# The pure-JAX pass on bit patterns made by a separate executable (see
# `_accumulate_bits`): the batched form on every platform, and the
# reference the native pass is tested against.
_bits_jit = jax.jit(lambda x: lax.bitcast_convert_type(x, _uint(x.dtype)))
_accumulate_bits_jit = jax.jit(_accumulate_bits, static_argnames="dtype")
_batch_accumulate_jit = jax.jit(
    lambda ut, ug, dtype: jax.vmap(
        lambda a, b: _accumulate_bits(a, b, None, None, dtype))(ut, ug),
    static_argnames="dtype")
_batch_accumulate_ref_jit = jax.jit(
    lambda ut, ug, hi, lo, dtype: jax.vmap(
        lambda a, b, c, d: _accumulate_bits(a, b, c, d, dtype))(ut, ug, hi,
                                                                lo),
    static_argnames="dtype")
_batch_finalize_jit = jax.jit(jax.vmap(_finalize))


def _x64_scope(dtype):
  """float64 records need x64 inside the trace (scoped, not global)."""
  if np.dtype(dtype) == np.float64:
    return jax.enable_x64(True)
  return _Null()


class _Null:

  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False


def _as_array(x, dtype):
  if isinstance(x, jax.Array):
    return x
  return jnp.asarray(np.asarray(x), dtype=dtype)


def analyze(test, golden, reference=None) -> Signature:
  """Signature of the pseudo-error `test - golden` at one site and step.

  One jit-compiled executable: the statistics pass computes every
  statistic (on CPU the native kernel, elsewhere pure JAX; see
  docs/signature.md) and a small finalization (O(rows + columns) work)
  derives the fields. A second call with the same shape and dtype reuses
  it.

  Args:
    test: output of the kernel under test (float32, bfloat16, float16 or
      float64 array, any shape with at least one element).
    golden: output of the golden kernel on identical inputs; same shape and
      dtype as `test`.
    reference: optional float64 (or any float) array of the same shape: the
      same operation computed in float64 (see `peat_jax.analyzer._references`). Adds
      the noise-floor fields.

  Returns:
    A `Signature` of scalar/array fields (see its docstring and
    docs/signature.md).

  Raises:
    PeatError: unsupported dtype, dtype or shape mismatch, empty arrays.

  >>> import jax.numpy as jnp, peat_jax as peat
  >>> g = jnp.linspace(1.0, 2.0, 64, dtype=jnp.float32)
  >>> int(peat.analyze(g, g).n_bit_equal)
  64
  """
  shape, dtype = _check_pair(test, golden, batched=False)
  with _x64_scope(dtype):
    t = _as_array(test, dtype)
    g = _as_array(golden, dtype)
    if reference is None:
      return _analyze_jit(t, g)
    hi, lo = _split_reference(reference, shape, batched=False)
    return _analyze_ref_jit(t, g, hi, lo)


def split_on_device(reference: Array) -> tuple[Array, Array]:
  """(hi, lo) float32 double-float of a float64 reference, traced.

  The formulas of the host split in `analyze` (hi = float32(r), lo =
  float32(r - hi), non-finite lo -> 0); trace it with x64 enabled.
  """
  hi = reference.astype(jnp.float32)
  lo = (reference - hi.astype(reference.dtype)).astype(jnp.float32)
  return hi, jnp.where(jnp.isfinite(lo), lo, jnp.float32(0))


def analyze_split(test, golden, ref_hi: Array, ref_lo: Array) -> Signature:
  """`analyze` with the reference given as its float32 (hi, lo) halves.

  For references computed on the device (`split_on_device`): no float64
  array comes to the host.

  Args:
    test: output of the kernel under test.
    golden: output of the golden kernel, same shape and dtype.
    ref_hi: float32 high half of the float64 reference, same shape.
    ref_lo: float32 low half.

  Returns:
    The Signature, as `analyze(test, golden, hi + lo)`.

  Raises:
    PeatError: as `analyze`; halves of another shape or dtype.
  """
  return analyze_split_many([test], [golden], [ref_hi], [ref_lo])[0]


def analyze_split_many(tests: Sequence, goldens: Sequence,
                       ref_his: Sequence[Array], ref_los: Sequence[Array],
                       *, to_host: bool = False) -> list[Signature]:
  """`analyze_split` of many records (any shapes) in one executable.

  One dispatch for all of them, and XLA may run their passes concurrently
  (the playback of one checkpoint analyzes all its sites this way).

  Args:
    tests, goldens, ref_his, ref_los: per record, as `analyze_split`.
    to_host: return NumPy Signatures, fetched as one array per dtype (a
      few transfers instead of one per field of every record).

  Returns:
    The Signatures, in order (device arrays, or NumPy with ``to_host``).

  Raises:
    PeatError: as `analyze_split`, naming the record's index.
  """
  if not len(tests) == len(goldens) == len(ref_his) == len(ref_los):
    raise PeatError("tests, goldens, ref_his and ref_los have lengths "
                    f"{len(tests)}, {len(goldens)}, {len(ref_his)}, "
                    f"{len(ref_los)}; expected one of each per record")
  ts, gs, wide = [], [], False
  for i, (t, g, hi, lo) in enumerate(zip(tests, goldens, ref_his, ref_los)):
    shape, dtype = _check_pair(t, g, batched=False)
    for name, h in (("ref_hi", hi), ("ref_lo", lo)):
      if (tuple(np.shape(h)) != tuple(shape)
          or np.dtype(h.dtype) != np.float32):
        raise PeatError(
            f"record {i}: {name} has shape {tuple(np.shape(h))} and dtype "
            f"{h.dtype}; expected float32 of the test's shape "
            f"{tuple(shape)}. Fix: split the float64 reference with "
            "split_on_device.")
    wide |= np.dtype(dtype) == np.float64
    with _x64_scope(dtype):
      ts.append(_as_array(t, dtype))
      gs.append(_as_array(g, dtype))
  his, los = list(ref_his), list(ref_los)
  with _x64_scope(np.float64 if wide else np.float32):
    if not to_host:
      return list(_analyze_many_jit(ts, gs, his, los))
    key = tuple((tuple(t.shape), str(t.dtype)) for t in ts)
    if key not in _PACK_LAYOUTS:
      _PACK_LAYOUTS[key] = _unpack_plan(
          jax.eval_shape(_analyze_many_jit, ts, gs, his, los))
    packed = jax.device_get(_analyze_many_packed_jit(ts, gs, his, los))
  return _unpack(packed, _PACK_LAYOUTS[key])


def _pack(sigs: list[Signature]) -> dict[str, Array]:
  """All fields of many Signatures as one flat array per dtype (traced)."""
  groups: dict[str, list[Array]] = {}
  for sig in sigs:
    for leaf in sig:
      groups.setdefault(str(leaf.dtype), []).append(leaf.reshape(-1))
  return {k: jnp.concatenate(v) for k, v in groups.items()}


def _unpack_plan(layout: list[Signature]) -> list[list[tuple]]:
  """Where each field of each Signature lies in `_pack`'s arrays:
  ``(dtype key, start, stop, shape)`` per field, per Signature."""
  offsets: dict[str, int] = {}
  plan = []
  for sig in layout:
    fields = []
    for leaf in sig:
      k, n = str(leaf.dtype), int(math.prod(leaf.shape))
      start = offsets.get(k, 0)
      offsets[k] = start + n
      fields.append((k, start, start + n, tuple(leaf.shape)))
    plan.append(fields)
  return plan


def _unpack(packed: dict[str, np.ndarray], plan: list[list[tuple]]
            ) -> list[Signature]:
  """Inverse of `_pack` on the host, by an `_unpack_plan` (views, no
  copies: a few hundred fields cost well under a millisecond)."""
  return [Signature(*[packed[k][a:b].reshape(shape)
                      for k, a, b, shape in fields]) for fields in plan]


def analyze_batch(tests, goldens, references=None) -> Signature:
  """Signatures of many records of one shape/dtype in one compiled call.

  The pure-JAX pass, vmapped, on every platform (fed bit patterns from a
  separate executable, see `_accumulate_bits`); its results agree with
  `analyze` record by record (counts exactly, floats to summation order).

  Args:
    tests: array of shape (B, *record_shape): KUT outputs of B (site, step)
      records.
    goldens: golden outputs, same shape and dtype.
    references: optional float64 array (B, *record_shape).

  Returns:
    A `Signature` whose every field has a leading axis of size B.

  Raises:
    PeatError: as `analyze`, or a missing batch axis.
  """
  shape, dtype = _check_pair(tests, goldens, batched=True)
  with _x64_scope(dtype):
    ut = _bits_jit(_as_array(tests, dtype))
    ug = _bits_jit(_as_array(goldens, dtype))
    if references is None:
      return _batch_finalize_jit(_batch_accumulate_jit(ut, ug, dtype=dtype))
    hi, lo = _split_reference(references, shape, batched=True)
    return _batch_finalize_jit(
        _batch_accumulate_ref_jit(ut, ug, jnp.asarray(hi.view(np.uint32)),
                                  lo, dtype=dtype))


def signature_init(shape, dtype) -> SignatureState:
  """Empty streaming state for records of `shape` and `dtype`.

  Args:
    shape: record shape (tuple of ints, at least one element).
    dtype: record dtype (float32, bfloat16, float16, float64).

  Returns:
    The identity `SignatureState` (merging it changes nothing).

  Raises:
    PeatError: unsupported dtype or empty shape.
  """
  dtype = _check_dtype(dtype, "dtype")
  shape = tuple(int(s) for s in shape)
  if math.prod(shape) == 0:
    raise PeatError(f"record shape {shape} has no elements; expected at "
                    "least 1. Fix: skip sites whose output is empty.")
  with _x64_scope(dtype):
    z = jnp.zeros(shape, dtype)
    proto = jax.eval_shape(
        lambda a, b: _accumulate(a, b, None, None), z, z)
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), proto)
    cdt = state.row_abs_max.dtype
    state = state._replace(
        steps=jnp.int32(0), n=jnp.int32(0),
        ratio_min=jnp.asarray(jnp.inf, cdt),
        ratio_max=jnp.asarray(-jnp.inf, cdt))
  return state


def signature_update(state: SignatureState, test, golden,
                     reference=None) -> SignatureState:
  """Merges one record (site, step) into a streaming state.

  Pure: returns a new state; jit-compiled once per shape and dtype.

  Args:
    state: from `signature_init` or a previous `signature_update`.
    test: KUT output of this step.
    golden: golden output of this step.
    reference: optional float64 reference of this step.

  Returns:
    The updated `SignatureState`.

  Raises:
    PeatError: shape or dtype differ from the state's.
  """
  shape, dtype = _check_pair(test, golden, batched=False)
  rows, cols = _view2d(shape)
  have = (state.row_ndiff.shape[0], state.col_ndiff.shape[0])
  if have != (rows, cols):
    raise PeatError(
        f"record shape {shape} (2-D view {(rows, cols)}) does not match the "
        f"state's 2-D view {have}. Fix: keep one state per site (records of "
        "one shape).")
  if _bits_of(dtype) != state.bits_up.shape[0]:
    raise PeatError(
        f"record dtype {dtype} has {_bits_of(dtype)} bits; the state was made"
        f" for {state.bits_up.shape[0]}-bit records. Fix: keep one state per "
        "site and dtype.")
  with _x64_scope(dtype):
    t = _as_array(test, dtype)
    g = _as_array(golden, dtype)
    if reference is None:
      return _merge_jit(state, _accumulate_jit(t, g))
    hi, lo = _split_reference(reference, shape, batched=False)
    return _merge_jit(state, _accumulate_ref_jit(t, g, hi, lo))


def signature_finalize(state: SignatureState) -> Signature:
  """Signature of everything merged into `state`.

  Counts and histograms are totals over the merged records; means, RMS and
  shares are over all merged elements. Per-row/column means are per record.

  Args:
    state: a `SignatureState` with at least one update.

  Returns:
    A `Signature`.

  Raises:
    PeatError: if the state holds no record.
  """
  if int(state.steps) == 0:
    raise PeatError("signature_finalize: the state holds no record "
                    "(steps == 0); expected at least one signature_update. "
                    "Fix: update before finalizing.")
  with _x64_scope(state.row_abs_max.dtype):
    return _finalize_jit(state)
