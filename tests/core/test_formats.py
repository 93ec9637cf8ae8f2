"""Tests of the number-format facts (peat_jax.core): the one home of them."""

import os
import re

import ml_dtypes
import numpy as np
import pytest

from peat_jax import core
from peat_jax import detector
from peat_jax.analyzer.signature import _bits
from peat_jax.injectors import _rounding
from peat_jax.kernels import native

CSRC = os.path.join(os.path.dirname(native.__file__), "csrc")


@pytest.mark.parametrize("name,dtype", [
    ("fp64", np.float64), ("fp32", np.float32), ("bf16", ml_dtypes.bfloat16),
    ("fp16", np.float16), ("fp8_e4m3", ml_dtypes.float8_e4m3fn),
    ("fp8_e5m2", ml_dtypes.float8_e5m2)])
def test_facts_agree_with_the_dtypes_themselves(name, dtype):
  f = core.FORMATS[name]
  info = ml_dtypes.finfo(dtype)
  assert (f.exponent_bits, f.mantissa_bits) == (info.nexp, info.nmant)
  assert f.max == float(info.max) and f.min_normal == float(info.smallest_normal)
  assert f.unit_roundoff == float(info.eps) / 2  # 2**-precision
  assert f.bits == 8 * np.dtype(dtype).itemsize
  # The largest significand times 2**(emax - mantissa bits) is the maximum,
  # and one more unit there is not a finite value of the dtype.
  top = f.max_significand * 2.0 ** (f.emax - f.mantissa_bits)
  assert top == f.max
  nxt = np.asarray((f.max_significand + 1) * 2.0 ** (f.emax - f.mantissa_bits))
  assert not np.isfinite(nxt.astype(dtype)) or float(nxt.astype(dtype)) != float(nxt)


def test_tf32_is_float32_range_with_ten_mantissa_bits():
  f, f32 = core.FORMATS["tf32"], core.FORMATS["fp32"]
  assert (f.mantissa_bits, f.emin, f.emax) == (10, f32.emin, f32.emax)
  assert f.unit_roundoff == 2.0**-11 and f.dtype is None


def test_the_native_kernels_narrow_table_matches():
  """csrc/signature.h's kNarrowFormats is the same table, in the same order."""
  text = open(os.path.join(CSRC, "signature.h")).read()
  body = text[text.index("kNarrowFormats[kNarrow] = {"):]
  body = body[:body.index("};")]
  rows = [tuple(int(x) for x in m) for m in
          re.findall(r"\{(-?\d+), (-?\d+), (-?\d+), (-?\d+)\}", body)]
  want = [(f.mantissa_bits, f.emin, f.emax, f.max_significand)
          for f in (core.FORMATS[k] for k in core.NARROW_FORMATS)]
  assert rows == want


def test_every_part_reads_the_same_facts():
  assert detector.facts.UNIT_ROUNDOFF == {  # pylint: disable=protected-access
      k: f.unit_roundoff for k, f in core.FORMATS.items()}
  assert detector.facts.NARROW_FORMATS == core.NARROW_FORMATS  # pylint: disable=protected-access
  assert list(_rounding.FORMATS) == list(core.NARROW_FORMATS)
  assert all(_rounding.FORMATS[k] is core.FORMATS[k] for k in _rounding.FORMATS)
  assert _bits._NARROW_SPECS["fp8_e4m3"] == (3, -6, 8, 14)  # pylint: disable=protected-access


def test_lookups_and_errors():
  assert core.format_of(np.float32).name == "fp32"
  assert core.format_of(ml_dtypes.bfloat16).name == "bf16"
  assert core.format_of_code(2).name == "fp16"
  with pytest.raises(core.PeatError, match="not a record dtype"):
    core.format_of(np.int32)
  with pytest.raises(core.PeatError, match="unknown format 'fp4'"):
    core.get_format("fp4")
  with pytest.raises(core.PeatError, match="dtype_code 7"):
    core.format_of_code(7)
