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

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core


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
NARROW_FORMATS = _core.NARROW_FORMATS

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

_DTYPE_CODE = _core.DTYPE_CODE
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
    decomposed ... n_tiny_zeroed: the noise-aware decomposition of
      `analyzer._decompose` (outliers beyond a rounding envelope calibrated
      on the golden kernel's own error, fault statistics on the outliers,
      per-row fits and the value-function share), computed by `analyze`,
      `analyze_split`, `analyze_split_many` and `analyze_batch` when a
      reference is given; `decomposed` is False (and the fields neutral)
      without a reference and in the streaming form. Every field is
      documented in docs/signature.md.
      Its fields: decomposed, env_theta, env_theta_golden, env_golden_z,
      z_med_test, z_med_golden, z_max_test, n_beyond, n_out, n_out_zero,
      n_out_flip1, n_out_flip2, n_out_flip3, null_flips, n_out_far,
      n_out_clear, n_shoulder, n_out_exact_flips,
      n_out_moved, n_out_matched,
      out_flip_bits, out_flip_up, out_bits_xor, out_lane, out_rows,
      out_cols, out_tiles_any, out_tiles_all, out_shift_col,
      out_shift_row, out_transpose, out_shift_n, out_abs_max,
      in_rel_rms, in_bias, row_delta, row_resid, row_err, fit_delta,
      fit_resid, value_r2, n_tiny, n_tiny_zeroed, rel_max_test,
      rel_max_golden, n_small, n_small_err_test, n_small_err_golden,
      balance_test, balance_golden, n_ulps_test, n_ulps_golden,
      n_nonfinite_mismatch, n_rounded, out_err_sum, out_sorted_err,
      base_format, base_candidate,
      base_mode, base_explained, base_ties, n_golden_explained.
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
  # The noise-aware decomposition (analyzer._decompose; docs/signature.md).
  decomposed: Array
  env_theta: Array
  env_theta_golden: Array
  env_golden_z: Array
  z_med_test: Array
  z_med_golden: Array
  z_max_test: Array
  n_beyond: Array
  n_out: Array
  n_out_zero: Array
  n_out_flip1: Array
  n_out_flip2: Array
  n_out_flip3: Array
  null_flips: Array
  n_out_far: Array
  n_out_clear: Array
  n_shoulder: Array
  n_out_exact_flips: Array
  n_out_moved: Array
  n_out_matched: Array
  out_flip_bits: Array
  out_flip_up: Array
  out_bits_xor: Array
  out_lane: Array
  out_rows: Array
  out_cols: Array
  out_tiles_any: Array
  out_tiles_all: Array
  out_shift_col: Array
  out_shift_row: Array
  out_transpose: Array
  out_shift_n: Array
  out_abs_max: Array
  in_rel_rms: Array
  in_bias: Array
  row_delta: Array
  row_resid: Array
  row_err: Array
  fit_delta: Array
  fit_resid: Array
  value_r2: Array
  n_tiny: Array
  n_tiny_zeroed: Array
  rel_max_test: Array
  rel_max_golden: Array
  n_small: Array
  n_small_err_test: Array
  n_small_err_golden: Array
  balance_test: Array
  balance_golden: Array
  n_ulps_test: Array
  n_ulps_golden: Array
  n_nonfinite_mismatch: Array
  n_rounded: Array
  out_err_sum: Array
  out_sorted_err: Array
  base_format: Array
  base_candidate: Array
  base_mode: Array
  base_explained: Array
  base_ties: Array
  n_golden_explained: Array
