"""The pure-JAX statistics pass: one read of the elements -> SignatureState.

`_accumulate` (values) and `_accumulate_bits` (bit patterns made by a
separate executable) compute every partial statistic of a record; `_merge`
combines two states (the streaming form's update)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax.analyzer.signature._bits import (
    _combine_scaled, _from_bits, _hist_index, _merge_scaled, _representable,
    _row_scaled_sumsq, _sample_index, _uint)
from peat_jax.analyzer.signature._count import _count_pass
from peat_jax.analyzer.signature._layout import view2d
from peat_jax.analyzer.signature._signature import (
    Array, HIST_BUCKETS, SHIFT_RANGE, SHIFT_SAMPLE_ROWS, SHIFT_WINDOW,
    SignatureState, _DTYPE_CODE, _MAX_FIELDS, _MIN_FIELDS, _SCALED, _SUPPORTED)


def _sample_rows(rows, cw, slots: int):
  """The shift tests' sampled rows: ``round(linspace(0, R - 1, S))`` with
  S = min(R, SHIFT_SAMPLE_ROWS, max(2, ceil(SHIFT_WINDOW / cw))), as
  int32[slots] and the mask of the first S (exact integer rounding, half
  to even as NumPy's; R and cw may be traced, ``slots`` >= S static)."""
  rows = jnp.asarray(rows, jnp.int32)
  nsamp = jnp.minimum(jnp.minimum(rows, SHIFT_SAMPLE_ROWS),
                      jnp.maximum(2, -(-SHIFT_WINDOW // cw)))
  k = jnp.arange(slots, dtype=jnp.int32)
  den = jnp.maximum(nsamp - 1, 1)
  num = k * (rows - 1)
  q, rem = num // den, num % den
  up = (2 * rem > den) | ((2 * rem == den) & (q % 2 == 1))
  ridx = jnp.where(nsamp > 1, q + up.astype(jnp.int32), 0)
  return jnp.clip(ridx, 0, rows - 1), k < nsamp


def _shift_tests(tb: Array, gb: Array, rows, cols):
  """Bitwise match counts of t against shifted/transposed g (sampled rows).

  ``tb``, ``gb``: the records' bit patterns flat (:mod:`._layout`: R x C
  row-major, then padding), R and C Python ints or traced; a record at
  its own shape (R x C its size, ints) goes to `_shift_tests_static`, the
  same counts. Here: gathers of the sampled rows' first min(C,
  SHIFT_WINDOW) columns: g at every column shift, g's rows at every row
  shift. Only informative
  positions are compared: t differs from g there (bitwise) and is not +-0.
  Equal elements say nothing about where t's values came from, and on
  sparse arrays (a gradient that is zero but for a few rows) equal zeros
  would match any shift; a KUT that zeroes elements is not a shift.
  """
  cap = tb.shape[0]
  if isinstance(rows, int) and isinstance(cols, int) and cap == rows * cols:
    return _shift_tests_static(tb, gb, rows, cols)
  cws, slots = min(cap, SHIFT_WINDOW), SHIFT_SAMPLE_ROWS
  cw = jnp.minimum(cols, SHIFT_WINDOW)
  ridx, rok_s = _sample_rows(rows, cw, slots)
  shifts = np.arange(-SHIFT_RANGE, SHIFT_RANGE + 1)
  j = jnp.arange(cws, dtype=jnp.int32)
  at = lambda a, r, c: a[jnp.clip(r * cols + c, 0, cap - 1)]
  ts = at(tb, ridx[:, None], j[None, :])  # (S, cw)
  here = rok_s[:, None] & (j < cw)[None, :]
  # Informative positions: t != g bitwise and t not +-0 (sign bit dropped).
  inf = (ts != at(gb, ridx[:, None], j[None, :])) & ((ts << 1) != 0) & here
  # Columns: t[i, j] vs g[i, j - s].
  src = j[None, :] - shifts[:, None]  # (17, cw)
  ok = (src >= 0) & (src < cols)
  gsh = at(gb, ridx[:, None, None], jnp.clip(src, 0, cols - 1)[None])
  # Rows: t[i, j] vs g[i - s, j].
  rsrc = ridx[None, :] - shifts[:, None]  # (17, S)
  rok = (rsrc >= 0) & (rsrc < rows)
  grs = at(gb, jnp.clip(rsrc, 0, rows - 1)[:, :, None], j[None, None, :])
  col_m, col_n, row_m, row_n = _shift_counts(ts, inf, gsh, ok, grs, rok)
  # Transpose (R == C > 1): g[j, i] for sampled i, j < cw.
  square = (jnp.asarray(rows) == cols) & (jnp.asarray(rows) > 1)
  gt = at(gb, j[None, :], ridx[:, None])
  tr_m = jnp.where(square, jnp.sum((ts == gt) & inf, dtype=jnp.int32), 0)
  tr_n = jnp.where(square, jnp.sum(inf, dtype=jnp.int32), 0)
  return col_m, col_n, row_m, row_n, tr_m, tr_n


def _shift_counts(ts, inf, gsh, ok, grs, rok):
  """The column and row shifts' match and compared counts: ``ts`` (S, cw)
  against ``gsh`` (S, 17, cw), g at each column shift, where ``ok``
  (17, cw), and against ``grs`` (17, S, cw), g at each row shift, where
  ``rok`` (17, S); only at informative positions ``inf`` (S, cw)."""
  cmp_c = inf[:, None, :] & ok[None]
  col_m = jnp.sum((ts[:, None, :] == gsh) & cmp_c, axis=(0, 2),
                  dtype=jnp.int32)
  col_n = jnp.sum(cmp_c, axis=(0, 2), dtype=jnp.int32)
  cmp_r = inf[None] & rok[:, :, None]
  row_m = jnp.sum((ts[None] == grs) & cmp_r, axis=(1, 2), dtype=jnp.int32)
  row_n = jnp.sum(cmp_r, axis=(1, 2), dtype=jnp.int32)
  return col_m, col_n, row_m, row_n


def _shift_tests_static(tb: Array, gb: Array, rows: int, cols: int):
  """`_shift_tests` of a record at its own shape (R x C = its size): the
  same counts from row copies and static slices. The general form
  gathers every compared element by its own index (~280 K elements a
  record, ~0.6 ms on a 2-core CPU); here the sampled rows are copied
  whole once, each column shift is a static slice of them, each row
  shift a copy of whole rows, and the transpose is skipped where R != C
  (its counts are 0)."""
  cws = min(cols, SHIFT_WINDOW)
  slots = min(rows, SHIFT_SAMPLE_ROWS, max(2, -(-SHIFT_WINDOW // cws)))
  ridx = np.unique(np.linspace(0, rows - 1, slots).round().astype(np.int32))
  t2, g2 = tb.reshape(rows, cols), gb.reshape(rows, cols)
  ts = t2[ridx, :cws]  # (S, cw)
  gs = g2[ridx]  # the sampled rows whole
  inf = (ts != gs[:, :cws]) & ((ts << 1) != 0)
  # Columns: t[i, j] vs g[i, j - s]; gpad[:, SHIFT_RANGE + c] is g[i, c].
  shifts = np.arange(-SHIFT_RANGE, SHIFT_RANGE + 1)
  width = min(cols, cws + SHIFT_RANGE)
  gpad = jnp.pad(gs[:, :width], ((0, 0), (SHIFT_RANGE,
                                         cws + SHIFT_RANGE - width)))
  gsh = jnp.stack([gpad[:, SHIFT_RANGE - s:SHIFT_RANGE - s + cws]
                   for s in shifts], axis=1)  # (S, 17, cw)
  src = np.arange(cws)[None, :] - shifts[:, None]
  ok = (src >= 0) & (src < cols)
  # Rows: t[i, j] vs g[i - s, j].
  rsrc = ridx[None, :] - shifts[:, None]  # (17, S)
  rok = (rsrc >= 0) & (rsrc < rows)
  grs = g2[np.clip(rsrc, 0, rows - 1).reshape(-1)][:, :cws].reshape(
      len(shifts), len(ridx), cws)
  col_m, col_n, row_m, row_n = _shift_counts(ts, inf, gsh, ok, grs, rok)
  if rows == cols and rows > 1:  # transpose: g[j, i] for sampled i, j < cw
    gt = g2[:cws, ridx].T
    tr_m = jnp.sum((ts == gt) & inf, dtype=jnp.int32)
    tr_n = jnp.sum(inf, dtype=jnp.int32)
  else:
    tr_m = tr_n = jnp.int32(0)
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
  rows, cols = view2d(shape)
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

  shifts = _shift_tests(ut.reshape(-1), ug.reshape(-1), rows, cols)

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
