"""Per-element quantities of the pure-JAX statistics pass.

`_element_words` packs the exactly counted conditions of each element into
uint32 words (flags, bits forced up/down, the smeared ULP distance) and the
order-free hash terms; `_element_floats` computes the float quantities that
are summed, maximized or minimized; `_float_*` reduce and merge them."""

from __future__ import annotations


import jax.numpy as jnp
from jax import lax

from peat_jax import core as _core
from peat_jax.analyzer.signature._bits import (
    _combine_scaled, _from_bits, _hash32, _merge_scaled, _mix32, _ordered,
    _row_scaled_sumsq, _sint, _uint, _words)
from peat_jax.analyzer.signature._signature import (
    Array, _F_BIT_EQUAL, _F_FINITE_PAIR, _F_FLUSHED, _F_GOLDEN_SUBNORMAL,
    _F_GOLDEN_ZERO, _F_INF_G, _F_INF_T, _F_LOG_OK, _F_MAG_LARGER,
    _F_MAG_SMALLER, _F_NAN_G, _F_NAN_T, _F_NEG_ERR, _F_NONFINITE_NEW,
    _F_OVERFLOW, _F_POS_ERR, _F_RATIO_OK, _F_SATURATED, _F_SAT_E4M3,
    _F_SAT_FP16, _F_SIGN_FLIP, _F_VALUE_EQUAL, _F_ZEROED, _N_FLAGS, _bits_of)


# --------------------------------------------------------------------------
# The accumulation pass.
# --------------------------------------------------------------------------


# Saturation targets (csrc/signature_body.h has the same two constants).
_FP16_MAX = _core.FORMATS["fp16"].max
_E4M3_MAX = _core.FORMATS["fp8_e4m3"].max


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
  f[_F_SAT_FP16] = fp & (at == _FP16_MAX) & (ag > _FP16_MAX)
  f[_F_SAT_E4M3] = fp & (at == _E4M3_MAX) & (ag > _E4M3_MAX)
  f[_F_GOLDEN_SUBNORMAL] = gsub
  f[_F_POS_ERR] = d > 0
  f[_F_NEG_ERR] = d < 0
  f[_F_MAG_LARGER] = fp & (at > ag)
  f[_F_MAG_SMALLER] = fp & (at < ag)
  f[_F_SIGN_FLIP] = fp & ~t0 & ~g0 & ((st < 0) != (sg < 0))
  f[_F_RATIO_OK] = fp & gnorm & ~t0
  f[_F_LOG_OK] = fp & (d != 0) & ~g0
  f[_F_GOLDEN_ZERO] = g0
  f[_F_OVERFLOW] = fin_g & jnp.isinf(t) & (ag > _E4M3_MAX)
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
