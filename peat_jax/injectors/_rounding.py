"""Rounding into number formats and bit-level helpers of the fault injectors.

The formats' facts (widths, range, unit roundoff) live in
:mod:`peat_jax.core`; this module applies them to data.

Everything here is pure and jit-able. Bit manipulation goes through
``lax.bitcast_convert_type`` to an unsigned integer of the same width, so it is
exact and unaffected by XLA's flush-to-zero of subnormals in arithmetic.

Bit positions are numbered as in :mod:`peat_jax.core` (bit 0: the last
mantissa bit).
"""


import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from peat_jax import core as _core
from peat_jax.core import Format, PeatError


#: The formats known to ``precision:<fmt>``, ``accumulation:<fmt>``,
#: ``truncation``, ``saturation`` and ``ftz`` (facts: :mod:`peat_jax.core`).
#: ``fp8_e4m3`` is ml_dtypes' ``float8_e4m3fn`` (the OCP/NVIDIA variant: max
#: 448, no Inf).
FORMATS: dict[str, Format] = {k: _core.FORMATS[k] for k in _core.NARROW_FORMATS}
get_format = _core.get_format

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
SUPPORTED_DTYPES = tuple(_core.DTYPE_FORMAT)


def check_dtype(dtype, what: str) -> np.dtype:
  """Checks that ``dtype`` is a float dtype the injectors support."""
  dtype = np.dtype(dtype)
  if dtype.name not in SUPPORTED_DTYPES:
    raise PeatError(
        f"{what}: expected a floating array of dtype "
        f"{', '.join(SUPPORTED_DTYPES[:3])} (or float64 with x64 enabled), "
        f"got dtype {dtype.name}.")
  return dtype


def uint_dtype(dtype) -> np.dtype:
  """The unsigned integer dtype of the same width as float ``dtype``."""
  return np.dtype(_UINT[np.dtype(dtype).itemsize])


def bit_width(dtype) -> int:
  """Number of bits of float ``dtype``."""
  return 8 * np.dtype(dtype).itemsize


def fields(dtype) -> tuple[int, int]:
  """(exponent bits, mantissa bits) of float ``dtype``."""
  f = _core.format_of(dtype)
  return f.exponent_bits, f.mantissa_bits


def to_bits(x: jax.Array) -> jax.Array:
  """Reinterprets float ``x`` as unsigned integers of the same width."""
  return lax.bitcast_convert_type(x, uint_dtype(x.dtype))


def from_bits(u: jax.Array, dtype) -> jax.Array:
  """Reinterprets unsigned integers ``u`` as floats of ``dtype``."""
  return lax.bitcast_convert_type(u, np.dtype(dtype))


def working_dtype(dtype) -> np.dtype:
  """float64 for float64 data, float32 for everything narrower."""
  return np.dtype(np.float64 if np.dtype(dtype).itemsize == 8 else np.float32)


def largest_at_most(limit: float, dtype) -> np.generic:
  """Largest finite value of ``dtype`` that is <= ``limit`` (limit > 0)."""
  dtype = np.dtype(dtype)
  info = ml_dtypes.finfo(dtype)
  if limit >= float(info.max):
    return dtype.type(info.max)
  v = np.asarray(limit, np.float64).astype(dtype)
  if float(v) > limit:
    u = v.view(uint_dtype(dtype)) - 1
    v = u.view(dtype)
  return dtype.type(v)


