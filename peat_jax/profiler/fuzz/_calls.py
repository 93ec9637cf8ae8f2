"""The pieces every variant is made of: a call, a plan, seeded cuts.

A cut keeps a seeded subset of the real slices of an axis, in order; a
growth keeps every real slice and fills the new positions with values
drawn from the same input's real values (never zeros). Each variant has
its own generator, seeded from ``(seed, site, variant name)``.
"""

from __future__ import annotations

import zlib
from typing import Callable, NamedTuple, Sequence

import ml_dtypes
import numpy as np

#: Largest input of a variant, in elements (other axes are cut to fit).
MAX_ELEMENTS = 1 << 22


class Call(NamedTuple):
  """A site call: positional arguments and keyword arguments.

  For a primitive site ``args`` are its input arrays and ``kwargs`` its
  parameters; for a composite site they are the arguments of the KUT
  convention (arrays and static values).
  """

  args: tuple
  kwargs: dict


class Plan(NamedTuple):
  """One variant, not yet built.

  Attributes:
    name: the variant's name, unique within a site (``"len=4097"``).
    family: one of :data:`peat_jax.profiler.fuzz._variants.FAMILIES`.
    make: ``make(rng) -> Call``: builds the variant's call.
  """

  name: str
  family: str
  make: Callable[[np.random.Generator], Call]


def rng_of(seed: int, site: str, name: str) -> np.random.Generator:
  """The generator of one variant (stable across processes)."""
  return np.random.default_rng(
      [int(seed), zlib.crc32(site.encode()), zlib.crc32(name.encode())])


def is_float(x) -> bool:
  """A host float array (bfloat16 included)."""
  return isinstance(x, np.ndarray) and (
      np.issubdtype(x.dtype, np.floating) or x.dtype == ml_dtypes.bfloat16)


def finfo(dtype):
  """``ml_dtypes.finfo`` (bfloat16 and the fp8 formats included)."""
  return ml_dtypes.finfo(dtype)


def draw(x: np.ndarray, shape, rng: np.random.Generator) -> np.ndarray:
  """Values drawn (with replacement) from ``x``'s own values."""
  flat = x.reshape(-1)
  return flat[rng.integers(0, flat.size, size=tuple(shape))]


def cut_index(length: int, n: int, rng: np.random.Generator) -> np.ndarray:
  """``n`` of ``range(length)``, seeded, in order (``n <= length``)."""
  return np.sort(rng.choice(length, size=n, replace=False))


def resize(xs: Sequence[np.ndarray], axes: Sequence[int], n: int,
           rng: np.random.Generator) -> list[np.ndarray]:
  """Arrays whose coupled axes (one per array) cut or grown to ``n``.

  A cut keeps the same real slices of every array; a growth keeps all of
  them and fills the new positions of each array with its own values.
  """
  length = xs[0].shape[axes[0]]
  if n <= length:
    idx = cut_index(length, n, rng)
    return [np.take(x, idx, axis=a) for x, a in zip(xs, axes)]
  out = []
  for x, a in zip(xs, axes):
    shape = list(x.shape)
    shape[a] = n - length
    out.append(np.concatenate([x, draw(x, shape, rng)], axis=a))
  return out


def set_axis(call: Call, where: Sequence[tuple[int, int]], n: int,
             rng) -> Call:
  """``call`` with the coupled axes ``where`` ((arg, axis) pairs) at n."""
  args = list(call.args)
  xs = resize([args[i] for i, _ in where], [a for _, a in where], n, rng)
  for (i, _), x in zip(where, xs):
    args[i] = x
  return Call(tuple(args), call.kwargs)
