"""Noise-aware decomposition of a pseudo-error: outliers over a rounding envelope.

A real port is never otherwise exact: its own summation order moves most
elements by an ulp or two, so "the elements that differ" are not the fault.
With the float64 reference ``r`` this pass splits the KUT's error
``|t - r|`` into the part that rounding at working precision explains and
the *outliers* beyond it:

* every element's error is measured in units of ``u * scale``, with ``u``
  the unit roundoff of the record's format and ``scale = |r| + rms_row(r)``
  (a row's RMS stands in for the size of the terms that were summed: the
  rounding error of an output near zero, where terms cancel, is not small
  relative to the row; a row that cancels whole, its reference at most
  ``CANCELLED_ROW`` of the tensor's RMS, takes the tensor's RMS). ``z_t = |t - r| / (u scale)`` and
  ``z_g = |g - r| / (u scale)``;
* the envelope is calibrated on the golden kernel itself: a different,
  correct summation order has errors of the golden kernel's own size, a
  small multiple of it on long one-after-another sums (measured up to about
  4x on the models here), so ``theta = ENVELOPE_FACTOR * max(z_g,
  ENVELOPE_MIN_Z)`` and an element is an outlier when ``z_t > theta`` (or
  t is not finite where g is);
* the sparse and structured fault statistics are taken on the outliers
  only: their count, zeros, lanes, rows, columns, aligned tiles, XOR bit
  positions against golden, and whether flipping one (or two) bits of ``t``
  brings the element back inside the envelope; shifted/transposed golden
  values within the envelope (values in the wrong place, beyond rounding);
* the dense part: per-row least-squares scale ``delta_row`` of ``t - r``
  on ``r`` and its residual (a constant of the computation that differs,
  such as a normalization epsilon, scales each row by its own constant),
  and how much of the error a function of the value alone explains
  (another closed form of the same function: an approximation).

Without a reference the golden output stands in for ``r`` (``z_g = 0``)
and the envelope is ``NO_REFERENCE_Z`` units: less sharp (the golden
kernel's own noise is counted as the KUT's), documented in
docs/signature.md.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax import core as _core
from peat_jax.analyzer.signature._base import (
    BASE_MIN_SHARE, BASE_REPRESENTABLE, CLEAR_FACTOR, DENSE_RESIDUAL_MIN,
    DENSE_RESIDUAL_SHARE, FAR_FACTOR, FAR_QUANTILE, MAX_FLIPS, NEAR_ULPS,
    excess_ulps, fit_rounded_base, flip_null, flips_needed,
    representable_in, rounded_bits, rounded_explains, top_bit)
from peat_jax.analyzer.signature._bits import _uint, sample_jitter
from peat_jax.analyzer.signature._layout import (
    Layout, cols_sum, flat, layout, per_element, rows_sum, seg_sum,
    tile_counts)
from peat_jax.analyzer.signature._prefix import cumsum_small, first_true
from peat_jax.analyzer.signature._signature import (
    Array, LANES, PCT_SAMPLE, SHIFT_RANGE, SHIFT_SAMPLE_ROWS, SHIFT_WINDOW,
    TILE_SIZES)

#: The envelope is this many times the golden kernel's largest normalized
#: error (another correct order of a float32 sum: up to ~4x, measured).
ENVELOPE_FACTOR = 16.0
#: ... and at least this many units (an exact golden kernel, z_g = 0).
ENVELOPE_MIN_Z = 4.0
#: A 16-bit output (bf16, fp16) is rounded once at the end by a correct
#: kernel: golden's error is at most one unit of its u (0.5 ulp) per
#: element and another correct kernel's a few (two or three roundings in
#: the output's format: Hugging Face's RMSNorm, a rope with bf16 tables).
#: Its envelope is ENVELOPE16_FACTOR x max(z_g, ENVELOPE16_MIN_Z) units:
#: 8 units of u(bf16) (3% relative), not the 64 of the float32 rule, where
#: a bf16-accumulated norm or a mean-subtracted RMSNorm would hide.
ENVELOPE16_FACTOR = 4.0
ENVELOPE16_MIN_Z = 2.0
#: ... while an outlier of a 16-bit output (a fault's candidate) is beyond
#: at least this many units: a bf16 accumulation's tail reaches 9-12 units
#: (K = 64 matmuls of vit_bf16), and one flip of bf16's four low mantissa
#: bits moves a value by at most 8 ulps = 16 units, which rounding noise
#: of that size cannot be told from; the 64-unit envelope of before found
#: every 16-bit fault of the calibration and tests.
OUTLIER16_MIN_Z = 32.0
#: The envelope without a reference (the golden output as the reference).
NO_REFERENCE_Z = 256.0
#: Outliers are also beyond this many times the KUT's median error (its own
#: dense rounding: rounding to nearest is bounded by 2x its median).
DENSE_FACTOR = 16.0
#: ... and beyond ``q**2 / median`` of the KUT's own error, ``q`` its
#: SPREAD_QUANTILE: where the outputs span orders of magnitude (a
#: softmax: a few large entries a row, the rest far below the row's
#: RMS), the KUT's dense error in units of ``u * scale`` spans them too,
#: and its largest lies far beyond 16 medians (measured up to 2000
#: medians on softmax with bf16 or fp16 inputs). Its log-magnitudes
#: extend from the median to the largest by at most twice the span from
#: the median to the 90th percentile (measured up to 1.84x on softmax
#: outputs of 60 to 120 terms, bases of bf16, fp16 and tf32 inputs,
#: bf16 outputs and another order): ``(q / median)**2 x median``. An
#: error of one magnitude (a sum's rounding: q ~ 3 medians) keeps the
#: 16 medians. The 90th percentile moves little under a fault of fewer
#: than a tenth of the elements (a lane of 32 is 3%).
SPREAD_QUANTILE = 0.9
#: ... where the KUT's error spans its magnitudes without a gap: a dense
#: error fills every quarter octave between its median and its 90th
#: percentile (softmax bases: no empty one), while a fault that moves
#: more than a tenth of the elements (a zeroed tile, values in the wrong
#: place) puts the percentile orders of magnitude above the base's
#: rounding, past an empty stretch: from this many empty quarter-octave
#: buckets (2 octaves) the term is no dense error's, and is not used.
SPREAD_GAP = 8
#: ... and where it rises from the median steadily: from its
#: SPREAD_BULK_QUANTILE to its 90th percentile its log-magnitude climbs at
#: most SPREAD_STEP times as far as from the median to that quantile
#: (measured 0.7 on sums' rounding, 0.8-1.5 on softmax bases, in the
#: quarter octaves the histogram reads). A fault of a tenth to a quarter
#: of the elements (a zeroed tile, a stuck bit in 30% of them) lifts the
#: 90th percentile far above the rest: no dense error's spread.
SPREAD_BULK_QUANTILE = 0.75
SPREAD_STEP = 2
#: A row whose reference RMS is at most this share of the tensor's (exactly
#: zero rows, or float64 residues of an exact cancellation, such as the
#: first query's dQ in causal attention: one visible key, dS = 0) has no
#: size of its own: its terms are the tensor's, and the tensor's RMS stands
#: in for its row RMS (float32's unit roundoff: below it a row is rounding
#: residue at any working precision).
CANCELLED_ROW = 2.0 ** -24
#: A 16-bit record's rows are sized at least this share of the tensor's
#: RMS. A 16-bit kernel rounds its intermediates at the tensor's scale
#: (torch's SDPA backward forms D = rowsum(dO * O) from the bf16 output
#: O), and a row that nearly cancels (the second query of causal
#: attention: two keys) keeps errors of up to ~6 u x the tensor's RMS,
#: 40-110 units of its own size: rounding all the same. Below a quarter
#: of the tensor's RMS a row is judged as that size (relative errors
#: against a floor); an outlier there is beyond 32 units of u x RMS / 4,
#: 3% of the tensor's RMS in bf16.
ROW_FLOOR16 = 2.0 ** -2
#: Bins of the value (sign and quarter octaves of |r| / rms) for the
#: "error is a function of the value" statistic.
VALUE_BINS = 128
#: The small-value threshold of the ratio view, by record format: values
#: below it are judged by absolute error (above SMALL_VALUE / 16).
SMALL_VALUE = {"fp32": 1e-6, "fp64": 1e-6, "bf16": 1e-3, "fp16": 1e-3}
#: The ratio view's ulp limit: 32 ulps for 32/64-bit formats, 1 for 16-bit.
ULP_LIMIT = {"fp32": 32, "fp64": 32, "bf16": 1, "fp16": 1}
#: Bit histograms and the permutation test read at most this many outliers.
MATCH_OUTLIERS = 4096
#: Records at least this wide also test a third flip (``n_out_flip2``
#: counts outliers back within the envelope after two or three flips of
#: their highest differing bits: a multi-bit upset). A random float32
#: value comes back within the outlier envelope (~64 units: the lowest
#: six bits) after three such flips only when at most three of its other
#: 26 bits differ from golden: a binomial tail of 2951 / 2**26 = 4e-5. A
#: 16-bit record keeps ~12 bits above its wide envelope, where three
#: flips would take 299 / 2**12 = 7% of random values (two: 2%), so it
#: stops at two.
MULTI_FLIP_MIN_BITS = 32


class Decomposition(NamedTuple):
  """The decomposition fields of a Signature (docs/signature.md).

  Shapes: ``R`` rows, ``C`` columns of the 2-D view, ``nbits`` the record
  dtype's width; tiles as in the Signature (8, 16, 32).
  """

  decomposed: Array  # bool: computed for this record
  env_theta: Array  # f32: the outlier envelope in units of u * scale
  env_theta_golden: Array  # f32: the golden envelope (16 max(z_g, 4))
  env_golden_z: Array  # f32: max z_g (0 without a reference)
  z_med_test: Array  # f32: median z_t (sample)
  z_med_golden: Array  # f32: median z_g (sample)
  z_max_test: Array  # f32: max z_t over finite pairs
  n_beyond: Array  # int32: elements beyond the golden envelope
  n_out: Array  # int32: outliers (finite pairs beyond theta, new non-finite)
  n_out_zero: Array  # int32: outliers with t == +-0
  n_out_flip1: Array  # int32: outliers back inside the base by one bit flip
  n_out_flip2: Array  # int32: ... by two flips of their highest differing
  #   bits, not one
  n_out_flip3: Array  # int32: ... by three, not fewer
  null_flips: Array  # f32[3]: the flip null (._base): share of data-like
  #   values back inside the base at a sampled place by <= 1, 2, 3 flips
  n_out_far: Array  # int32: outliers (finite, nonzero) beyond FAR_FACTOR of
  #   the explained elements' range of magnitudes
  n_out_clear: Array  # int32: outliers clear of their base (._base
  #   CLEAR_FACTOR: not the tail of a dense error), NaN/Inf included
  n_shoulder: Array  # int32: elements within CLEAR_FACTOR below the
  #   outlier threshold (not outliers): a dense error's tail
  n_out_exact_flips: Array  # int32: finite outliers differing from golden
  #   in at most MAX_FLIPS bits
  n_out_moved: Array  # int32: outliers whose sorted values equal their
  #   sorted references within the envelope (a permutation among them)
  n_out_matched: Array  # int32: outliers compared so (all, when <= 4096)
  out_flip_bits: Array  # int32[nbits]: the bit of each one-flip outlier
  out_flip_up: Array  # int32[nbits]: ... where that bit is 1 in t
  out_bits_xor: Array  # int32[nbits]: XOR bit positions t vs g of outliers
  out_lane: Array  # int32[32]: outliers by column index mod 32
  out_rows: Array  # int32[R]: outliers per row
  out_cols: Array  # int32[C]: outliers per column
  out_tiles_any: Array  # int32[3]: aligned tiles with an outlier
  out_tiles_all: Array  # int32[3]: aligned tiles all outliers
  out_shift_col: Array  # f32[17]: share of sampled elements beyond the
  #   golden envelope within it of g shifted by s columns (s = -8..8)
  out_shift_row: Array  # f32[17]: ... rows
  out_transpose: Array  # f32: ... g transposed
  out_shift_n: Array  # int32: sampled elements compared
  out_abs_max: Array  # f32: max |t - r| over outliers
  in_rel_rms: Array  # f32: RMS of (t - r) / scale over in-envelope elements
  in_bias: Array  # f32: mean / RMS of (t - r) / scale, in-envelope
  row_delta: Array  # f32[R]: least-squares scale of t - r on r, per row
  #   (the fits and the value function: over the elements not outliers)
  row_resid: Array  # f32[R]: RMS residual / RMS(r) of that fit, per row
  row_err: Array  # f32[R]: RMS(t - r) / RMS(r), per row
  fit_delta: Array  # f32: the whole record's least-squares scale
  fit_resid: Array  # f32: its residual RMS / RMS(r)
  value_r2: Array  # f32: share of the error variance a function of r explains
  n_tiny: Array  # int32[5]: 0 < |g| < min normal of each narrow format
  n_tiny_zeroed: Array  # int32[5]: ... with t == +-0
  # The per-metric ratio view (KUT vs float64 over golden vs float64).
  rel_max_test: Array  # f32: max |t - r| / |r| over |r| >= SMALL_VALUE
  rel_max_golden: Array  # f32: ... |g - r| / |r|
  n_small: Array  # int32: elements with |r| < SMALL_VALUE
  n_small_err_test: Array  # int32: ... with |t - r| > SMALL_VALUE / 16
  n_small_err_golden: Array  # int32: ... with |g - r| > SMALL_VALUE / 16
  balance_test: Array  # f32: sum(t - r) / sum|t - r|, in [-1, 1]
  balance_golden: Array  # f32: sum(g - r) / sum|g - r|
  n_ulps_test: Array  # int32: |t - r| beyond ULP_LIMIT ulps of r's format
  n_ulps_golden: Array  # int32: |g - r| beyond ULP_LIMIT ulps
  n_nonfinite_mismatch: Array  # int32: isnan or isinf differ between t, g
  n_rounded: Array  # int32: elements beyond the golden envelope that the
  #   candidate rounded base explains (never outliers)
  out_err_sum: Array  # f32: sum |t - r| over the gathered outliers
  out_sorted_err: Array  # f32: ... of their sorted values against their
  #   sorted references (a permutation's is far smaller)
  base_format: Array  # int32: the fitted base's format (index in
  #   NARROW_FORMATS) when outputs rounded to it are the base; -1: golden
  base_candidate: Array  # int32: the candidate format (-1: none fits)
  base_mode: Array  # int32: its fitted rounding mode (._base.MODES)
  base_explained: Array  # int32[2]: elements each mode explains
  base_ties: Array  # int32[2]: golden ties of the format explained to
  #   nearest, and those rounded away from zero
  n_golden_explained: Array  # int32: elements inside the golden envelope


def empty(rows: int, cols: int, nbits: int) -> Decomposition:
  """Neutral fields: no decomposition (no reference; the streaming form)."""
  z = lambda *s: jnp.zeros(s, jnp.int32)
  f = lambda *s: jnp.zeros(s, jnp.float32)
  nan = jnp.float32(0)  # neutral: `decomposed` False says not computed
  return Decomposition(
      jnp.bool_(False), nan, nan, nan, nan, nan, nan, jnp.int32(0),
      jnp.int32(0),
      jnp.int32(0), jnp.int32(0),
      jnp.int32(0), jnp.int32(0), f(MAX_FLIPS), jnp.int32(0), jnp.int32(0),
      jnp.int32(0), jnp.int32(0), jnp.int32(0), jnp.int32(0), z(nbits),
      z(nbits), z(nbits),
      z(LANES),
      z(rows), z(cols), z(3), z(3), f(2 * SHIFT_RANGE + 1),
      f(2 * SHIFT_RANGE + 1), nan, jnp.int32(0), nan, nan, nan, f(rows),
      f(rows), f(rows), nan, nan, nan, z(5), z(5), nan, nan, jnp.int32(0),
      jnp.int32(0), jnp.int32(0), nan, nan, jnp.int32(0), jnp.int32(0),
      jnp.int32(0), jnp.int32(0), nan, nan, jnp.int32(-1), jnp.int32(-1),
      jnp.int32(0), z(2), z(2), jnp.int32(0))


def _sample_quantile(z: Array, valid: Array, rank) -> Array:
  """The ``rank``-th smallest (1-based, traced) of nonnegative ``z`` over
  ``valid`` (quarter-octave buckets: the bucket's upper edge, 0 when that
  many are 0)."""
  b = jnp.where(z > 0, jnp.clip(jnp.floor(4.0 * jnp.log2(jnp.maximum(
      z, 1e-30))) + 161, 1, 399), 0).astype(jnp.int32)
  hist = jnp.zeros((400,), jnp.int32).at[b].add(valid.astype(jnp.int32))
  cum = cumsum_small(hist)
  k = jnp.argmax(cum >= rank)
  return jnp.where(k == 0, 0.0, 2.0 ** ((k - 160) / 4.0)).astype(z.dtype)


def _spread_envelope(z: Array, valid: Array) -> Array:
  """``q**2 / median`` of nonnegative ``z`` over ``valid`` (``q`` its
  SPREAD_QUANTILE, both as :func:`_sample_quantile` reads them), where
  it rises steadily (SPREAD_STEP) and the quarter-octave buckets between
  the median and ``q`` leave no empty stretch of SPREAD_GAP; 0 otherwise
  (or where the median is 0)."""
  b = jnp.where(z > 0, jnp.clip(jnp.floor(4.0 * jnp.log2(jnp.maximum(
      z, 1e-30))) + 161, 1, 399), 0).astype(jnp.int32)
  hist = jnp.zeros((400,), jnp.int32).at[b].add(valid.astype(jnp.int32))
  cum = cumsum_small(hist)
  n = jnp.sum(valid)
  k_med = jnp.argmax(cum >= (n + 1) // 2)
  k_q = jnp.argmax(cum >= jnp.maximum(jnp.ceil(SPREAD_QUANTILE * n), 1))
  k_bulk = jnp.argmax(cum >= jnp.maximum(
      jnp.ceil(SPREAD_BULK_QUANTILE * n), 1))
  # The longest run of empty buckets strictly between the two.
  i = jnp.arange(400)
  empty = (hist == 0) & (i > k_med) & (i < k_q)
  last_full = lax.cummax(jnp.where(empty, -1, i))
  gap = jnp.max(jnp.where(empty, i - last_full, 0))
  edge = lambda k: 2.0 ** ((k - 160) / 4.0)
  ok = ((k_med > 0) & (gap < SPREAD_GAP)
        & (k_q - k_bulk <= SPREAD_STEP * jnp.maximum(k_bulk - k_med, 1)))
  return jnp.where(ok, edge(k_q) ** 2 / edge(jnp.maximum(k_med, 1)),
                   0.0).astype(z.dtype)


def _sample_median(z: Array, valid: Array) -> Array:
  """Median of nonnegative ``z`` over ``valid`` (:func:`_sample_quantile`)."""
  return _sample_quantile(z, valid, (jnp.sum(valid) + 1) // 2)


def _safe_div(a, b):
  return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), 0.0)


def _tiles(mask: Array, lay: Layout) -> tuple[Array, Array]:
  """Aligned tiles (edges TILE_SIZES) of the (R, C) view with any / every
  element in ``mask`` (flat, :mod:`._layout`), over the largest aligned
  top-left sub-array: the 8x8 tile counts (a reshape, or traced one
  segment sum), the larger tiles summed from them
  (:func:`~._layout.tile_counts`)."""
  m = mask.astype(jnp.int32)
  base = TILE_SIZES[0]
  tr, tc = lay.rows // base, lay.cols // base
  if lay.static:
    grid = jnp.sum(m.reshape(lay.rows, lay.cols)[:tr * base, :tc * base]
                   .reshape(tr, base, tc, base), axis=(1, 3), dtype=jnp.int32)
  else:
    inside = lay.valid & (lay.row < tr * base) & (lay.col < tc * base)
    nt = max(min(lay.cap // (base * base),
                 (lay.row_slots // base) * (lay.col_slots // base)), 1)
    tid = jnp.where(inside, (lay.row // base) * tc + lay.col // base, nt)
    grid = seg_sum(m, tid, nt)  # (tr, tc) 8x8 tiles row-major, then zeros
  _, anys, alls = tile_counts(grid, lay.rows, lay.cols, 1)
  return anys, alls


def _masked_median(z: Array, mask: Array, axis: int) -> Array:
  """Median of ``z`` over ``mask`` along ``axis`` (+inf where none).

  The lower median: the ``(k - 1) // 2``-th smallest of the ``k`` masked
  values. ``z`` is nonnegative (or +inf, NaN), so its bit patterns, read as
  unsigned integers, sort as its values do (NaN last, as ``jnp.sort``): a
  bisection over the patterns (one count per bit of the dtype) finds that
  order statistic exactly, the same element a sort would, at a fraction of
  a sort's cost on CPU.
  """
  k = jnp.sum(mask, axis=axis)
  mid = jnp.maximum((k - 1) // 2, 0)
  uty = _uint(z.dtype)
  u = lax.bitcast_convert_type(jnp.where(mask, z, jnp.inf), uty)
  u = jnp.moveaxis(u, axis, -1)
  lo = jnp.zeros(u.shape[:-1], uty)
  hi = jnp.full(u.shape[:-1], np.iinfo(uty).max, uty)

  def halve(_, bounds):
    lo, hi = bounds
    half = lo + (hi - lo) // jnp.array(2, uty)
    enough = jnp.sum(u <= half[..., None], axis=-1) > mid
    return (jnp.where(enough, lo, half + jnp.array(1, uty)),
            jnp.where(enough, half, hi))
  # One step per bit, as a loop: XLA compiles its body once (unrolled, the
  # 32 steps were a third of the decomposition's operations, and its
  # compilation time per new shape).
  lo, _ = lax.fori_loop(0, np.dtype(uty).itemsize * 8, halve, (lo, hi))
  med = lax.bitcast_convert_type(lo, z.dtype)
  return jnp.where(k > 0, med, jnp.inf)


def _sort_finite(x: Array) -> Array:
  """``jnp.sort`` of NaN-free floats, by their bit patterns as unsigned
  keys (an integer sort is several times faster than a float sort on
  CPU); the same values in the same order (-0 before +0)."""
  uty = _uint(x.dtype)
  top = jnp.array(1 << (np.dtype(uty).itemsize * 8 - 1), uty)
  u = lax.bitcast_convert_type(x, uty)
  neg = (u & top) != 0
  k = lax.sort(jnp.where(neg, ~u, u | top))
  back = jnp.where((k & top) != 0, k & ~top, ~k)
  return lax.bitcast_convert_type(back, x.dtype)


def _shift_stats(t, r, unit, theta_g, out, per_row, per_col, lay: Layout):
  """Values in the wrong place: elements beyond the golden envelope that
  equal a golden value shifted by s columns / rows (or transposed), up to
  the KUT's own noise, on sampled elements.

  The tolerance is calibrated on the data: the best shift's median
  distance (the KUT's own noise where its values really come from), times
  DENSE_FACTOR, and at least the golden envelope. The window is centered on
  the columns holding the most such elements, the rows are those holding
  the most (at most SHIFT_SAMPLE_ROWS). Arrays flat (:mod:`._layout`);
  ``per_row``, ``per_col``: ``out``'s counts by row and column.
  """
  rows, cols, cap = lay.rows, lay.cols, lay.cap
  # The window's static width: its own (a static shape) or the bucket's.
  cws = min(cols if lay.static else cap, SHIFT_WINDOW)
  cw = jnp.minimum(cols, SHIFT_WINDOW)
  nss = min(lay.row_slots, SHIFT_SAMPLE_ROWS)  # static sampled rows
  c0 = jnp.clip(jnp.argmax(per_col) - cw // 2, 0, cols - cw)
  top = lax.top_k(per_row, nss)[1]
  # Rows beyond the record (padding, when R < nss) are never compared.
  ridx = jnp.sort(jnp.where(top < rows, top, cap))
  rin = ridx < rows
  ridx = jnp.minimum(ridx, rows - 1)
  shifts = np.arange(-SHIFT_RANGE, SHIFT_RANGE + 1)
  j = jnp.arange(cws, dtype=jnp.int32)
  cidx = c0 + j
  here = rin[:, None] & (j < cw)[None, :]
  at = lambda a, i, c: a[jnp.clip(i * cols + c, 0, cap - 1)]
  ts = at(t, ridx[:, None], cidx[None, :])
  outs = at(out, ridx[:, None], cidx[None, :]) & here
  src = cidx[None, :] - shifts[:, None]  # (17, cw)
  ok = (src >= 0) & (src < cols)
  srcc = jnp.clip(src, 0, cols - 1)
  zc = (jnp.abs(ts[:, None, :] - at(r, ridx[:, None, None], srcc[None]))
        / at(unit, ridx[:, None, None], srcc[None]))
  cmp_c = outs[:, None, :] & ok[None]  # (S, 17, cw)
  rsrc = ridx[None, :] - shifts[:, None]  # (17, S)
  rok = (rsrc >= 0) & (rsrc < rows)
  rsrcc = jnp.clip(rsrc, 0, rows - 1)[:, :, None]
  zr = (jnp.abs(ts[None] - at(r, rsrcc, cidx[None, None, :]))
        / at(unit, rsrcc, cidx[None, None, :]))
  cmp_r = outs[None] & rok[:, :, None]  # (17, S, cw)
  square = (jnp.asarray(rows) == cols) & (jnp.asarray(rows) > 1)
  zt = jnp.where(
      square, jnp.abs(ts - at(r, cidx[None, :], ridx[:, None]))
      / at(unit, cidx[None, :], ridx[:, None]), jnp.inf)
  # The column shifts', the row shifts' and the transpose's medians as rows
  # of one bisection: the same order statistics, a third of its operations
  # (GPT's 13 records: 169 -> 145 ms).
  ns = len(shifts)
  meds = _masked_median(
      jnp.concatenate([jnp.moveaxis(zc, 1, 0).reshape(ns, -1),
                       zr.reshape(ns, -1), zt.reshape(1, -1)]),
      jnp.concatenate([jnp.moveaxis(cmp_c, 1, 0).reshape(ns, -1),
                       cmp_r.reshape(ns, -1), outs.reshape(1, -1)]), axis=1)
  best = jnp.min(meds)
  # The best placement must stand out: its median distance at most 1/64 of
  # the typical placement's (else no value sits somewhere else: a dense
  # fault that moves every element, such as a stuck exponent bit).
  typical = jnp.nanmedian(jnp.where(jnp.isfinite(meds), meds, jnp.nan))
  distinct = jnp.isfinite(best) & (64.0 * best <= jnp.nan_to_num(
      typical, nan=0.0))
  tol = jnp.where(distinct, jnp.maximum(theta_g, DENSE_FACTOR * best), -1.0)
  col_m = jnp.sum((zc <= tol) & cmp_c, axis=(0, 2), dtype=jnp.int32)
  col_n = jnp.sum(cmp_c, axis=(0, 2), dtype=jnp.int32)
  row_m = jnp.sum((zr <= tol) & cmp_r, axis=(1, 2), dtype=jnp.int32)
  row_n = jnp.sum(cmp_r, axis=(1, 2), dtype=jnp.int32)
  n = jnp.sum(outs, dtype=jnp.int32)
  tshare = _safe_div(jnp.sum((zt <= tol) & outs).astype(jnp.float32),
                     n.astype(jnp.float32))
  # A share only from MIN_COMPARED positions up (as the bitwise tests).
  share = lambda m, k: jnp.where(k >= 8, m / jnp.maximum(k, 1), 0.0).astype(
      jnp.float32)
  return share(col_m, col_n), share(row_m, row_n), tshare, n


class Envelope(NamedTuple):
  """The golden rounding envelope of one record, in units of ``u * scale``
  (the module doc): what the decomposition and the triage screen share.

  Attributes (arrays flat, :mod:`._layout`; ``cdt`` the compute dtype):
    lay: the record's :class:`~._layout.Layout`.
    t2, g2: the records flat, in their dtype.
    tc, gc: the same in ``cdt``.
    fin_t, fin_g: where they are finite (False on the padding).
    r, lo: the reference's two halves (golden and zero without one).
    fp: finite pairs with a finite reference.
    row_rms: each row's size (the module doc's floors applied), per row.
    scale: ``|r| + row_rms``.
    unit: ``u * scale`` (at least the format's tiny).
    et, eg: ``|t - r|``, ``|g - r|`` over ``fp`` (0 elsewhere).
    zt, zg: those in units.
    golden_z: max ``zg``.
    theta_g: the golden envelope (``ENVELOPE_FACTOR`` x ...).
    new_nf: NaN/Inf in t where g is finite.
    beyond: elements beyond the golden envelope, or ``new_nf``.
    z_max_test: max ``zt``.
    n_beyond: int32: the elements ``beyond``.
    n_nonfinite_mismatch: int32: elements NaN or Inf in one of t, g only.
    has_ref: whether a reference was given (static).
  """

  lay: Layout
  t2: Array
  g2: Array
  tc: Array
  gc: Array
  fin_t: Array
  fin_g: Array
  r: Array
  lo: Array
  fp: Array
  row_rms: Array
  scale: Array
  unit: Array
  et: Array
  eg: Array
  zt: Array
  zg: Array
  golden_z: Array
  theta_g: Array
  new_nf: Array
  beyond: Array
  z_max_test: Array
  n_beyond: Array
  n_nonfinite_mismatch: Array
  has_ref: bool


def envelope(t: Array, g: Array, ref_hi: Array | None,
             ref_lo: Array | None, dims=None) -> Envelope:
  """The golden envelope of one record (traced; see the module doc).

  Args:
    t, g, ref_hi, ref_lo, dims: as :func:`decompose`.

  Returns:
    An :class:`Envelope`.
  """
  dtype = np.dtype(t.dtype)
  t2, rows, cols, slots = flat(t, dims)
  g2 = g.reshape(-1)
  lay = layout(t2.shape[0], rows, cols, slots)
  cap = lay.cap
  cdt = jnp.float64 if dtype == np.float64 else jnp.float32
  u = float(_core.format_of(dtype).unit_roundoff)
  tc, gc = t2.astype(cdt), g2.astype(cdt)
  fin_t, fin_g = jnp.isfinite(tc) & lay.valid, jnp.isfinite(gc) & lay.valid
  if ref_hi is None:
    r = jnp.where(fin_g, gc, 0.0)
    lo = jnp.zeros_like(r)
    has_ref = False
  else:
    r = ref_hi.reshape(-1).astype(cdt)
    lo = ref_lo.reshape(-1).astype(cdt)
    has_ref = True
  fin_r = jnp.isfinite(r)
  fp = fin_t & fin_g & fin_r
  r = jnp.where(fin_r & lay.valid, r, 0.0)
  lo = jnp.where(lay.valid, lo, 0.0)
  # Row scale: the RMS of the reference over the row.
  # (Counts as floats: one scatter for both; exact below 2**24 a row, and
  # a mean's denominator beyond.)
  row_n, row_ss = rows_sum(lay, fp.astype(r.dtype),
                           jnp.where(fp, r * r, 0.0))
  row_ms = row_ss / jnp.maximum(row_n, 1)
  row_rms = jnp.sqrt(row_ms)
  all_rms = jnp.sqrt(jnp.sum(row_ms * row_n) / jnp.maximum(jnp.sum(row_n), 1))
  row_rms = jnp.where(row_rms <= CANCELLED_ROW * all_rms, all_rms, row_rms)
  if dtype.itemsize == 2:
    row_rms = jnp.maximum(row_rms, ROW_FLOOR16 * all_rms)
  scale = jnp.abs(r) + per_element(lay, row_rms)
  # The unit is floored at the smallest normal: u * scale underflows for
  # outputs below tiny / u (2e-31 in float32), and XLA flushes subnormal
  # results, which made every z there 0/0 (an envelope of NaN units).
  tiny = jnp.finfo(cdt).tiny
  unit = jnp.maximum(u * scale, tiny)
  et = jnp.where(fp, jnp.abs((jnp.where(fin_t, tc, 0.0) - r) - lo), 0.0)
  eg = jnp.where(fp, jnp.abs((jnp.where(fin_g, gc, 0.0) - r) - lo), 0.0)
  zt = et / unit
  zg = eg / unit
  # The maxima, then the counts, each pair in one variadic reduction (on
  # XLA:CPU every separate reduction materializes its input: the screen
  # read the record's arrays once per fact). Maxima and integer sums do
  # not depend on the order.
  zero = jnp.zeros((), cdt)
  z_max_test, zg_max = lax.reduce(
      (zt, zg), (zero, zero),
      lambda x, y: (jnp.maximum(x[0], y[0]), jnp.maximum(x[1], y[1])), (0,))
  if has_ref:
    golden_z = zg_max
    factor, min_z = ((ENVELOPE16_FACTOR, ENVELOPE16_MIN_Z)
                     if dtype.itemsize <= 2 else
                     (ENVELOPE_FACTOR, ENVELOPE_MIN_Z))
    theta_g = factor * jnp.maximum(golden_z, min_z)
  else:
    golden_z = jnp.float32(0)
    theta_g = jnp.asarray(NO_REFERENCE_Z, cdt)
  new_nf = fin_g & ~fin_t
  beyond = (fp & (zt > theta_g)) | new_nf
  mismatch = ((jnp.isnan(tc) != jnp.isnan(gc)) |
              (jnp.isinf(tc) != jnp.isinf(gc))) & lay.valid
  n_beyond, n_mismatch = lax.reduce(
      (beyond.astype(jnp.int32), mismatch.astype(jnp.int32)),
      (jnp.int32(0), jnp.int32(0)),
      lambda x, y: (x[0] + y[0], x[1] + y[1]), (0,))
  return Envelope(lay, t2, g2, tc, gc, fin_t, fin_g, r, lo, fp, row_rms,
                  scale, unit, et, eg, zt, zg, golden_z, theta_g, new_nf,
                  beyond, z_max_test, n_beyond, n_mismatch, has_ref)


def _sample_flat(lay: Layout) -> Array | None:
  """The percentile sample's positions (``_sample_index`` of the record's
  n, traced): None when the flat arrays hold at most PCT_SAMPLE elements
  (every element; the padding is masked by the caller)."""
  if lay.cap <= PCT_SAMPLE:
    return None
  w = jnp.asarray(lay.n, jnp.int32) // PCT_SAMPLE
  kk = jnp.arange(PCT_SAMPLE, dtype=jnp.int32)
  hh = jnp.asarray(sample_jitter().astype(np.uint32))
  strided = kk * w + (hh % jnp.maximum(w, 1).astype(jnp.uint32)).astype(
      jnp.int32)
  return jnp.where(w > 0, strided, kk)


def decompose(t: Array, g: Array, ref_hi: Array | None,
              ref_lo: Array | None, dims=None) -> Decomposition:
  """The decomposition fields of one record (traced; see the module doc).

  Args:
    t: test record (validated float dtype, any shape), or with ``dims``
      flat and padded to its size bucket (:mod:`._layout`).
    g: golden record, same shape and dtype.
    ref_hi: float32 high part of the float64 reference, or None.
    ref_lo: its low part, or None.
    dims: None, or the record's :class:`~._layout.Dims` (R and C traced):
      then its per-row and per-column fields have ``dims.lines`` slots
      (zero beyond R and C).

  Returns:
    A :class:`Decomposition`.
  """
  dtype = np.dtype(t.dtype)
  nbits = dtype.itemsize * 8
  cdt = jnp.float64 if dtype == np.float64 else jnp.float32
  fmt = _core.format_of(dtype)
  e = envelope(t, g, ref_hi, ref_lo, dims)
  lay = e.lay
  cap = lay.cap
  t2, g2, tc, gc, fin_t, fin_g = e.t2, e.g2, e.tc, e.gc, e.fin_t, e.fin_g
  r, lo, fp, scale, unit = e.r, e.lo, e.fp, e.scale, e.unit
  et, zt, zg, golden_z, theta_g = e.et, e.zt, e.zg, e.golden_z, e.theta_g
  new_nf, beyond, has_ref = e.new_nf, e.beyond, e.has_ref
  tiny = jnp.finfo(cdt).tiny
  # The KUT's own dense error (a port that rounds its inputs to bf16 is
  # beyond the golden envelope everywhere): outliers are also beyond
  # DENSE_FACTOR times its median, read from the percentile sample.
  sidx = _sample_flat(lay)
  pick = (lambda a: a) if sidx is None else (lambda a: a[sidx])
  # (Over elements whose reference is not exactly zero: a masked softmax
  # entry or a ReLU's zero is trivially exact and says nothing of the
  # kernel's rounding.)
  live = fp & (r != 0)
  zmed_t = _sample_median(pick(zt), pick(live))
  zmed_g = _sample_median(pick(zg), pick(live))
  # (A 16-bit record's outliers lie beyond its floor, OUTLIER16_MIN_Z,
  # far above a rounding's spread in its units: no spread term there.)
  spread = (_spread_envelope(pick(zt), pick(live)) if dtype.itemsize > 2
            else 0.0)
  theta = jnp.maximum(theta_g, jnp.maximum(DENSE_FACTOR * zmed_t, spread))
  if has_ref and dtype.itemsize <= 2:
    theta = jnp.maximum(theta, OUTLIER16_MIN_Z)
  env = theta * unit
  uty = _uint(dtype)
  ut = lax.bitcast_convert_type(t2, uty)
  ug = lax.bitcast_convert_type(g2, uty)
  # The base (module doc of ._base): outputs rounded to a coarser format,
  # fitted by synthesis, when it explains more elements than the golden
  # envelope does; else the golden kernel with the KUT's own dense noise.
  slack = theta_g * unit
  base = fit_rounded_base(ut, tc, gc, r, lo, fp, e.beyond, slack, dtype)
  golden_ok = fp & (zt <= theta_g)
  n_golden_ok = jnp.sum(golden_ok, dtype=jnp.int32)
  best = jnp.max(base.explained)
  use_rounded = ((base.fmt >= 0) & (best > n_golden_ok)
                 & (best >= BASE_MIN_SHARE * jnp.sum(fp)))
  rounded = base.rounded & ~golden_ok
  # Over a rounded base the residual is exact, unless its unexplained
  # elements are many and near the interval (inputs rounded too): then
  # outliers lie beyond DENSE_FACTOR x their median excess (._base).
  unexpl = fp & ~(base.rounded | golden_ok)
  excess = excess_ulps(tc, r, lo, slack, base.spec[0], base.spec[1],
                       base.mode)
  med_e = _sample_median(pick(excess), pick(unexpl))
  n_unexpl = jnp.sum(unexpl, dtype=jnp.int32)
  dense_r = ((n_unexpl >= DENSE_RESIDUAL_SHARE * lay.n)
             & (n_unexpl >= DENSE_RESIDUAL_MIN) & (med_e <= NEAR_ULPS))
  theta_e = jnp.where(dense_r, DENSE_FACTOR * med_e, 0.0)
  # Over the golden base, elements that are the format's rounding are no
  # outliers (part of an output rounded), once they are too many to be
  # a coincidence (DENSE_RESIDUAL_MIN).
  n_rounded = jnp.sum(rounded, dtype=jnp.int32)
  partial = base.rounded & (n_rounded >= DENSE_RESIDUAL_MIN)
  # Over a rounded base that holds BASE_REPRESENTABLE of the elements on
  # its format's lattice, an element off the lattice is an outlier
  # however near it lies: no rounding into the format leaves one (a
  # flipped low bit of a value stored through bf16). Not below the
  # format's smallest normal, where conversions keep, flush or round
  # subnormals each their own way.
  on_lattice = representable_in(ut, dtype, *base.spec) & fp
  lattice = use_rounded & (
      jnp.sum(on_lattice, dtype=jnp.int32)
      >= BASE_REPRESENTABLE * jnp.sum(fp, dtype=jnp.int32))
  normal_fmt = jnp.abs(tc) >= jnp.ldexp(jnp.ones((), tc.dtype), base.spec[1])
  off_lattice = fp & ~on_lattice & lattice & normal_fmt
  out = jnp.where(use_rounded, (unexpl & (excess > theta_e)) | off_lattice,
                  fp & (zt > theta) & ~partial) | new_nf
  n_rounded = jnp.where(use_rounded | (n_rounded >= DENSE_RESIDUAL_MIN),
                        n_rounded, 0)

  def explains(bits, v, at=None):
    """Whether values ``v`` (bit patterns ``bits``) at places ``at`` (all
    when None) are inside the fitted base."""
    pick_at = (lambda a: a) if at is None else (lambda a: a[at])
    rr, ll, sl = pick_at(r), pick_at(lo), pick_at(slack)
    d = jnp.abs((v - rr) - ll)
    by_round = rounded_explains(bits, v, rr, ll, sl, base,
                                jnp.where(use_rounded, theta_e, 0.0), dtype)
    off = ~representable_in(bits, dtype, *base.spec) & (
        jnp.abs(v) >= jnp.ldexp(jnp.ones((), v.dtype), base.spec[1]))
    near = (d <= sl) & ~(lattice & off)
    return jnp.where(use_rounded, by_round | near,
                     (d <= pick_at(env)) | by_round)

  n_out = jnp.sum(out, dtype=jnp.int32)
  # Bits of the outliers against golden (over a rounded base: golden
  # rounded to its format, ._base.rounded_bits): how many flips of their
  # highest differing bits bring each back inside the base (counts over
  # all outliers), the positions' histograms over the first
  # MATCH_OUTLIERS of them (in memory order).
  x_golden = ut ^ ug
  ug = jnp.where(use_rounded & fin_g,
                 rounded_bits(ug, dtype, base.spec[0], base.mode), ug)
  x = ut ^ ug
  top1 = top_bit(x, nbits)
  need = flips_needed(ut, ug, explains, dtype)
  flip1 = out & (need == 1)
  flip2 = out & (need == 2)
  flip3 = out & (need == 3)
  # Outliers that differ from golden in at most MAX_FLIPS bits, nothing
  # else moved: a fault's flips on a base that is golden itself (a value
  # drawn like the data differs in about half of its bits; golden's own
  # bits, not rounded: a rounded base's elements lie within a few bits of
  # golden rounded, fault or not).
  exact_flips = out & fin_t & (
      lax.population_count(x_golden).astype(jnp.int32) <= MAX_FLIPS)
  t0 = (ut << jnp.array(1, uty)) == 0
  k = min(MATCH_OUTLIERS, cap)
  idx = first_true(out, k)
  valid = jnp.arange(k) < n_out
  # The flip null at the outliers' places (._base.flip_null).
  n_rec = jnp.maximum(jnp.asarray(lay.n, jnp.int32), 1)
  null_flips = flip_null(tc, ut, ug, idx, valid, fp & ~out & (tc != 0),
                         n_rec, explains, dtype)
  # Outliers beyond the explained elements' range of magnitudes (FAR_FACTOR
  # either way): an exponent flip's, never a value drawn like the data.
  at = jnp.abs(jnp.where(fin_t, tc, 0.0))
  seen = fp & ~out & (at > 0)
  big_in = jnp.max(jnp.where(seen, at, 0.0))
  # (The low end is a quantile of the sample: a flip the envelope hides
  # may itself be the smallest value.)
  n_seen = jnp.sum(pick(seen), dtype=jnp.int32)
  small_in = _sample_quantile(
      pick(at), pick(seen),
      jnp.maximum(jnp.ceil(FAR_QUANTILE * n_seen), 1).astype(jnp.int32))
  far = out & fin_t & ((at > FAR_FACTOR * big_in)
                       | ((at > 0) & (at * FAR_FACTOR < small_in)))
  # ... and outliers clear of the base (._base.CLEAR_FACTOR), far ones
  # and NaN/Inf included: not the tail of the base's own dense error. In
  # a 32- or 64-bit record, CLEAR_FACTOR times beyond the largest element
  # the base explains (at most theta): a dense error's tail is
  # continuous, its largest elements within a small factor of one
  # another (a sum's rounding: the largest of 10**4 within 1.5x of the
  # tenth largest), while a fault's value stands apart. In a 16-bit
  # record beyond CLEAR_FACTOR x theta: its floor (OUTLIER16_MIN_Z) sits
  # far above its base's rounding, and a value drawn like the data comes
  # back within a flip or two of its place often there (the flip null
  # reads 0.4-0.9).
  z_in = jnp.max(jnp.where(fp & ~out & (zt <= theta), zt, 0.0))
  if dtype.itemsize <= 2:
    z_in = theta
  clear = out & (new_nf | far | jnp.where(
      use_rounded, excess > CLEAR_FACTOR * jnp.maximum(theta_e, 1.0),
      zt > CLEAR_FACTOR * z_in))
  # ... and the shoulder below the outlier threshold (within CLEAR_FACTOR
  # of it, not outliers): a dense error's tail fills it, a fault's
  # outliers stand apart from an empty one.
  shoulder = fp & ~out & jnp.where(
      use_rounded, excess * CLEAR_FACTOR > theta_e,
      zt * CLEAR_FACTOR > theta) & jnp.where(use_rounded, theta_e > 0, True)
  bitpos = jnp.arange(nbits)
  xk = x[idx]
  xbits = ((xk[:, None] >> bitpos.astype(uty)) & jnp.array(1, uty)).astype(
      jnp.int32)
  out_bits_xor = jnp.sum(jnp.where(valid[:, None], xbits, 0), axis=0,
                         dtype=jnp.int32)
  f1 = (flip1[idx] & valid)[:, None]
  at_bit = jnp.where(f1, top1[idx][:, None] == bitpos, False)
  flip_bits = jnp.sum(at_bit, axis=0, dtype=jnp.int32)
  t_set = ((ut[idx][:, None] >> bitpos.astype(uty))
           & jnp.array(1, uty)) == 1
  flip_up = jnp.sum(at_bit & t_set, axis=0, dtype=jnp.int32)
  out_i = out.astype(jnp.int32)
  # Values in the wrong place are sought among the elements beyond the
  # golden envelope (a dense base: a shift moves them all), or among the
  # outliers over a rounded base (which puts every element beyond it).
  beyond = jnp.where(use_rounded, out, beyond)
  beyond_i = beyond.astype(jnp.int32)
  out_rows, beyond_rows = rows_sum(lay, out_i, beyond_i)
  out_cols, beyond_cols = cols_sum(lay, out_i, beyond_i)
  out_lane = seg_sum(out_cols, jnp.arange(lay.col_slots) % LANES, LANES)
  tiles_any, tiles_all = _tiles(out, lay)
  tv_all = jnp.where(fin_t, tc, 0.0)
  # (Zeros say nothing of where a value came from: the zero hypotheses'.)
  scol, srow, str_, sn = _shift_stats(tv_all, r, unit, theta_g,
                                      beyond & (tc != 0),
                                      beyond_rows, beyond_cols, lay)
  # Values moved among themselves (a permutation): the outliers' values,
  # sorted, equal their references, sorted, within the envelope. Only when
  # every outlier is among the MATCH_OUTLIERS gathered.
  tv_k = jnp.where(valid, tv_all[idx], 0.0)
  rv_k = jnp.where(valid, r[idx], 0.0)
  ev_k = jnp.where(valid, env[idx], 0.0)
  big = jnp.asarray(jnp.finfo(cdt).max, cdt)
  st = _sort_finite(jnp.where(valid, tv_k, big))
  sr = _sort_finite(jnp.where(valid, rv_k, big))
  tol = jnp.max(ev_k)
  moved = jnp.where(n_out <= k, jnp.sum(valid & (jnp.abs(st - sr) <= tol),
                                        dtype=jnp.int32), 0)
  nmatch = jnp.where(n_out <= k, jnp.sum(valid, dtype=jnp.int32), 0)
  # A permutation's sorted values meet their sorted references where its
  # unsorted ones do not: the outliers' error before and after sorting.
  fin_k = valid & (st < big) & (sr < big)
  out_err_sum = jnp.sum(jnp.where(valid & jnp.isfinite(tv_k),
                                  jnp.abs(tv_k - rv_k), 0.0))
  out_sorted_err = jnp.sum(jnp.where(fin_k, jnp.abs(st - sr), 0.0))
  # Dense part: normalized signed error inside the envelope.
  inside = fp & ~out
  en = jnp.where(inside, ((jnp.where(fin_t, tc, 0.0) - r) - lo) / jnp.maximum(
      scale, tiny), 0.0)
  nin = jnp.maximum(jnp.sum(inside), 1)
  in_ms = jnp.sum(en * en) / nin
  in_rms = jnp.sqrt(in_ms)
  in_bias = _safe_div(jnp.sum(en) / nin, in_rms)
  # Per-row least squares of d = t - r on r (finite pairs, all elements).
  d = jnp.where(inside, (jnp.where(fin_t, tc, 0.0) - r) - lo, 0.0)
  rr = jnp.where(inside, r, 0.0)
  srr, srd, sdd = rows_sum(lay, rr * rr, rr * d, d * d)
  row_delta = _safe_div(srd, srr)
  row_res = jnp.maximum(sdd - row_delta * srd, 0.0)
  row_resid = jnp.sqrt(_safe_div(row_res, srr))
  row_err = jnp.sqrt(_safe_div(sdd, srr))
  tot_rr, tot_rd, tot_dd = jnp.sum(srr), jnp.sum(srd), jnp.sum(sdd)
  fit_delta = _safe_div(tot_rd, tot_rr)
  fit_resid = jnp.sqrt(_safe_div(jnp.maximum(tot_dd - fit_delta * tot_rd, 0.0),
                                 tot_rr))
  # A function of the value: on the percentile sample, bins of sign(r) and
  # quarter octaves of |r| / rms(r); the share of the normalized error's
  # variance that lies between bins (1: the error is a function of r).
  grms = jnp.sqrt(tot_rr / jnp.maximum(jnp.sum(inside), 1))
  rs, ds, ws = pick(r), pick(d), pick(inside)
  q = jnp.floor(4.0 * jnp.log2(jnp.maximum(jnp.abs(rs), tiny) /
                               jnp.maximum(grms, tiny)))
  half = VALUE_BINS // 2
  bins = jnp.clip(q + half // 2, 0, half - 1).astype(jnp.int32) + jnp.where(
      rs < 0, half, 0)
  # Relative to max(|r|, the tensor's RMS): a function of the value is
  # one whatever the row (an elementwise kernel's rows are arbitrary).
  ef = jnp.where(ws, ds / jnp.maximum(jnp.maximum(jnp.abs(rs), grms), tiny),
                 0.0)
  w = ws.astype(cdt)
  cnt = jnp.zeros((VALUE_BINS,), cdt).at[bins].add(w)
  s1 = jnp.zeros((VALUE_BINS,), cdt).at[bins].add(ef * w)
  ntot = jnp.maximum(jnp.sum(w), 1.0)
  mean = jnp.sum(s1) / ntot
  tot_var = jnp.sum(w * (ef - mean) ** 2)
  between = jnp.sum(_safe_div(s1 * s1, cnt)) - ntot * mean * mean
  value_r2 = _safe_div(between, tot_var)
  # Tiny golden values of each narrow format, and those zeroed in t.
  ag = jnp.abs(jnp.where(fin_g, gc, 0.0))
  tiny_n, tiny_z = [], []
  for name in _core.NARROW_FORMATS:
    below = fin_g & (ag > 0) & (ag < _core.FORMATS[name].min_normal)
    tiny_n.append(jnp.sum(below, dtype=jnp.int32))
    tiny_z.append(jnp.sum(below & t0, dtype=jnp.int32))
  # The per-metric ratio view: KUT and golden each against the reference.
  small = SMALL_VALUE[fmt.name]
  ar = jnp.abs(r)
  big = fp & (ar >= small)
  tiny_r = fp & (ar < small)
  dt = jnp.where(fp, (jnp.where(fin_t, tc, 0.0) - r) - lo, 0.0)
  dg = jnp.where(fp, (jnp.where(fin_g, gc, 0.0) - r) - lo, 0.0)
  rel = lambda e: jnp.max(jnp.where(big, jnp.abs(e) / jnp.maximum(ar, tiny),
                                    0.0))
  bal = lambda e: _safe_div(jnp.sum(e), jnp.sum(jnp.abs(e)))
  # ulp of r in the record's format: 2**(exponent - mantissa bits), at
  # least the smallest subnormal's spacing.
  ex = jnp.floor(jnp.log2(jnp.maximum(ar, fmt.min_normal)))
  ulp = jnp.exp2(ex - fmt.mantissa_bits)
  lim = ULP_LIMIT[fmt.name] * ulp
  f32 = lambda v: jnp.asarray(v, jnp.float32)
  return Decomposition(
      jnp.bool_(True), f32(theta), f32(theta_g), f32(golden_z), f32(zmed_t),
      f32(zmed_g), f32(e.z_max_test), e.n_beyond, n_out,
      jnp.sum(out & t0, dtype=jnp.int32), jnp.sum(flip1, dtype=jnp.int32),
      jnp.sum(flip2, dtype=jnp.int32), jnp.sum(flip3, dtype=jnp.int32),
      null_flips, jnp.sum(far, dtype=jnp.int32),
      jnp.sum(clear, dtype=jnp.int32), jnp.sum(shoulder, dtype=jnp.int32),
      jnp.sum(exact_flips, dtype=jnp.int32),
      moved, nmatch, flip_bits,
      flip_up,
      out_bits_xor, out_lane, out_rows,
      out_cols, tiles_any, tiles_all, scol,
      srow, f32(str_), sn, f32(jnp.max(jnp.where(out & fp, et, 0.0))),
      f32(in_rms), f32(in_bias), f32(row_delta), f32(row_resid),
      f32(row_err), f32(fit_delta), f32(fit_resid),
      f32(jnp.clip(value_r2, 0.0, 1.0)), jnp.stack(tiny_n), jnp.stack(tiny_z),
      f32(rel(dt)), f32(rel(dg)), jnp.sum(tiny_r, dtype=jnp.int32),
      jnp.sum(tiny_r & (jnp.abs(dt) > small / 16), dtype=jnp.int32),
      jnp.sum(tiny_r & (jnp.abs(dg) > small / 16), dtype=jnp.int32),
      f32(bal(dt)), f32(bal(dg)),
      jnp.sum(fp & (jnp.abs(dt) > lim), dtype=jnp.int32),
      jnp.sum(fp & (jnp.abs(dg) > lim), dtype=jnp.int32),
      e.n_nonfinite_mismatch, n_rounded, f32(out_err_sum),
      f32(out_sorted_err),
      jnp.where(use_rounded, base.fmt, -1).astype(jnp.int32),
      jnp.where(base.fmt >= 0, base.fmt, -1).astype(jnp.int32), base.mode,
      base.explained, base.ties, n_golden_ok)
