"""The base of a pseudo-error, fitted by synthesis, and the bit-flip null.

A KUT's dense error has a cause of its own (its *base*: another summation
order, inputs or outputs rounded to a narrower format), and a fault rides
on top of it. Where the base can be synthesized from the record itself it
is, and what it does not explain is the residual the fault tests read:

* **outputs rounded to a coarser format** (a softmax stored through bf16,
  an activation computed in fp16): the synthesized base is the float64
  reference rounded into that format, to nearest or toward zero. An
  element is explained when ``t`` is representable in the format and lies
  in the rounding interval of a value within the golden kernel's own
  envelope of ``r`` (a correct kernel rounds its own float32 result, not
  the exact one). The test is exact per element: a flipped bit, a stuck
  bit or a value from another place is never inside it, however small
  its move is against the format's noise.
* otherwise the golden kernel itself, with its rounding envelope
  (``_decompose``): another order of the same sum.

The candidate format is the coarsest that holds at least
``BASE_REPRESENTABLE`` of the nonzero elements beyond the golden envelope
(the ones to explain); ``fit_rounded_base`` counts the elements each
rounding mode explains, and the golden ties of the format that ``t``
rounds away from zero (round to nearest with ties away, not to even).

The **bit-flip null**: a value from elsewhere in the output (``t`` at
another place of the percentile sample) put at a sampled place, then
taken through the same flip test as an outlier. Its share back within
1, 2, 3 flips is how often a value drawn like the data passes the flip
test by chance: the Detector's binomial test of ``bitflip`` against
``random_value`` reads it (a 16-bit record's wide envelope leaves few
bits to test, so that chance is large there and small in float32).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax import core as _core
from peat_jax.analyzer.signature._bits import (
    _NARROW_SPECS, _from_bits, decode, fits_format)
from peat_jax.analyzer.signature._signature import Array, NARROW_FORMATS

#: A format is a candidate base when at least this share of the nonzero
#: elements beyond the golden envelope is representable in it: a value
#: that carries one bit more than the format fits it by chance with
#: probability 1/2 (its lowest bit clear), so 90% is the format's doing,
#: and leaves a tenth of the elements to a fault on top.
BASE_REPRESENTABLE = 0.9
#: A rounded base is the record's base only where it explains at least
#: this share of the finite elements (and more than the golden envelope
#: does): a base explains the dense part, and a fault on top of it (a
#: stuck bit) leaves about half of the elements as they were.
BASE_MIN_SHARE = 0.25
#: The rounding modes of a rounded base, in ``base_explained`` order.
MODES = ("nearest", "toward_zero")
#: The most bit flips the flip test tries on one element.
MAX_FLIPS = 3
#: A rounded base leaves a *dense* residual (the output rounded to the
#: format after inputs rounded to it too: an activation computed in fp16)
#: when the elements it does not explain lie within this many of the
#: format's ulps of its interval at the median: one rounding of the
#: inputs moves an output by its condition number of ulps (1-3 for the
#: activations and norms). The outliers are then beyond DENSE_FACTOR
#: times that median, as over the golden base.
NEAR_ULPS = 2.0
#: ... and when they are at least this share of the record (and
#: DENSE_RESIDUAL_MIN elements): a sparse fault's few elements are no
#: dense residual, whatever their distance.
DENSE_RESIDUAL_SHARE = 0.01
DENSE_RESIDUAL_MIN = 8
#: An outlier is *clear* of its base when it lies beyond this many times
#: the outlier threshold (its z over theta, or its excess over the
#: rounded base's, at least one ulp): a dense error's tail thins out just
#: beyond the threshold, while a flipped bit or a replaced value moves an
#: element by a power of two of ulps or by the data's spread.
CLEAR_FACTOR = 4.0
#: Partner values the flip null tries at each outlier's place.
NULL_PARTNERS = 16
#: An outlier is *far* when its magnitude lies beyond this factor of the
#: range of the explained elements' magnitudes: one flip of the top
#: mantissa bit moves a value by less than 2x, so only an exponent flip
#: (or a value unlike the data) lands beyond it.
FAR_FACTOR = 2.0
#: ... the range's low end being this quantile of the explained elements'
#: nonzero magnitudes (a flipped value the envelope hides may itself be
#: the smallest): a value drawn like the data falls below it with
#: probability 2**-7.
FAR_QUANTILE = 2.0 ** -7


def _coarseness(fmt: str) -> tuple[int, float]:
  f = _core.FORMATS[fmt]
  return f.mantissa_bits, f.max


def candidate_formats(dtype) -> tuple[str, ...]:
  """The narrow formats coarser than a record dtype's own, coarsest first
  (fewer mantissa bits, then a smaller range): fp8_e5m2, fp8_e4m3, bf16,
  fp16, tf32 for float32 records; fp8 for bf16 records; bf16 and fp8 for
  float16 records."""
  own = _core.format_of(dtype).mantissa_bits
  coarser = [k for k in NARROW_FORMATS if _core.FORMATS[k].mantissa_bits < own]
  return tuple(sorted(coarser, key=_coarseness))


def _spec_arrays(fmts):
  """The formats' (mantissa bits, emin, emax, max significand) as int32
  arrays, gathered by a traced index."""
  specs = np.array([_NARROW_SPECS[k] for k in fmts], np.int64)
  return tuple(jnp.asarray(specs[:, i], jnp.int32) for i in range(4))


def representable_in(u: Array, dtype, m, emin, emax, max_top) -> Array:
  """Whether the values with bit patterns ``u`` (of float dtype
  ``dtype``) are exactly representable in a format given by traced
  scalars (:func:`~._bits.fits_format`)."""
  return fits_format(decode(u, dtype), m, emin, emax, max_top)


def format_ulp(x: Array, m, emin) -> Array:
  """The spacing of a format (traced mantissa bits ``m``, smallest normal
  exponent ``emin``) at magnitude ``|x|``: ``2**(max(e, emin) - m)`` with
  ``e = floor(log2 |x|)`` (the subnormal spacing at 0)."""
  _, ex = jnp.frexp(x)
  return jnp.ldexp(jnp.ones_like(x), jnp.maximum(ex - 1, emin) - m)


def in_interval(v: Array, r: Array, lo: Array, slack: Array, m, emin
                ) -> tuple[Array, Array]:
  """Whether ``v`` is the rounding, to nearest and toward zero, of a value
  within ``slack`` of the reference ``r + lo`` (format spacing from
  ``m``, ``emin``). Representability is the caller's test."""
  av, ar = jnp.abs(v), jnp.abs(r)
  d = jnp.abs((v - r) - lo)
  nearest = d <= 0.5 * format_ulp(jnp.maximum(av, ar), m, emin) + slack
  same_side = (v == 0) | ((v > 0) == (r > 0))
  below = ar - av  # toward zero: |v| <= |x| < |v| + ulp(v)
  toward = same_side & (below >= -slack) & (
      below < format_ulp(v, m, emin) + slack)
  return nearest, toward


