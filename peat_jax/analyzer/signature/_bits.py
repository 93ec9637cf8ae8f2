"""Element-wise helpers of the statistics pass: bit patterns, hashes,
representability in the narrow formats, scaled sums of squares, histogram
buckets and the percentile sample (all traced, pure JAX)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax import core as _core
from peat_jax.analyzer.signature._signature import (
    Array, NARROW_FORMATS, PCT_SAMPLE, _bits_of)


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
# 10 mantissa bits with float32's range. csrc/signature.h holds the same
# table (kNarrowFormats; a test compares them).
_NARROW_SPECS = {
    k: (f.mantissa_bits, f.emin, f.emax, f.max_significand)
    for k, f in ((k, _core.FORMATS[k]) for k in NARROW_FORMATS)}


def _mix32(u: Array) -> Array:
  """One multiply-xorshift round on uint32 words (the multiset hash's mix)."""
  h = (u ^ (u >> 16)) * jnp.uint32(0x45D9F3B)
  return h ^ (h >> 16)


class Decoded(NamedTuple):
  """A float's bit pattern taken apart for the representability rule."""

  finite: Array  # not Inf or NaN
  zero: Array  # +-0
  sig: Array  # the significand as an integer (implicit bit included)
  low: Array  # int32: exponent of its lowest set bit
  span: Array  # int32: position of its highest set bit in ``sig``
  high: Array  # int32: exponent of its highest set bit


def decode(u: Array, dtype) -> Decoded:
  """Takes unsigned bit patterns ``u`` of float dtype ``dtype`` apart
  (:class:`Decoded`), in integer arithmetic."""
  dtype = np.dtype(dtype)
  finfo = jnp.finfo(dtype)
  nbits = _bits_of(dtype)
  nmant = finfo.nmant
  bias = finfo.maxexp - 1
  ut = u.dtype
  si = jnp.int32
  one = jnp.array(1, ut)
  mag = u & jnp.array((1 << (nbits - 1)) - 1, ut)
  expf = (mag >> jnp.array(nmant, ut)).astype(si)
  man = mag & jnp.array((1 << nmant) - 1, ut)
  normal = expf != 0
  sig = jnp.where(normal, man | jnp.array(1 << nmant, ut), man)
  q = jnp.where(normal, expf, 1) - (bias + nmant)
  low = q + lax.population_count((sig & (~sig + one)) - one).astype(si)
  span = (nbits - 1) - lax.clz(sig).astype(si)  # highest set bit of sig
  return Decoded(expf != (2 * bias + 1), mag == 0, sig, low, span, q + span)


def fits_format(d: Decoded, m, emin, emax, max_top) -> Array:
  """Whether decoded values are exactly representable in a format given by
  its mantissa bits, smallest and largest normal exponent and largest
  significand at ``emax`` (Python ints or traced int32 scalars): finite,
  and +-0 or the lowest set bit of the significand at or above the
  format's resolution at the value (its highest set bit minus ``m``, never
  below the smallest subnormal) and the value at most the format's
  maximum."""
  ut = d.sig.dtype
  shift = d.span - m
  top = jnp.where(shift >= 0, d.sig >> jnp.maximum(shift, 0).astype(ut),
                  d.sig << jnp.maximum(-shift, 0).astype(ut))
  in_range = (d.high < emax) | ((d.high == emax) &
                                (top <= jnp.asarray(max_top).astype(ut)))
  fits = in_range & (d.low >= jnp.maximum(d.high - m, emin - m))
  return d.finite & (d.zero | fits)


def _representable(u: Array, dtype) -> list[Array]:
  """Per NARROW_FORMATS: the value with bit pattern u is exactly representable.

  Exact, in integer arithmetic on the bit pattern (a float round trip and
  comparison would be blurred by XLA:CPU's denormal flushing): the rule of
  :func:`fits_format`, and of `Representable` in csrc/signature.h. Takes
  bit patterns that do not come from float arithmetic of the same XLA
  fusion (see `_accumulate_bits`).

  Args:
    u: unsigned bit patterns of values of float dtype `dtype`.
    dtype: the values' dtype.

  Returns:
    A list of 5 bool arrays shaped like u.
  """
  d = decode(u, dtype)
  return [fits_format(d, *_NARROW_SPECS[fmt]) for fmt in NARROW_FORMATS]


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


def sample_jitter() -> np.ndarray:
  """The sample's jitter: a 32-bit hash of each stratum k < PCT_SAMPLE
  (uint64 values below 2**32); stratum k of width w takes element
  ``k * w + jitter[k] % w``."""
  k = np.arange(PCT_SAMPLE, dtype=np.uint64)
  h = (k * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & np.uint64(
      0xFFFFFFFF)
  h ^= h >> np.uint64(15)
  h = (h * np.uint64(0x2C1B3C6D)) & np.uint64(0xFFFFFFFF)
  h ^= h >> np.uint64(12)
  return h


def _sample_index(n: int) -> np.ndarray | None:
  """Jittered stratified sample of PCT_SAMPLE indices (None: use all)."""
  if n <= PCT_SAMPLE:
    return None
  w = n // PCT_SAMPLE
  k = np.arange(PCT_SAMPLE, dtype=np.uint64)
  return (k * np.uint64(w) + sample_jitter() % np.uint64(w)).astype(np.int32)
