"""Number formats and bit-level helpers shared by the fault injectors.

Everything here is pure and jit-able. Bit manipulation goes through
``lax.bitcast_convert_type`` to an unsigned integer of the same width, so it is
exact and unaffected by XLA's flush-to-zero of subnormals in arithmetic.

Bit positions are numbered from the least significant bit: bit 0 is the last
mantissa bit, bit ``width - 1`` is the sign bit, the exponent field lies in
between (float32: mantissa 0-22, exponent 23-30, sign 31; bfloat16: mantissa
0-6, exponent 7-14, sign 15; float16: mantissa 0-9, exponent 10-14, sign 15).
"""

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from peat_jax.core import PeatError


class Format(NamedTuple):
  """A narrow floating-point format that data can be rounded into.

  Attributes:
    name: short name used in error-model names, e.g. ``"bf16"``.
    dtype: the JAX/ml_dtypes dtype, or None where the format is emulated by
      bit masking (``tf32``).
    exponent_bits: width of the exponent field.
    mantissa_bits: width of the stored mantissa (fraction) field.
    max: largest finite value.
    min_normal: smallest positive normal value.
    has_inf: whether the format encodes infinities (``fp8_e4m3`` does not:
      overflow gives NaN).
  """

  name: str
  dtype: object
  exponent_bits: int
  mantissa_bits: int
  max: float
  min_normal: float
  has_inf: bool


def _fmt(name: str, dtype, has_inf: bool) -> Format:
  info = ml_dtypes.finfo(dtype)
  return Format(name, jnp.dtype(dtype), int(info.nexp), int(info.nmant),
                float(info.max), float(info.smallest_normal), has_inf)


FORMATS: dict[str, Format] = {
    "bf16": _fmt("bf16", jnp.bfloat16, True),
    "fp16": _fmt("fp16", jnp.float16, True),
    # TensorFloat-32: float32's range, 10 mantissa bits; no storage dtype.
    "tf32": Format("tf32", None, 8, 10, float(np.float32(2.0**128 - 2.0**117)),
                   float(2.0**-126), True),
    "fp8_e4m3": _fmt("fp8_e4m3", jnp.float8_e4m3fn, False),
    "fp8_e5m2": _fmt("fp8_e5m2", jnp.float8_e5m2, True),
}
"""Formats known to ``precision:<fmt>``, ``accumulation:<fmt>``, ``truncation``,
``saturation`` and ``ftz``. ``fp8_e4m3`` is ml_dtypes' ``float8_e4m3fn`` (the
OCP/NVIDIA variant: max 448, no Inf)."""

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16", "float64")


def get_format(name: str, what: str) -> Format:
  """Returns the format called ``name`` or raises a PeatError listing them."""
  try:
    return FORMATS[name]
  except (KeyError, TypeError):
    raise PeatError(
        f"{what}: unknown format {name!r}; expected one of "
        f"{sorted(FORMATS)}.") from None


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
  info = ml_dtypes.finfo(dtype)
  return int(info.nexp), int(info.nmant)


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
  return w.astype(fmt.dtype).astype(w.dtype).astype(x.dtype)


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
    c = jnp.clip(jnp.where(finite, w, 0), -fmt.max, fmt.max)
    n = c.astype(fmt.dtype)
    up = jnp.abs(n.astype(w.dtype)) > jnp.abs(c)
    # One step toward zero in fmt: decrement the magnitude bits.
    stepped = from_bits(to_bits(n) - jnp.ones((), uint_dtype(fmt.dtype)),
                        fmt.dtype)
    y = jnp.where(up, stepped, n).astype(w.dtype)
  return jnp.where(finite, y, w).astype(x.dtype)