class RoundedBase(NamedTuple):
  """The fitted rounded-output base of one record (traced).

  Attributes:
    fmt: int32: index in NARROW_FORMATS of the candidate format (-1: none).
    mode: int32: the fitted mode (index in MODES; 0 without a format).
    explained: int32[2]: elements each mode explains (0 without a format).
    ties: int32[2]: golden values at a tie of the format whose ``t`` is
      explained to nearest, and those of them ``t`` rounds away from zero.
    rounded: bool, flat: the elements the fitted mode explains.
    spec: the candidate's (m, emin, emax, max significand), traced.
  """

  fmt: Array
  mode: Array
  explained: Array
  ties: Array
  rounded: Array
  spec: tuple


def excess_ulps(v: Array, r: Array, lo: Array, slack: Array, m, emin,
                mode) -> Array:
  """How far, in the format's ulps, ``v`` lies outside the fitted mode's
  rounding interval around ``r + lo`` (0 inside; ``slack`` absolute
  around the reference as in :func:`in_interval`)."""
  av, ar = jnp.abs(v), jnp.abs(r)
  ulp = format_ulp(jnp.maximum(av, ar), m, emin)
  d = jnp.maximum(jnp.abs((v - r) - lo) - slack, 0.0)
  near = jnp.maximum(d / ulp - 0.5, 0.0)
  same_side = (v == 0) | ((v > 0) == (r > 0))
  below = ar - av
  step = format_ulp(v, m, emin)
  tz = jnp.maximum(jnp.maximum(-below - slack, below - step - slack),
                   0.0) / step
  toward = jnp.where(same_side, tz, d / ulp)
  return jnp.where(mode == 0, near, toward)


