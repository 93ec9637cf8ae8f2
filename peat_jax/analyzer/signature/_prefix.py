"""Exact integer prefix sums and ``nonzero`` in few, wide XLA operations.

``jnp.cumsum`` lowers on CPU to an associative scan of dozens of
``reduce-window`` steps, each a separate thunk, and ``jnp.nonzero`` to one
of those over the whole array: most of their cost is per-operation
overhead. Integer sums are exact in any order, so the same values come
from a masked sum against a triangular matrix (one fusion), blockwise for
long arrays.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from peat_jax.analyzer.signature._signature import Array

_BLOCK = 32  # elements per block of the blockwise prefix sum


def cumsum_small(x: Array) -> Array:
  """``jnp.cumsum`` of a short 1-D integer array (a histogram), exactly."""
  n = x.shape[0]
  tri = np.tril(np.ones((n, n), bool))
  return jnp.sum(jnp.where(tri, x[None, :], 0), axis=1, dtype=x.dtype)


def _exclusive(x: Array) -> Array:
  """Exclusive prefix sums of a 1-D int32 array, blockwise."""
  n = x.shape[0]
  if n <= 4 * _BLOCK:
    return cumsum_small(x) - x
  nb = -(-n // _BLOCK)
  xb = jnp.pad(x, (0, nb * _BLOCK - n)).reshape(nb, _BLOCK)
  tri = np.tril(np.ones((_BLOCK, _BLOCK), bool), -1)
  within = jnp.sum(jnp.where(tri[None], xb[:, None, :], 0), axis=2,
                   dtype=x.dtype)  # [nb, B]: earlier elements of the block
  offsets = _exclusive(jnp.sum(xb, axis=1, dtype=x.dtype))
  return (within + offsets[:, None]).reshape(-1)[:n]


def first_true(mask: Array, size: int) -> Array:
  """``jnp.nonzero(mask, size=size, fill_value=0)[0]`` of a 1-D mask.

  The first ``size`` indices where ``mask`` holds, ascending, then zeros.
  """
  n = mask.shape[0]
  m = mask.astype(jnp.int32)
  rank = _exclusive(m)
  dest = jnp.where(mask & (rank < size), rank, size)
  return jnp.zeros((size,), jnp.int32).at[dest].set(
      jnp.arange(n, dtype=jnp.int32), mode="drop")
