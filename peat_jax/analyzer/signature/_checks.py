"""Validation of the Analyzer's inputs, in Python, before tracing."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.core import PeatError
from peat_jax.analyzer.signature._signature import _SUPPORTED


# --------------------------------------------------------------------------
# Validation (Python, before tracing).
# --------------------------------------------------------------------------


def _check_dtype(dtype, what: str) -> np.dtype:
  dtype = np.dtype(dtype)
  if dtype not in _SUPPORTED:
    raise PeatError(
        f"{what} has dtype {dtype}; expected one of float32, bfloat16, "
        "float16, float64. Fix: analyze the floating-point output of the "
        "kernel (cast integer or complex outputs yourself, e.g. compare the "
        "real and imaginary parts separately).")
  return dtype


def _check_pair(test, golden, *, batched: bool) -> tuple[tuple[int, ...],
                                                         np.dtype]:
  """Validates shapes and dtypes; returns (record shape, dtype)."""
  for what, x in (("test", test), ("golden", golden)):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      raise PeatError(
          f"{what}: expected an array (jax.Array or numpy.ndarray); got "
          f"{type(x).__name__}. Fix: pass jnp.asarray(...) of the output.")
  dt = _check_dtype(test.dtype, "test")
  dg = _check_dtype(golden.dtype, "golden")
  if dt != dg:
    raise PeatError(
        f"test dtype {dt} != golden dtype {dg}; expected equal dtypes. Fix: "
        "compare outputs of the same format (cast the KUT output to the "
        "golden dtype only if that is what the model consumes).")
  if tuple(test.shape) != tuple(golden.shape):
    raise PeatError(
        f"test shape {tuple(test.shape)} != golden shape "
        f"{tuple(golden.shape)}; expected equal shapes. Fix: compare the "
        "same site's outputs (check the site name and layout).")
  shape = tuple(test.shape)
  if batched:
    if len(shape) < 1:
      raise PeatError(
          "batched records: expected a leading batch axis; got a 0-d array."
          " Fix: stack records with jnp.stack(records).")
    shape = shape[1:]
    if test.shape[0] == 0:
      raise PeatError("batched records: the batch axis is empty (0 records);"
                      " expected at least 1. Fix: skip empty batches.")
  if math.prod(shape) == 0:
    raise PeatError(
        f"record shape {shape} has no elements; expected at least 1. Fix: "
        "skip sites whose output is empty.")
  if math.prod(shape) >= 2**31 - 1:
    raise PeatError(
        f"record of {math.prod(shape)} elements; expected < 2**31 - 1 (int32"
        " counts). Fix: analyze the record in slices (stream them with "
        "signature_update).")
  return shape, dt


def split_reference(reference, shape, *, batched: bool):
  """Returns (hi, lo) float32 double-float of the float64 reference."""
  r = np.asarray(jax.device_get(reference))
  if not (np.issubdtype(r.dtype, np.floating) or r.dtype == jnp.bfloat16):
    raise PeatError(
        f"reference has dtype {r.dtype}; expected a floating-point array "
        "(float64). Fix: compute it with the peat_jax reference helpers.")
  r = r.astype(np.float64)
  want = tuple(shape)
  got = tuple(r.shape[1:]) if batched else tuple(r.shape)
  if got != want:
    raise PeatError(
        f"reference record shape {got} != test shape {want}; expected equal."
        " Fix: compute the reference from the same site's inputs.")
  with np.errstate(over="ignore", invalid="ignore"):
    hi = r.astype(np.float32)
    lo = (r - hi.astype(np.float64)).astype(np.float32)
    lo = np.where(np.isfinite(lo), lo, np.float32(0))
  return hi, lo
