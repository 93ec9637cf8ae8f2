"""The arithmetic a slip changes, on the host in float64.

The families (``._families``) compute a kernel in float64 with NumPy and
call the reductions here: an exact sum, a sum whose blocks are dropped or
counted twice, a sum accumulated in order in a narrow format, and the
online softmax over blocks that forgets to rescale. Rounding into a
narrow format is to nearest, ties to even, in float64 arithmetic that
holds every narrower format exactly.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from peat_jax import core as _core

Reduce = Callable[[np.ndarray, int], np.ndarray]


def round_nearest(x: np.ndarray, fmt: str) -> np.ndarray:
  """``x`` (float64) rounded to nearest-even into ``fmt`` (significand and
  range: overflow to +-inf, gradual underflow), as float64.

  Args:
    x: float64 values.
    fmt: a format of :data:`peat_jax.core.FORMATS`.

  Returns:
    float64 array of ``x``'s shape.
  """
  f = _core.FORMATS[fmt]
  x = np.asarray(x, np.float64)
  with np.errstate(all="ignore"):
    _, e = np.frexp(np.maximum(np.abs(x), f.min_normal))
    q = np.ldexp(1.0, e - 1 - f.mantissa_bits)  # the spacing at x's binade
    y = np.round(x / q) * q  # np.round: ties to even
    big = np.abs(y) > f.max
    return np.where(big, np.copysign(np.inf if f.has_inf else np.nan, x),
                    np.where(np.isfinite(x), y, x))


def round_mode(x: np.ndarray, fmt: str, mode: str) -> np.ndarray:
  """``x`` rounded into ``fmt`` in ``mode`` (``nearest_even``,
  ``toward_zero``, ``nearest_away``), as float64; non-floating arrays
  unchanged."""
  x = np.asarray(x)
  if not np.issubdtype(x.dtype, np.floating):
    return x
  if mode == "nearest_even":
    return round_nearest(x, fmt)
  f = _core.FORMATS[fmt]
  with np.errstate(all="ignore"):
    _, e = np.frexp(np.maximum(np.abs(x), f.min_normal))
    q = np.ldexp(1.0, e - 1 - f.mantissa_bits)
    a = np.abs(x) / q
    mag = (np.floor(a) if mode == "toward_zero" else np.floor(a + 0.5)) * q
    y = np.copysign(mag, x)
    big = np.abs(y) > f.max
    if mode == "toward_zero":
      y = np.where(big, np.copysign(f.max, x), y)
    else:
      y = np.where(big, np.copysign(np.inf if f.has_inf else np.nan, x), y)
    return np.where(np.isfinite(x), y, x)


def plain_sum(x: np.ndarray, axis: int) -> np.ndarray:
  """The exact (float64) sum along ``axis``, kept as a length-1 axis."""
  return np.sum(x, axis=axis, keepdims=True)


def last_block(length: int, width: int) -> tuple[int, int]:
  """``(start, stop)`` of the last block of ``width`` along ``length``:
  the partial block when ``length % width``."""
  start = width * ((length - 1) // width)
  return start, length


def block_span(length: int, width: int, where: str) -> tuple[int, int]:
  """``(start, stop)`` of the ``first`` or ``last`` block of ``width``."""
  if where == "first":
    return 0, min(width, length)
  return last_block(length, width)


def block_weights(length: int, width: int, where: str, op: str
                  ) -> np.ndarray:
  """Each term's weight in a sum whose ``where`` block is dropped
  (weight 0) or counted twice (weight 2), the others 1."""
  w = np.ones(length)
  lo, hi = block_span(length, width, where)
  w[lo:hi] = 0.0 if op == "drop" else 2.0
  return w


def weighted_sum(weights: np.ndarray) -> Reduce:
  """A reduction with these per-term weights along its axis."""
  def reduce(x: np.ndarray, axis: int) -> np.ndarray:
    shape = [1] * x.ndim
    shape[axis] = -1
    return np.sum(x * weights.reshape(shape), axis=axis, keepdims=True)
  return reduce


def sequential_sum(fmt: str) -> Reduce:
  """A reduction summed in order in ``fmt``: each term and each partial
  sum rounded to nearest (a narrow accumulator)."""
  def reduce(x: np.ndarray, axis: int) -> np.ndarray:
    terms = round_nearest(np.moveaxis(x, axis, -1), fmt)
    acc = np.zeros(terms.shape[:-1])
    for i in range(terms.shape[-1]):
      acc = round_nearest(acc + terms[..., i], fmt)
    return np.expand_dims(acc, axis)
  return reduce


class Online(NamedTuple):
  """An online softmax over blocks of ``width`` that does not rescale
  what it carries when a block raises the running max: ``sum`` (the
  running sum of exponentials), ``acc`` (attention's running output) or
  ``both``."""

  width: int
  where: str

  @property
  def keeps_sum(self) -> bool:
    return self.where == "acc"

  @property
  def keeps_acc(self) -> bool:
    return self.where == "sum"


def online_softmax(z: np.ndarray, online: Online, exp=np.exp,
                   values: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """An online softmax along the last axis of ``z``, block by block.

  Args:
    z: scores (..., L).
    online: the block width and what is left unrescaled.
    exp: the exponential.
    values: attention's values (..., L, Dv) for the running output, or
      None.

  Returns:
    ``(m, l, acc)``: the final running max (..., 1), the running sum
    (..., 1) and the running output (..., Dv) (None without values).
  """
  length = z.shape[-1]
  m = np.full(z.shape[:-1] + (1,), -np.inf)
  l = np.zeros(z.shape[:-1] + (1,))
  acc = None if values is None else np.zeros(
      z.shape[:-1] + values.shape[-1:])
  for lo in range(0, length, online.width):
    blk = z[..., lo:lo + online.width]
    new = np.maximum(m, np.max(blk, axis=-1, keepdims=True))
    with np.errstate(invalid="ignore", over="ignore"):
      fix = np.where(np.isfinite(m), exp(m - new), 0.0)
    p = exp(blk - new)
    l = (l * fix if online.keeps_sum else l) + np.sum(p, -1, keepdims=True)
    if acc is not None:
      part = np.matmul(p, values[..., lo:lo + online.width, :])
      acc = (acc * fix if online.keeps_acc else acc) + part
    m = new
  return m, l, acc


def significand(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``(f, e)``: ``|x| = (1 + f) 2**e`` with ``f`` in [0, 1)."""
  m, e = np.frexp(np.abs(np.asarray(x, np.float64)))
  return 2.0 * m - 1.0, e - 1


def as_float32_bits(x: np.ndarray) -> np.ndarray:
  """The float32 bit patterns of ``x`` (int64, for bit tricks)."""
  return np.asarray(x, np.float32).view(np.int32).astype(np.int64)


def from_float32_bits(bits: np.ndarray) -> np.ndarray:
  """float64 values of float32 bit patterns (wrapped to 32 bits)."""
  b = (np.asarray(bits, np.int64) & 0xFFFFFFFF).astype(np.uint32)
  return b.view(np.float32).astype(np.float64)


LOG2E = 1.0 / math.log(2.0)