def round_nearest(x: jax.Array, fmt: Format, *, saturate: bool = False
                  ) -> jax.Array:
  """Rounds ``x`` to the nearest value of ``fmt`` (ties to even).

  The result keeps ``x``'s dtype. Overflow follows the format: Inf where it
  has Inf, NaN for ``fp8_e4m3``; with ``saturate`` finite values are clipped
  to the format's max first (a saturating conversion).

  Args:
    x: floating array.
    fmt: target format.
    saturate: clip finite values to +-``fmt.max`` before rounding.

  Returns:
    An array of ``x.dtype`` whose values are representable in ``fmt`` (up to
    a second rounding where ``fmt`` is not a subset of ``x.dtype``).
  """
  w = x.astype(working_dtype(x.dtype))
  if saturate:
    w = jnp.where(jnp.isfinite(w), jnp.clip(w, -fmt.max, fmt.max), w)
  if fmt.dtype is None:  # tf32: round float32 bits to 10 mantissa bits.
    w32 = w.astype(jnp.float32)
    u = to_bits(w32)
    drop = 23 - fmt.mantissa_bits
    half = jnp.uint32((1 << (drop - 1)) - 1)
    lsb = (u >> drop) & jnp.uint32(1)
    r = (u + half + lsb) & jnp.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    y = jnp.where(jnp.isfinite(w32), from_bits(r, jnp.float32), w32)
    return y.astype(x.dtype)
  return kept_rounding(w, fmt).astype(x.dtype)


def kept_rounding(w: jax.Array, fmt: Format) -> jax.Array:
  """``w`` (float32 or float64) rounded to nearest in ``fmt``, kept in
  ``w``'s dtype, without a convert pair XLA may remove.

  XLA removes a convert to ``fmt.dtype`` and back where it allows excess
  precision (its default): XLA:GPU anywhere (the first GPU check: the
  injection rounded nothing there), XLA:CPU where the pair meets its own
  bf16 upcasts in a fusion. A ``reduce_precision`` is no conversion to
  remove (kept on the CPU; still to be confirmed on a GPU). It rounds the
  normal range as a convert does, but flushes the format's subnormals to
  zero and knows no format without infinities, so those two are done
  here: the subnormal range
  rounded on the grid of ``fmt``'s smallest subnormal (an exact scaling by
  a power of two and ``round``, ties to even), and for a format without
  Inf (``fp8_e4m3``) the range of one more exponent bit, then NaN beyond
  its max, as its convert gives. bf16's subnormals are float32's, which
  ``reduce_precision`` keeps as a convert does (no arithmetic on them,
  which XLA:CPU would flush). On the CPU the same bits as the convert pair
  for float32 data (tests/injectors/test_kept_rounding.py).

  Args:
    w: float32 or float64 array.
    fmt: a format with a storage dtype (not ``tf32``).

  Returns:
    ``w``'s dtype, its values representable in ``fmt``.
  """
  e = fmt.exponent_bits + (0 if fmt.has_inf else 1)
  y = lax.reduce_precision(w, exponent_bits=e, mantissa_bits=fmt.mantissa_bits)
  sub = _own_subnormal_step(fmt, w.dtype)
  if sub is not None:
    y = jnp.where(jnp.abs(w) < fmt.min_normal, jnp.round(w / sub) * sub, y)
  if not fmt.has_inf:
    y = jnp.where(jnp.abs(y) > fmt.max, jnp.asarray(np.nan, w.dtype), y)
  return y


def round_toward_zero(x: jax.Array, fmt: Format) -> jax.Array:
  """Rounds ``x`` toward zero into ``fmt`` (truncation); keeps ``x.dtype``.

  Finite values beyond the format's max become +-max (toward zero never
  overflows); NaN and Inf pass through unchanged.

  Args:
    x: floating array.
    fmt: target format.

  Returns:
    An array of ``x.dtype`` with ``|result| <= |x|`` elementwise.
  """
  w = x.astype(working_dtype(x.dtype))
  finite = jnp.isfinite(w)
  if fmt.dtype is None:  # tf32: clear the low 13 mantissa bits.
    w32 = w.astype(jnp.float32)
    drop = 23 - fmt.mantissa_bits
    u = to_bits(w32) & jnp.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    y = from_bits(u, jnp.float32).astype(w.dtype)
  else:
    # Selects, not clip's arithmetic, which XLA:CPU would flush on float32
    # subnormals (bf16's own).
    c = jnp.where(jnp.abs(w) > fmt.max,
                  jnp.where(w > 0, fmt.max, -fmt.max).astype(w.dtype), w)
    y = kept_truncation(jnp.where(finite, c, jnp.zeros_like(w)), fmt)
  return jnp.where(finite, y, w).astype(x.dtype)


