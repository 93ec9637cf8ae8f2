"""A record's layout: its 2-D view (R, C), flat, possibly padded to a size bucket.

The Analyzer's per-record programs (the statistics pass, the screen and
the noise-aware decomposition) take a record *flat*: its R x C elements
row-major, then padding up to the length of the arrays, with R and C
given as values that may be traced. On CPU the entry points pad every
record to its size bucket (:func:`bucket`: the next power of two) and pass
(R, C) as an operand, so one compiled program serves every record shape of
a bucket and dtype: a new shape compiles nothing when its bucket was seen.
Traced as one record of its own shape (``signature_pure``, the batched and
streaming forms, other platforms), R and C are Python ints and the
padding is empty.

Row, column and tile results of a padded record are as long as the bucket
(zero beyond the record's R, C and tiles): :func:`trim` cuts them to the
record's own.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.analyzer.signature._signature import Array, TILE_SIZES

#: The smallest size bucket (records of up to this many elements share it).
MIN_BUCKET = 1 << 12
#: A bucket's per-row and per-column results hold this many times the
#: square root of its length (rounded up to a power of two) slots: a
#: record whose rows and columns both fit runs there; a longer one (a
#: row of 70,000) runs in the bucket's long form, with a slot per element.
LINES_PER_ROOT = 8

#: Result fields that are per row, per column, and per aligned 8x8 tile.
ROW_FIELDS = ("row_ndiff", "row_abs_max", "row_abs_mean", "out_rows",
              "row_delta", "row_resid", "row_err")
COL_FIELDS = ("col_ndiff", "col_abs_mean", "out_cols")
TILE_FIELDS = ("tile_ndiff",)


def view2d(shape) -> tuple[int, int]:
  """The 2-D view (R, C) of a record shape: C the last axis (1-D: R = 1)."""
  if len(shape) <= 1:
    return 1, int(math.prod(shape))
  return int(math.prod(shape[:-1])), int(shape[-1])


def bucket(n: int) -> int:
  """The size bucket of an n-element record: the next power of two, at
  least MIN_BUCKET."""
  return max(MIN_BUCKET, 1 << max(int(n) - 1, 0).bit_length())


def lines(cap: int, rows: int, cols: int) -> int:
  """The per-row and per-column slots of an (R, C) record in bucket
  ``cap``: LINES_PER_ROOT x sqrt(cap) (a power of two) when R and C fit,
  else ``cap`` (every (R, C) of at most ``cap`` elements fits)."""
  root = 1 << ((cap - 1).bit_length() + 1) // 2
  short = min(cap, LINES_PER_ROOT * root)
  return short if max(rows, cols) <= short else cap


class Dims(NamedTuple):
  """A padded record's 2-D view, as the per-record programs take it.

  Attributes:
    rc: int32[2]: (R, C), traced (one executable for every shape).
    lines: int: its per-row and per-column slots (static: :func:`lines`).
  """

  rc: Array
  lines: int


class Layout(NamedTuple):
  """Index arrays of a flat record (traced).

  Attributes:
    rows, cols: R and C (Python ints, or traced int32 scalars).
    n: R * C.
    cap: the flat length (static): n, or the bucket's.
    valid: bool[cap]: the record's elements (the padding False).
    row: int32[cap]: each element's row (``row_slots`` for padding:
      dropped by :func:`seg_sum`).
    col: int32[cap]: its column (``col_slots`` for padding).
    row_slots, col_slots: the length of per-row and per-column results
      (static): R and C when they are ints, else the :class:`Dims`'s
      ``lines``.
    static: R and C are ints and the arrays hold exactly R x C elements
      (reductions by row and column are reshapes, not segment sums).
  """

  rows: Array | int
  cols: Array | int
  n: Array | int
  cap: int
  valid: Array
  row: Array
  col: Array
  row_slots: int
  col_slots: int
  static: bool


def layout(cap: int, rows, cols, slots: int | None = None) -> Layout:
  """The :class:`Layout` of a record of (rows, cols) in ``cap`` elements
  (``slots``: its per-row and per-column slots when R and C are traced)."""
  i = jnp.arange(cap, dtype=jnp.int32)
  n = rows * cols
  valid = i < n
  c = jnp.maximum(jnp.asarray(cols, jnp.int32), 1)
  static = isinstance(rows, int) and isinstance(cols, int)
  row_slots, col_slots = (rows, cols) if static else (slots, slots)
  row = jnp.where(valid, i // c, row_slots)
  col = jnp.where(valid, i % c, col_slots)
  return Layout(rows, cols, n, cap, valid, row, col, row_slots, col_slots,
                static and rows * cols == cap)


def seg_sum(x: Array, ids: Array, num: int) -> Array:
  """Sums of ``x`` by ``ids`` into ``num`` slots (ids >= num dropped)."""
  return jnp.zeros((num,), x.dtype).at[ids].add(x, mode="drop")


def rows_sum(lay: Layout, *xs: Array) -> list[Array]:
  """Per-row sums of flat values of one dtype (``row_slots`` long each):
  reshapes when the layout is static, else one segment sum of them all
  (one scatter, however many values)."""
  return _sums(lay, xs, axis=1)


def cols_sum(lay: Layout, *xs: Array) -> list[Array]:
  """Per-column sums, as :func:`rows_sum` (``col_slots`` long each)."""
  return _sums(lay, xs, axis=0)


def _sums(lay: Layout, xs, axis: int) -> list[Array]:
  if lay.static:
    return [jnp.sum(x.reshape(lay.rows, lay.cols), axis=axis, dtype=x.dtype)
            for x in xs]
  ids, num = (lay.row, lay.row_slots) if axis == 1 else (lay.col,
                                                        lay.col_slots)
  if len(xs) == 1:
    return [seg_sum(xs[0], ids, num)]
  both = jnp.zeros((num, len(xs)), xs[0].dtype).at[ids].add(
      jnp.stack(xs, axis=-1), mode="drop")
  return [both[:, i] for i in range(len(xs))]


def per_element(lay: Layout, v: Array) -> Array:
  """A per-row value at each element of its row (flat)."""
  if lay.static:
    return jnp.broadcast_to(v[:, None], (lay.rows, lay.cols)).reshape(-1)
  return v[jnp.minimum(lay.row, lay.row_slots - 1)]


def tile_counts(tile: Array, rows, cols, steps):
  """Totals, tiles with a count and tiles full, for edges TILE_SIZES
  (8, 16, 32), from the 8x8 tile counts (flat or (R // 8, C // 8),
  row-major, then zeros; R and C may be traced): the larger tiles are
  sums of the 8x8 ones. A tile is full at ``edge**2 * steps``."""
  tile = tile.reshape(-1)
  cap = tile.shape[0]
  tr8, tc8 = rows // 8, cols // 8
  i = jnp.arange(cap, dtype=jnp.int32)
  a, b = i // jnp.maximum(tc8, 1), i % jnp.maximum(tc8, 1)
  tot, anyd, alld = [], [], []
  for ts in TILE_SIZES:
    k = ts // 8
    r, cc = tr8 // k, tc8 // k
    full = ts * ts * steps
    if k == 1:
      m = tile
    else:
      inside = (i < tr8 * tc8) & (a < r * k) & (b < cc * k)
      m = seg_sum(tile, jnp.where(inside, (a // k) * cc + b // k, cap), cap)
    tot.append(jnp.asarray(r * cc, jnp.int32))
    anyd.append(jnp.sum(m > 0, dtype=jnp.int32))
    alld.append(jnp.sum(m == full, dtype=jnp.int32))
  return jnp.stack(tot), jnp.stack(anyd), jnp.stack(alld)


def flat(x: Array, dims: Dims | None):
  """A record flat, its (R, C) and its row and column slots: from
  ``dims``, or its own shape's view (slots R and C)."""
  if dims is None:
    rows, cols = view2d(x.shape)
    return x.reshape(-1), rows, cols, None
  return x.reshape(-1), dims.rc[0], dims.rc[1], dims.lines


def pad(x, cap: int, dtype) -> jax.Array:
  """A record flat, zero-padded to ``cap`` elements, on the device.

  On CPU (where records run padded) a host array, or a CPU device array's
  host view, becomes a device array without a copy (``may_alias``): a
  4096 x 4096 record filling its bucket costs no copy, not two (about
  20 ms each, mostly the fresh buffer's page faults); a shorter one costs
  the one copy into its padded buffer."""
  a = np.asarray(x, dtype=dtype).reshape(-1)
  if a.size != cap:
    out = np.zeros((cap,), dtype)
    out[:a.size] = a
    a = out
  return jax.device_put(a, may_alias=True)


def trim(result, rows: int, cols: int):
  """A padded record's result (host NumPy NamedTuple: a Signature,
  Decomposition or Screen) with its row, column and tile fields cut to
  the record's own (tiles as (R // 8, C // 8))."""
  fields = result._fields
  cut = {}
  for name in ROW_FIELDS:
    if name in fields:
      cut[name] = getattr(result, name)[:rows]
  for name in COL_FIELDS:
    if name in fields:
      cut[name] = getattr(result, name)[:cols]
  for name in TILE_FIELDS:
    if name in fields:
      tr, tc = rows // 8, cols // 8
      cut[name] = getattr(result, name).reshape(-1)[:tr * tc].reshape(tr, tc)
  return result._replace(**cut) if cut else result
