"""Number-format facts: the one home of what every part knows of formats.

The fault injectors round into these formats, the Analyzer counts which
outputs are representable in them, the Detector reads their unit roundoff,
maxima and smallest normals, and the report labels bit positions with them.
The native kernels' C++ copy of the narrow formats (``csrc/signature.h``,
``kNarrowFormats``) is checked against :data:`FORMATS` by a test.

Bit positions are numbered from the least significant bit: bit 0 is the last
mantissa bit, bit ``bits - 1`` the sign bit, the exponent field in between
(float32: mantissa 0-22, exponent 23-30, sign 31; bfloat16: mantissa 0-6,
exponent 7-14, sign 15; float16: mantissa 0-9, exponent 10-14, sign 15).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from peat_jax.core._errors import PeatError


class Format(NamedTuple):
  """A floating-point format.

  Attributes:
    name: short name used in error-model names, e.g. ``"bf16"``.
    dtype: the storage dtype (NumPy / ml_dtypes), or None where the format
      has none (``tf32``: float32's range, 10 mantissa bits).
    exponent_bits: width of the exponent field.
    mantissa_bits: width of the stored mantissa (fraction) field.
    max: largest finite value.
    min_normal: smallest positive normal value.
    has_inf: whether the format encodes infinities (``fp8_e4m3``, the
      e4m3fn variant, does not: overflow gives NaN).
  """

  name: str
  dtype: object
  exponent_bits: int
  mantissa_bits: int
  max: float
  min_normal: float
  has_inf: bool

  @property
  def precision(self) -> int:
    """Significand bits, the implicit leading bit included."""
    return self.mantissa_bits + 1

  @property
  def unit_roundoff(self) -> float:
    """``2**-precision``: the relative error bound of rounding to nearest."""
    return 2.0 ** -self.precision

  @property
  def bits(self) -> int:
    """Storage width (sign + exponent + mantissa)."""
    return 1 + self.exponent_bits + self.mantissa_bits

  @property
  def emin(self) -> int:
    """Exponent of the smallest normal value."""
    return math.frexp(self.min_normal)[1] - 1

  @property
  def emax(self) -> int:
    """Exponent of the largest finite value."""
    return math.frexp(self.max)[1] - 1

  @property
  def max_significand(self) -> int:
    """The largest significand at ``emax`` as a ``precision``-bit integer.

    All ones (``2**precision - 1``) but for e4m3fn, whose 1.111b at the top
    exponent is NaN: 1.110b = 14.
    """
    return int(round(self.max / 2.0 ** (self.emax - self.mantissa_bits)))


def _of(name: str, dtype, has_inf: bool) -> Format:
  info = ml_dtypes.finfo(dtype)
  return Format(name, np.dtype(dtype), int(info.nexp), int(info.nmant),
                float(info.max), float(info.smallest_normal), has_inf)


#: Every format peat_jax knows, by short name.
FORMATS: dict[str, Format] = {
    "fp64": _of("fp64", np.float64, True),
    "fp32": _of("fp32", np.float32, True),
    "bf16": _of("bf16", ml_dtypes.bfloat16, True),
    "fp16": _of("fp16", np.float16, True),
    "tf32": Format("tf32", None, 8, 10, float(np.float32(2.0**128 - 2.0**117)),
                   2.0**-126, True),
    "fp8_e4m3": _of("fp8_e4m3", ml_dtypes.float8_e4m3fn, False),
    "fp8_e5m2": _of("fp8_e5m2", ml_dtypes.float8_e5m2, True),
}
#: The narrow formats data is rounded into (``precision:<fmt>``, ...), in the
#: order of the Analyzer's representability shares (``Signature.repr_test``).
NARROW_FORMATS = ("bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2")
#: Record dtypes the Analyzer and the injectors take -> their format.
DTYPE_FORMAT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                "float64": "fp64"}
#: The Signature's ``dtype_code`` of each record dtype.
DTYPE_CODE = {"float32": 0, "bfloat16": 1, "float16": 2, "float64": 3}
_CODE_DTYPE = {c: d for d, c in DTYPE_CODE.items()}


def get_format(name: str, what: str = "format") -> Format:
  """The format called ``name``.

  Raises:
    PeatError: an unknown name, listing the known ones.
  """
  try:
    return FORMATS[name]
  except (KeyError, TypeError):
    raise PeatError(f"{what}: unknown format {name!r}; expected one of "
                    f"{sorted(FORMATS)}.") from None


def format_of(dtype) -> Format:
  """The format of a record dtype (float32, bfloat16, float16, float64).

  Raises:
    PeatError: another dtype.
  """
  name = np.dtype(dtype).name
  if name not in DTYPE_FORMAT:
    raise PeatError(f"dtype {name} is not a record dtype; expected one of "
                    f"{', '.join(DTYPE_FORMAT)}")
  return FORMATS[DTYPE_FORMAT[name]]


def is_floating(dtype) -> bool:
  """Whether ``dtype`` is a floating-point type, the ``ml_dtypes`` ones
  (bfloat16, the fp8 formats) included: NumPy gives those kind ``"V"``, so
  ``dtype.kind == "f"`` misses them."""
  return bool(jnp.issubdtype(np.dtype(dtype), jnp.floating))


def format_of_code(code: int) -> Format:
  """The format of a Signature's ``dtype_code`` (0 float32 ... 3 float64)."""
  try:
    return format_of(_CODE_DTYPE[int(code)])
  except KeyError:
    raise PeatError(f"dtype_code {code!r} is not one of "
                    f"{sorted(_CODE_DTYPE)}") from None