def round_nearest_away(x: jax.Array, fmt: Format) -> jax.Array:
  """Rounds ``x`` to the nearest value of ``fmt``, ties away from zero
  (some hardware's conversion); keeps ``x.dtype``.

  Half of ``fmt``'s spacing at ``|x|`` is added to the magnitude, then the
  sum is rounded toward zero (:func:`round_toward_zero`): a tie lands on
  the larger magnitude. NaN and Inf pass through.

  Args:
    x: floating array.
    fmt: target format.

  Returns:
    An array of ``x.dtype`` whose values are representable in ``fmt``.
  """
  w = x.astype(working_dtype(x.dtype))
  if _own_subnormal_step(fmt, w.dtype) is None and w.dtype == np.float32:
    # tf32 and bf16 (float32's exponent range, its subnormals included):
    # add half of the dropped bits, clear them, in the bits.
    drop = 23 - fmt.mantissa_bits
    u = (to_bits(w) + jnp.uint32(1 << (drop - 1))) & jnp.uint32(
        ~((1 << drop) - 1) & 0xFFFFFFFF)
    y = jnp.where(jnp.isfinite(w), from_bits(u, jnp.float32), w)
    return y.astype(x.dtype)
  emin = int(np.log2(fmt.min_normal))
  _, ex = jnp.frexp(w)
  half = jnp.ldexp(jnp.ones_like(w),
                   jnp.maximum(ex - 1, emin) - fmt.mantissa_bits - 1)
  return round_toward_zero(w + jnp.sign(w) * half, fmt).astype(x.dtype)


def round_to(x: jax.Array, fmt: Format, mode: str) -> jax.Array:
  """Rounds ``x`` into ``fmt`` in one of ROUNDING_MODES; keeps ``x.dtype``.

  Raises:
    PeatError: an unknown mode.
  """
  if mode not in ROUNDING_MODES:
    raise PeatError(f"unknown rounding mode {mode!r}; use one of "
                    f"{', '.join(ROUNDING_MODES)}")
  return ROUNDING_MODES[mode](x, fmt)


def kept_truncation(c: jax.Array, fmt: Format) -> jax.Array:
  """Finite ``c`` (float32 or float64, within +-``fmt.max``) rounded
  toward zero in ``fmt``, kept in ``c``'s dtype, without a convert to
  ``fmt.dtype`` (which XLA:GPU may remove: :func:`kept_rounding`).

  In ``fmt``'s normal range the fraction bits ``fmt`` lacks are cleared
  (bf16's subnormals are float32's, so there too); in a narrower
  format's subnormal range ``c`` is truncated on the grid of its smallest
  subnormal (an exact scaling by a power of two).

  Args:
    c: float32 or float64 array, finite, ``|c| <= fmt.max``.
    fmt: a format with a storage dtype (not ``tf32``).

  Returns:
    ``c``'s dtype, ``|result| <= |c|``, representable in ``fmt``.
  """
  drop = ml_dtypes.finfo(c.dtype).nmant - fmt.mantissa_bits
  width = bit_width(c.dtype)
  keep = ~((1 << drop) - 1) & ((1 << width) - 1)
  y = from_bits(to_bits(c) & jnp.asarray(keep, uint_dtype(c.dtype)),
                c.dtype)
  sub = _own_subnormal_step(fmt, c.dtype)
  if sub is not None:
    y = jnp.where(jnp.abs(c) < fmt.min_normal, jnp.trunc(c / sub) * sub, y)
  return y


def _own_subnormal_step(fmt: Format, dtype) -> float | None:
  """The spacing of ``fmt``'s subnormals where they lie among ``dtype``'s
  normal values (its range narrower: fp16, fp8), so that they are rounded
  by arithmetic on that grid; None where they are ``dtype``'s own
  subnormals (bf16 in float32), which bit operations handle."""
  if fmt.min_normal > float(ml_dtypes.finfo(dtype).smallest_normal):
    return fmt.min_normal * 2.0 ** -fmt.mantissa_bits
  return None


#: The rounding modes a format is reached by, by name.
ROUNDING_MODES = {"nearest_even": round_nearest,
                  "toward_zero": round_toward_zero,
                  "nearest_away": round_nearest_away}
