"""Dense tensor models: every element moved by a function of its value.

Saturation, flush to zero, truncation and rounding into a format, and the
port patterns (``parameter``: rows scaled by a constant's
effect; ``approximation``: a bounded error periodic in each octave). Pure
functions ``fn(key, x, **params)`` registered by ``_models``.
"""

from __future__ import annotations

import math

from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from peat_jax.injectors import _rounding as fm


def _saturation(key, x, *, fmt, max_value, mode):
  del key
  limit = max_value if max_value is not None else fm.FORMATS[fmt].max
  lim = fm.largest_at_most(limit, x.dtype)
  big = jnp.abs(x) > lim
  to = jnp.asarray(lim if mode == "clip" else np.inf, x.dtype)
  return jnp.where(big, jnp.where(x > 0, to, -to), x).astype(x.dtype)


def _ftz(key, x, *, fmt):
  del key
  u = fm.to_bits(x)
  ut = u.dtype
  sign = jnp.asarray(1 << (fm.bit_width(x.dtype) - 1), ut)
  if fmt is None:
    thr = np.asarray(ml_dtypes.finfo(x.dtype).smallest_normal, x.dtype)
  else:
    thr = np.asarray(fm.FORMATS[fmt].min_normal, np.float64).astype(x.dtype)
  thr_bits = jnp.asarray(thr.view(fm.uint_dtype(x.dtype)), ut)
  tiny = (u & ~sign) < thr_bits
  return fm.from_bits(jnp.where(tiny, u & sign, u), x.dtype)


def _truncation(key, x, *, fmt):
  del key
  return fm.round_toward_zero(x, fm.FORMATS[fmt])


def _precision(fmt_name):
  def fn(key, x, *, saturate):
    del key
    return fm.round_nearest(x, fm.FORMATS[fmt_name], saturate=saturate)
  return fn


def _parameter(key, x, *, delta):
  """Each row scaled by ``1 + delta * ms / ms_row``: the effect of a
  normalization constant (an epsilon added to a row's mean square ``ms_row``
  moves the row by about ``-eps / (2 ms_row)``) on rows of different size,
  ``ms`` the mean over rows."""
  del key
  w = x.astype(fm.working_dtype(x.dtype))
  cols = x.shape[-1] if x.ndim else 1
  w2 = w.reshape(-1, cols)
  ms = jnp.mean(jnp.square(jnp.where(jnp.isfinite(w2), w2, 0.0)), axis=-1,
                keepdims=True)
  tiny = jnp.finfo(w.dtype).tiny
  rel = jnp.mean(ms) / jnp.maximum(ms, tiny)
  factor = 1.0 + delta * jnp.clip(rel, 0.0, 100.0)
  return (w2 * factor).reshape(x.shape).astype(x.dtype)


#: Peak of s (1 - s) (1 - 2 s) on [0, 1]: sqrt(3) / 18.
_APPROX_PEAK = math.sqrt(3.0) / 18.0


def _approximation(key, x, *, rel):
  """``x (1 + rel w(s))`` with ``s`` the significand's fraction in
  ``[0, 1)`` and ``w(s) = s (1 - s) (1 - 2 s) / peak``: a bounded relative
  error that is a smooth function of the value, periodic in its octave (a
  polynomial evaluated on the significand, as fast exp, reciprocal and
  rsqrt are). Bitwise the same under jit and eagerly."""
  del key
  w = x.astype(fm.working_dtype(x.dtype))
  mant, _ = jnp.frexp(w)
  sfrac = 2.0 * jnp.abs(mant) - 1.0
  # The barriers keep XLA from reassociating the products or contracting
  # ``err`` and ``1 + err`` into a fused multiply-add under jit, which would
  # round differently from the eager path.
  poly = lax.optimization_barrier(sfrac * (1.0 - sfrac) * (1.0 - 2.0 * sfrac))
  err = lax.optimization_barrier((rel / _APPROX_PEAK) * poly)
  ok = jnp.isfinite(w) & (w != 0)
  return jnp.where(ok, w * (1.0 + err), w).astype(x.dtype)
