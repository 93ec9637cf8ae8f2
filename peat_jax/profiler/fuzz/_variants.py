"""Variants of a site's captured real inputs: other shapes, masks, magnitudes.

A variant is the site's call on inputs derived from one captured record,
never drawn from a distribution: an axis cut keeps a seeded subset of the
real slices (in order); an axis grown keeps every real slice and fills the
new positions with values drawn from the same input's real values (never
zeros). Masks and positions are regenerated with the structure they had
(a causal mask stays causal, positions stay ``arange``). Every variant is
built by its own generator, seeded from ``(seed, site, variant name)``:
the same variant is the same arrays in any order, any process, and
:func:`build` rebuilds one by name (``peat.export_repro``).

Families (``Plan.family``) and what each tries, per site kernel:

| family | variants |
| --- | --- |
| ``batch`` | the leading batch axis at 1, 3 and 7 (odd, prime) |
| ``rows`` | one row: every row axis 1 (a GEMV path for ``dot_general``) |
| ``length`` | the reduction / normalized / sequence axis at each multiple of 8, 16, 32, 64, 128, 4096 and one either side, 2^14 and one either side, 2^16 (rows cut to fit :data:`MAX_ELEMENTS`), and 2^20 for one row |
| ``attention`` | q_len < kv_len and q_len > kv_len (causal masks aligned bottom-right), len % 128 == 64, fully masked query rows, two packed sequences per row with a block-diagonal causal mask, fewer KV heads (H/2, 1), head dims 64/128/256 |
| ``magnitude`` | the first input scaled by 2^k, k up to the golden dtype's overflow edge (the largest k, of a few, whose golden output stays finite) |
| ``denormal`` | the first input scaled into the subnormal range of its dtype |
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable, NamedTuple, Sequence

import jax
import ml_dtypes
import numpy as np

from peat_jax.core import PeatError

#: Largest input of a variant, in elements (rows are cut to fit).
MAX_ELEMENTS = 1 << 22
#: The families, in the order a site's plans interleave them.
FAMILIES = ("batch", "rows", "length", "attention", "magnitude", "denormal")
_MULTIPLES = (8, 16, 32, 64, 128, 4096)
_BATCHES = (1, 3, 7)
_HEAD_DIMS = (64, 128, 256)


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
    family: one of :data:`FAMILIES`.
    make: ``make(rng) -> Call``: builds the variant's call.
  """

  name: str
  family: str
  make: Callable[[np.random.Generator], Call]


def rng_of(seed: int, site: str, name: str) -> np.random.Generator:
  """The generator of one variant (stable across processes)."""
  return np.random.default_rng(
      [int(seed), zlib.crc32(site.encode()), zlib.crc32(name.encode())])


def _is_float(x) -> bool:
  return isinstance(x, np.ndarray) and np.issubdtype(
      x.dtype, np.floating) or (isinstance(x, np.ndarray)
                                and x.dtype == ml_dtypes.bfloat16)


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


def scaled(x: np.ndarray, k: int) -> np.ndarray:
  """``x * 2^k`` rounded once to ``x``'s dtype (exact where representable).

  Mask fills (magnitudes from half the format's max up) and non-finite
  values stay as they are: a scaled fill is no mask any more (the lowest
  float32 times 2^-129 is -0.5, a weight of its own in a softmax)."""
  x64 = x.astype(np.float64)
  keep = ~np.isfinite(x64) | (np.abs(x64) >= float(_finfo(x.dtype).max) / 2)
  with np.errstate(over="ignore"):
    out = (x64 * math.ldexp(1.0, k)).astype(x.dtype)
  return np.where(keep, x, out)


def _finfo(dtype):
  return ml_dtypes.finfo(dtype)


def length_ladder(current: int) -> list[int]:
  """The ``length`` family's sizes, without the current one."""
  sizes = []
  for m in _MULTIPLES:
    sizes += [m - 1, m, m + 1]
  sizes += [(1 << 14) - 1, 1 << 14, (1 << 14) + 1, 1 << 16, 1 << 20]
  return [s for s in dict.fromkeys(sizes) if s != current and s >= 1]


