"""Finalization: a SignatureState's partial statistics -> the Signature,
and the Signature's relative errors against a floor (the tensor's scale).

An element's relative error ``|t - g| / |g|`` is absurd where golden is
near zero (a value of 1e-38 off by 1e-7 is "1e+31 relative"), and such
elements decide a maximum or an RMS. Reported relative errors take each
element's error relative to ``max(|g|, RMS of golden)``: below the
tensor's scale an error counts against the scale. From the signature's
fields this is bounded by ``min(relative, absolute / RMS of golden)`` for
the maximum and for the RMS alike (each element's floored ratio is at
most both), which is what :func:`relative_to_scale` returns.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax.numpy as jnp
from jax import lax

from peat_jax.analyzer.signature._bits import _combine_scaled
from peat_jax.analyzer.signature._decompose import Decomposition
from peat_jax.analyzer.signature._decompose import empty as empty_decomposition
from peat_jax.analyzer.signature._bits import _div_by_max
from peat_jax.analyzer.signature._layout import seg_sum, tile_counts
from peat_jax.analyzer.signature._signature import (
    Array, HIST_BUCKETS, LANES, PERCENTILES, SHIFT_MIN_COMPARED, SHIFT_RANGE,
    Signature, SignatureState, _F_BIT_EQUAL, _F_FINITE_PAIR,
    _F_FLUSHED, _F_GOLDEN_SUBNORMAL, _F_GOLDEN_ZERO, _F_INF_G, _F_INF_T,
    _F_LOG_OK, _F_MAG_LARGER, _F_MAG_SMALLER, _F_NAN_G, _F_NAN_T, _F_NEG_ERR,
    _F_NONFINITE_NEW, _F_OVERFLOW, _F_POS_ERR, _F_RATIO_OK, _F_SATURATED,
    _F_SAT_E4M3, _F_SAT_FP16, _F_SIGN_FLIP, _F_VALUE_EQUAL, _F_ZEROED)


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


def _finalize(s: SignatureState, dec: Decomposition | None = None,
              dims=None) -> Signature:
  """SignatureState -> Signature (pure).

  Args:
    s: the state.
    dec: the record's decomposition, or None (neutral fields).
    dims: None (R and C from the state's row and column fields), or the
      record's :class:`~._layout.Dims` when those fields are a size
      bucket's slots (:mod:`._layout`): they stay that long.
  """
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
  if dims is None:
    rows, cols = s.row_ndiff.shape[0], s.col_ndiff.shape[0]
  else:
    rows, cols = dims.rc[0], dims.rc[1]
  steps_c = jnp.maximum(s.steps, 1).astype(cdt)
  # Lanes (the column fields are zero beyond the record's columns).
  ccap = s.col_ndiff.shape[0]
  lane_ndiff = seg_sum(s.col_ndiff, jnp.arange(ccap) % LANES, LANES)
  # Tiles.
  tot, anyd, alld = tile_counts(s.tile_ndiff, rows, cols, s.steps)
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
      tiles_total=tot * s.steps,
      tiles_any=anyd,
      tiles_all=alld,
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
      **(dec if dec is not None else empty_decomposition(
          s.row_ndiff.shape[-1], s.col_ndiff.shape[-1],
          s.bits_up.shape[-1]))._asdict(),
  )


def relative_to_scale(s: Mapping[str, Any]) -> dict[str, float]:
  """The maximum and RMS relative error with the tensor's scale as floor.

  Args:
    s: a signature's scalar fields (``Signature._asdict()`` or a record's
      ``signature``): ``rel_max``, ``rel_rms``, ``abs_max``, ``abs_rms``,
      ``golden_rms``.

  Returns:
    ``{"rel_max": ..., "rel_rms": ...}``: each the smaller of the plain
    relative figure and the absolute one over golden's RMS; NaN where a
    figure is NaN (never a smaller number in its place), and the plain
    relative figure where golden's RMS is zero or not finite.
  """
  scale = float(s["golden_rms"])
  out = {}
  for k in ("max", "rms"):
    rel, ab = float(s[f"rel_{k}"]), float(s[f"abs_{k}"])
    if math.isnan(rel) or math.isnan(ab):
      out[f"rel_{k}"] = math.nan
    elif scale > 0 and math.isfinite(scale):
      out[f"rel_{k}"] = min(rel, ab / scale)
    else:
      out[f"rel_{k}"] = rel
  return out