def fit_rounded_base(ut: Array, tc: Array, gc: Array, r: Array, lo: Array,
                     fp: Array, beyond: Array, slack: Array,
                     dtype) -> RoundedBase:
  """Fits the rounded-output base (module doc) of one flat record.

  Args:
    ut: the test record's bit patterns.
    tc, gc: test and golden in the compute dtype.
    r, lo: the reference's two halves.
    fp: finite pairs with a finite reference.
    beyond: elements beyond the golden envelope.
    slack: the golden envelope in absolute terms, per element.
    dtype: the record dtype.

  Returns:
    A :class:`RoundedBase`.
  """
  fmts = candidate_formats(dtype)
  nf = len(fmts)
  if not nf:
    zero = jnp.int32(0)
    return RoundedBase(jnp.int32(-1), zero, jnp.zeros((2,), jnp.int32),
                       jnp.zeros((2,), jnp.int32), jnp.zeros_like(fp),
                       (zero, zero, zero, zero))
  specs = _spec_arrays(fmts)
  todo = beyond & fp & (tc != 0)
  n_todo = jnp.sum(todo, dtype=jnp.int32)
  shares = jnp.stack([
      jnp.sum(todo & representable_in(ut, dtype, *(s[i] for s in specs)),
              dtype=jnp.int32) for i in range(nf)])
  fits = (n_todo > 0) & (shares >= BASE_REPRESENTABLE * n_todo)
  # The coarsest format that fits (fmts are coarsest first).
  pick = jnp.argmax(fits)
  spec = tuple(s[pick] for s in specs)
  m, emin = spec[0], spec[1]
  rep = representable_in(ut, dtype, *spec) & fp
  nearest, toward = in_interval(tc, r, lo, slack, m, emin)
  explained = jnp.stack([jnp.sum(rep & nearest, dtype=jnp.int32),
                         jnp.sum(rep & toward, dtype=jnp.int32)])
  mode = jnp.argmax(explained).astype(jnp.int32)
  rounded = rep & jnp.where(mode == 0, nearest, toward)
  # Golden's ties in the format: |g| halfway between two of its values.
  step = format_ulp(gc, m, emin)
  q = jnp.abs(gc) / step
  tie = fp & (q - jnp.floor(q) == 0.5) & rep & nearest
  away = tie & (jnp.abs(tc) > jnp.abs(gc))
  ties = jnp.stack([jnp.sum(tie, dtype=jnp.int32),
                    jnp.sum(away, dtype=jnp.int32)])
  has = jnp.any(fits)
  index = jnp.asarray([NARROW_FORMATS.index(k) for k in fmts],
                      jnp.int32)[pick]
  zero2 = jnp.zeros((2,), jnp.int32)
  return RoundedBase(jnp.where(has, index, -1), jnp.where(has, mode, 0),
                     jnp.where(has, explained, zero2),
                     jnp.where(has, ties, zero2), rounded & has, spec)


def rounded_explains(u: Array, v: Array, r: Array, lo: Array, slack: Array,
                     base: RoundedBase, theta_e: Array, dtype) -> Array:
  """Whether values ``v`` (bit patterns ``u``) at their places are
  explained by the fitted rounded base: representable in its format and
  at most ``theta_e`` ulps outside its mode's interval (False without a
  format)."""
  m, emin = base.spec[0], base.spec[1]
  rep = representable_in(u, dtype, *base.spec)
  out = excess_ulps(v, r, lo, slack, m, emin, base.mode)
  return (base.fmt >= 0) & rep & (out <= theta_e)