def _fit(rows: int, per_row: int) -> int:
  """Rows that fit :data:`MAX_ELEMENTS` with ``per_row`` elements each."""
  return max(1, min(rows, MAX_ELEMENTS // max(per_row, 1)))


# --------------------------------------------------------------- helpers


def _set_axis(call: Call, where: Sequence[tuple[int, int]], n: int,
              rng) -> Call:
  """``call`` with the coupled axes ``where`` ((arg, axis) pairs) at n."""
  args = list(call.args)
  xs = resize([args[i] for i, _ in where], [a for _, a in where], n, rng)
  for (i, _), x in zip(where, xs):
    args[i] = x
  return Call(tuple(args), call.kwargs)


def _fit_rows(call: Call, length: Sequence[tuple[int, int]], n: int,
              rows: Sequence[Sequence[tuple[int, int]]], rng) -> Call:
  """Cuts row axes (outermost first) so that every input of the coupled
  length axes fits :data:`MAX_ELEMENTS` once that axis is ``n`` long."""
  for where in rows:
    i, a = where[0]
    for j, b in length:
      if i != j:
        continue
      x = call.args[j]
      after = x.size // x.shape[b] * n
      if after > MAX_ELEMENTS and x.shape[a] > 1:
        m = max(1, x.shape[a] // -(-after // MAX_ELEMENTS))
        call = _set_axis(call, where, m, rng)
  return call


def _length_plans(base: Call, length: Sequence[tuple[int, int]],
                  rows: Sequence[Sequence[tuple[int, int]]],
                  longest: int = 1 << 20) -> list[Plan]:
  """``length`` plans of the coupled axes ``length`` up to ``longest``;
  rows cut to fit (every row axis 1 for 2^20)."""
  i0, a0 = length[0]
  current = base.args[i0].shape[a0]
  plans = []
  for n in [m for m in length_ladder(current) if m <= longest]:
    def make(rng, n=n):
      call = base
      if n >= 1 << 20:  # one row
        for where in rows:
          call = _set_axis(call, where, 1, rng)
      call = _fit_rows(call, length, n, rows, rng)
      return _set_axis(call, length, n, rng)
    plans.append(Plan(f"len={n}", "length", make))
  return plans


def _batch_plans(base: Call, batch: Sequence[tuple[int, int]] | None,
                 rows: Sequence[Sequence[tuple[int, int]]] = ()
                 ) -> list[Plan]:
  plans = []
  if batch:
    i0, a0 = batch[0]
    current = base.args[i0].shape[a0]
    for n in _BATCHES:
      if n != current:
        plans.append(Plan(f"batch={n}", "batch",
                          lambda rng, n=n: _set_axis(base, batch, n, rng)))
  if rows and any(base.args[w[0][0]].shape[w[0][1]] != 1 for w in rows):
    def one(rng):
      call = base
      for where in rows:
        call = _set_axis(call, where, 1, rng)
      return call
    plans.append(Plan("rows=1", "rows", one))
  return plans


def magnitude_plans(base: Call, golden: Callable[[Call], Any],
                    linear: bool) -> list[Plan]:
  """``magnitude`` and ``denormal`` plans of the first float input.

  Args:
    base: the captured call.
    golden: runs the golden kernel on a call (its first output is read).
    linear: the output scales with the first input (a matmul, a
      convolution): the overflow edge is the output's, else the input's.

  Returns:
    The plans (none when the first input is not a float array or is all
    zero).
  """
  x = base.args[0] if base.args else None
  if not _is_float(x):
    return []
  fi = _finfo(x.dtype)
  fx = np.abs(x.astype(np.float64))
  # Mask fills (the format's max) and non-finite values set no scale.
  fx = fx[np.isfinite(fx) & (fx < float(fi.max) / 2) & (fx > 0)]
  if not fx.size:
    return []
  amax = float(fx.max())
  if linear:
    g = np.abs(np.asarray(_first(golden(base))).astype(np.float64))
    g = g[np.isfinite(g)]
    amax = max(float(g.max()) if g.size else amax, amax)
  edge = int(math.floor(math.log2(float(fi.max) / amax))) - 1
  low = int(math.floor(math.log2(float(fi.smallest_normal) / float(fx.max()))))

  def with_first(k):
    return Call((scaled(x, k),) + tuple(base.args[1:]), base.kwargs)

  def up(rng):
    del rng
    last = None
    for k in sorted({edge, (3 * edge) // 4, edge // 2}, reverse=True):
      if k <= 0:
        continue
      call = with_first(k)
      out = np.asarray(_first(golden(call)))
      if np.all(np.isfinite(out.astype(np.float32))):
        return call
      last = k
    raise PeatError(f"no magnitude up to 2^{edge} keeps the golden output "
                    f"finite (tried down to 2^{last})")

  plans = []
  if edge > 0:
    plans.append(Plan("scale=edge", "magnitude", up))
  plans.append(Plan(f"scale=2^{low}", "denormal",
                    lambda rng: with_first(low)))
  return plans


def _first(out):
  return jax.tree.leaves(out)[0]


# ------------------------------------------------------------ per kernel


def _dot_general(base: Call) -> tuple[list, list, list]:
  lhs, rhs = base.args[:2]
  (lc, rc), (lb, rb) = base.kwargs["dimension_numbers"]
  free_l = [a for a in range(lhs.ndim) if a not in lc and a not in lb]
  free_r = [a for a in range(rhs.ndim) if a not in rc and a not in rb]
  rows = [[(0, a)] for a in free_l]
  batch = [(0, lb[0]), (1, rb[0])] if lb else (rows[0] if rows else None)
  length = ([(0, lc[-1]), (1, rc[-1])] if lc else None)
  cols = [[(1, a)] for a in free_r]
  return batch, rows + cols, length


def _conv(base: Call) -> tuple[list, list, list]:
  dn = base.kwargs["dimension_numbers"]
  lhs_spec, rhs_spec = dn.lhs_spec, dn.rhs_spec
  batch = [(0, lhs_spec[0])]
  length = [(0, lhs_spec[1]), (1, rhs_spec[1])]
  return batch, [batch], length


def primitive_plans(kernel: str, base: Call, golden) -> list[Plan]:
  """The plans of a primitive site (``dot_general``, convolutions,
  reductions, elementwise primitives)."""
  if kernel == "dot_general":
    batch, rows, length = _dot_general(base)
    lhs_rows = [r for r in rows if r[0][0] == 0]
    plans = _batch_plans(base, batch, lhs_rows)
    if length:  # the output loses the axis: one row of 2^20 is one value
      plans += _length_plans(base, length, rows, 1 << 16)
    return plans + magnitude_plans(base, golden, linear=True)
  if kernel == "conv_general_dilated":
    batch, rows, length = _conv(base)
    plans = _batch_plans(base, batch)
    plans += _length_plans(base, length, rows, 4097)
    return plans + magnitude_plans(base, golden, linear=True)
  x = base.args[0]
  if kernel.startswith("reduce_") or kernel in ("argmax", "argmin"):
    axes = tuple(base.kwargs.get("axes", ()))
    keep = [a for a in range(x.ndim) if a not in axes]
    rows = [[(0, a)] for a in keep]
    plans = _batch_plans(base, rows[0] if rows else None, rows)
    if axes:
      plans += _length_plans(base, [(0, axes[-1])], rows, 1 << 16)
    return plans + magnitude_plans(base, golden, linear=False)
  if x.ndim == 0:
    return magnitude_plans(base, golden, linear=False)
  same = [i for i, y in enumerate(base.args)
          if isinstance(y, np.ndarray) and y.shape == x.shape]
  rows = [[(i, a) for i in same] for a in range(x.ndim - 1)]
  plans = _batch_plans(base, rows[0] if rows else None, rows)
  plans += _length_plans(base, [(i, x.ndim - 1) for i in same], rows)
  return plans + magnitude_plans(base, golden, linear=False)


def _row_axes(x: np.ndarray, others: Sequence[int] = ()) -> list:
  """Every leading axis of ``x`` (input 0), coupled with the same axis of
  the inputs ``others`` of the same shape."""
  return [[(0, a)] + [(i, a) for i in others] for a in range(x.ndim - 1)]


def _rowwise(base: Call, coupled_last: Sequence[int],
             same_shape: Sequence[int], golden) -> list[Plan]:
  x = base.args[0]
  rows = _row_axes(x, same_shape)
  plans = _batch_plans(base, rows[0] if rows else None, rows)
  length = [(0, x.ndim - 1)] + [(i, base.args[i].ndim - 1)
                                for i in coupled_last]
  plans += _length_plans(base, length, rows)
  return plans + magnitude_plans(base, golden, linear=False)


def composite_plans(kind: str, base: Call, golden) -> list[Plan]:
  """The plans of a composite site of a known kind.

  Raises:
    PeatError: a kind without variants (the message names those that have).
  """
  args = base.args
  if kind in ("softmax", "log_softmax", "gelu"):
    return _rowwise(base, (), (), golden)
  if kind == "silu":
    two = [i for i in range(1, len(args)) if isinstance(args[i], np.ndarray)]
    return _rowwise(base, two, two, golden)
  if kind in ("layer_norm", "rms_norm"):
    params = [i for i in range(1, len(args)) if isinstance(
        args[i], np.ndarray) and args[i].ndim >= 1]
    return _rowwise(base, params, (), golden)
  if kind == "cross_entropy":
    x = args[0]
    rows = _row_axes(x, (1,))
    plans = _batch_plans(base, rows[0] if rows else None, rows)
    return plans + magnitude_plans(base, golden, linear=False)
  if kind == "rope":
    return _rope(base, golden)
  raise PeatError(f"no fuzz variants for composite kind {kind!r}; expected "
                  f"one of {sorted(KINDS | {'attention'})}")


def _positions(pos: np.ndarray, n: int, rng) -> np.ndarray:
  """Positions of ``n`` tokens: ``arange`` continued when they were one,
  else the real positions cut or grown."""
  if np.array_equal(pos, np.arange(pos.shape[0], dtype=pos.dtype)):
    return np.arange(n, dtype=pos.dtype)
  return resize([pos], [0], n, rng)[0]


def _rope(base: Call, golden) -> list[Plan]:
  x, pos = base.args[0], base.args[1]
  plans = []
  for n in _BATCHES:
    if n != x.shape[0]:
      plans.append(Plan(f"batch={n}", "batch", lambda rng, n=n: _set_axis(
          base, [(0, 0)], n, rng)))
  for n in [s for s in length_ladder(x.shape[1]) if s <= 1 << 16]:
    def make(rng, n=n):
      per = x.size // (x.shape[0] * x.shape[1]) * n
      b = _fit(x.shape[0], per)
      y = resize([x], [0], b, rng)[0] if b < x.shape[0] else x
      per_t = y.size // y.shape[1]
      if per_t * n > MAX_ELEMENTS:
        y = resize([y], [2], max(1, MAX_ELEMENTS // (n * y.shape[0]
                                                     * y.shape[3])), rng)[0]
      y = resize([y], [1], n, rng)[0]
      return Call((y, _positions(pos, n, rng)) + tuple(args_rest(base)),
                  base.kwargs)
    plans.append(Plan(f"len={n}", "length", make))
  for d in _HEAD_DIMS:
    if d != x.shape[-1]:
      plans.append(Plan(f"head_dim={d}", "attention", lambda rng, d=d: Call(
          (resize([x], [3], d, rng)[0], pos) + tuple(args_rest(base)),
          base.kwargs)))
  return plans + magnitude_plans(base, golden, linear=False)


def args_rest(base: Call) -> tuple:
  return tuple(base.args[2:])


#: Composite kinds with variants here (``attention``'s are in
#: ``_attention``).
KINDS = frozenset({"softmax", "log_softmax", "gelu", "silu", "layer_norm",
                   "rms_norm", "cross_entropy", "rope"})


def interleave(plans: Sequence[Plan]) -> list[Plan]:
  """Plans ordered so that a small budget covers every family first."""
  by = {f: [p for p in plans if p.family == f] for f in FAMILIES}
  out = []
  while any(by.values()):
    for f in FAMILIES:
      if by[f]:
        out.append(by[f].pop(0))
  return out