def rounded_bits(u: Array, dtype, m, mode) -> Array:
  """The bit patterns ``u`` (of float dtype ``dtype``) with their
  significands rounded to ``m`` explicit bits (traced), to nearest even
  (``mode`` 0) or toward zero (1): the golden output as a base rounded to
  a coarser format holds it (normal values; a carry into the exponent is
  the rounding's own). The flip test reads the bits in which an outlier
  differs from it, not from golden's low bits that the rounding
  dropped."""
  nmant = int(jnp.finfo(dtype).nmant)
  ut = u.dtype
  drop = jnp.clip(nmant - m, 1, nmant).astype(ut)
  one = jnp.array(1, ut)
  low = (one << drop) - one
  lsb = (u >> drop) & one
  nearest = (u + (low >> one) + lsb) & ~low
  return jnp.where(mode == 0, nearest, u & ~low)


def top_bit(x: Array, nbits: int) -> Array:
  """Index of the highest set bit of unsigned ``x`` (-1 for 0), int32."""
  return (nbits - 1) - lax.clz(x).astype(jnp.int32)


def flip_bit(u: Array, bit: Array) -> Array:
  """``u`` with bit ``bit`` flipped (``bit`` >= 0)."""
  one = jnp.array(1, u.dtype)
  return u ^ (one << jnp.maximum(bit, 0).astype(u.dtype))


def flips_needed(ut: Array, ug: Array, explains, dtype) -> Array:
  """How many flips of the highest bits where ``ut`` and ``ug`` differ
  bring each value back inside what explains it: 1..MAX_FLIPS, or 0 when
  none of those does.

  Args:
    ut, ug: bit patterns of the values and of golden at their places.
    explains: ``explains(bits, values) -> bool`` at those places.
    dtype: the values' dtype.

  Returns:
    int32, shaped like ``ut``.
  """
  nbits = np.dtype(dtype).itemsize * 8
  cdt = jnp.float64 if np.dtype(dtype) == np.float64 else jnp.float32
  need = jnp.zeros(ut.shape, jnp.int32)
  cur = ut
  for k in range(1, MAX_FLIPS + 1):
    bit = top_bit(cur ^ ug, nbits)
    cur = flip_bit(cur, bit)
    v = _from_bits(cur, dtype).astype(cdt)
    ok = (bit >= 0) & jnp.isfinite(v) & explains(cur, v)
    need = jnp.where((need == 0) & ok, k, need)
  return need


def flip_null(tc: Array, ut: Array, ug: Array, idx: Array, valid: Array,
              partner_ok: Array, n_rec: Array, explains, dtype) -> Array:
  """The bit-flip null (module doc) at the outliers' own places.

  At each gathered outlier place, NULL_PARTNERS values of ``t`` from
  places spread over the record (explained, finite, nonzero), each not
  explained at the outlier's place, go through the flip test there; the
  share back inside the base within 1, 2, 3 flips is smoothed ((k + 1) /
  (m + 2): a place with no usable partner says 1/2) and averaged over the
  outliers.

  Args:
    tc, ut: the test record (compute dtype, bit patterns), flat.
    ug: golden's bit patterns, flat.
    idx: the gathered outliers' places (int32[K]).
    valid: which of them are outliers.
    partner_ok: where a partner value may come from (bool, flat).
    n_rec: the record's element count (traced).
    explains: ``explains(bits, values, places) -> bool``.
    dtype: the record dtype.

  Returns:
    f32[MAX_FLIPS], cumulative (0.5 where no outlier is gathered).
  """
  j = jnp.arange(1, NULL_PARTNERS + 1, dtype=jnp.int32)
  stride = jnp.maximum(n_rec // (NULL_PARTNERS + 1), 1)
  part = (idx[:, None] + j[None, :] * stride) % n_rec
  at = jnp.broadcast_to(idx[:, None], part.shape)
  u, v = ut[part], tc[part]
  ok = valid[:, None] & partner_ok[part] & ~explains(u, v, at)
  need = flips_needed(u, ug[at], lambda bits, w: explains(bits, w, at),
                      dtype)
  cnt = jnp.sum(ok, axis=1).astype(jnp.float32)
  n_out = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
  shares = []
  for k in range(1, MAX_FLIPS + 1):
    hit = jnp.sum(ok & (need >= 1) & (need <= k), axis=1).astype(jnp.float32)
    p = (hit + 1.0) / (cnt + 2.0)
    shares.append(jnp.where(jnp.any(valid),
                            jnp.sum(jnp.where(valid, p, 0.0)) / n_out, 0.5))
  return jnp.stack(shares).astype(jnp.float32)
