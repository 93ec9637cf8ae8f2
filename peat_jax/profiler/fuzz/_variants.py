"""Variants of a site's captured real inputs: other shapes, masks, magnitudes.

A variant is the site's call on inputs derived from one captured record,
never drawn from a distribution: an axis cut keeps a seeded subset of the
real slices (in order); an axis grown keeps every real slice and fills the
new positions with values drawn from the same input's real values (never
zeros). Masks and positions are regenerated with the structure they had
(a causal mask stays causal, positions stay ``arange``). Every variant is
built by its own generator, seeded from ``(seed, site, variant name)``:
the same variant is the same arrays in any order, any process, and
:func:`peat_jax.profiler.fuzz.build` rebuilds one by name
(``peat.export_repro``).

Every axis of every operand a site's kernel has is varied on the lattice
of :mod:`._lattice` (1, 2, 3, and ``2^j - 1``, ``2^j``, ``2^j + 1``,
``2^j + 2^(j-1)`` up to 2^16, plus seeded draws); a variant is named
``<axis>=<length>``. Axes and families (``Plan.family``), per kernel:

| kernel | axes (family) |
| --- | --- |
| ``dot_general`` | ``batch`` (batch), ``m`` (rows: the output's rows), ``len`` (length: the contraction), ``n`` (features: the output's columns); more of a kind are numbered by their axis (``m1``, ``k2``, ``n3``) |
| convolutions | ``batch``, ``len`` (input channels), ``channels`` (features: output channels), ``spatial<i>`` and ``window<i>`` (spatial) |
| reductions | ``batch`` and ``rows<a>`` (the kept axes), ``len`` (the reduced axis) |
| elementwise, ``softmax``, ``log_softmax``, ``gelu``, ``silu``, ``layer_norm``, ``rms_norm`` | ``batch``, ``rows<a>``, ``len`` (the last axis; a layer norm's scale and bias with it) |
| ``cross_entropy`` | ``batch``, ``rows<a>``, ``len`` (the classes; labels follow their class) |
| ``rope`` | ``batch``, ``len`` (positions follow), ``heads``, ``head_dim`` (even) |
| ``attention`` | ``batch``, ``len`` (q and kv), ``q_len``, ``kv_len`` (length), ``heads``, ``kv_heads`` (heads), ``head_dim`` (module ``_attention``) |

and beside them: ``rows=1`` (every row axis 1: a GEMV path), ``len=1048576``
(one row of 2^20, row-wise kernels), the ``mask`` family (softmax sites:
padding, fully masked rows, causal with q_len != kv_len, module
``_masks``; attention sites: module ``_attention``), the ``attention``
family (q_len != kv_len, packed sequences), ``joint`` and ``tail`` (every
axis at once: one on its lattice with the others at one or an odd length,
seeded draws of all, and the length axis swept over the element count's
residues; module ``_lattice``), ``magnitude`` (the first input scaled by
2^k up to the golden dtype's overflow edge) and ``denormal`` (scaled into
the subnormal range).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import numpy as np

from peat_jax.core import PeatError
from peat_jax.profiler.fuzz import _lattice as L
from peat_jax.profiler.fuzz import _masks
from peat_jax.profiler.fuzz._calls import (  # noqa: F401  (the module's API)
    Call, MAX_ELEMENTS, Plan, cut_index, draw, finfo, is_float, resize,
    rng_of, set_axis)
from peat_jax.profiler.fuzz._lattice import FAMILIES, interleave, lattice  # noqa: F401

#: One row of this length: the ``length`` family's extra for row-wise
#: kernels (past 2^16, where a kernel's blocking of a row changes).
ONE_ROW = 1 << 20


def scaled(x: np.ndarray, k: int) -> np.ndarray:
  """``x * 2^k`` rounded once to ``x``'s dtype (exact where representable).

  Mask fills (magnitudes from half the format's max up) and non-finite
  values stay as they are: a scaled fill is no mask any more (the lowest
  float32 times 2^-129 is -0.5, a weight of its own in a softmax)."""
  x64 = x.astype(np.float64)
  keep = ~np.isfinite(x64) | (np.abs(x64) >= float(finfo(x.dtype).max) / 2)
  with np.errstate(over="ignore"):
    out = (x64 * math.ldexp(1.0, k)).astype(x.dtype)
  return np.where(keep, x, out)


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
  if not is_float(x):
    return []
  fi = finfo(x.dtype)
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


# ------------------------------------------------------------ the axes


class _Named:
  """Axes of a call, named and ordered by the order they are cut to fit
  (``order``: lower first; the varied axis is never cut)."""

  def __init__(self, call: Call):
    self.call = call
    self.groups: list[tuple[str, str, list, int, Any, int]] = []
    #: Axes whose setting is not a plain cut or growth (by name).
    self.custom: dict[str, L.Axis] = {}

  def add(self, name, family, where, order, longest=L.LONGEST, valid=None):
    self.groups.append((name, family, list(where), order, valid, longest))

  def axes(self) -> list[L.Axis]:
    out = []
    for name, family, where, _, valid, longest in self.groups:
      if name in self.custom:
        out.append(self.custom[name])
        continue
      others = [w for n, _, w, _, _, _ in sorted(self.groups,
                                                key=lambda g: g[3])
                if n != name]
      out.append(L.coupled(name, family, self.call, where, others, longest,
                           valid, bend=family in ("batch", "rows")))
    return out


def _row_names(axes: Sequence[int]) -> list[tuple[str, str]]:
  """``batch`` for the first row axis, ``rows<a>`` for the others."""
  return [("batch", "batch") if k == 0 else (f"rows{a}", "rows")
          for k, a in enumerate(axes)]


def _dot_axes(call: Call) -> _Named:
  lhs, rhs = call.args[:2]
  (lc, rc), (lb, rb) = call.kwargs["dimension_numbers"]
  free_l = [a for a in range(lhs.ndim) if a not in lc and a not in lb]
  free_r = [a for a in range(rhs.ndim) if a not in rc and a not in rb]
  g = _Named(call)
  for k, (a, b) in enumerate(zip(lb, rb)):
    g.add("batch" if k == 0 else f"batch{a}", "batch", [(0, a), (1, b)], 0)
  for k, a in enumerate(free_l):
    if not lb and k == 0 and len(free_l) > 1:
      g.add("batch", "batch", [(0, a)], 0)
    else:
      g.add("m" if a == free_l[-1] else f"m{a}", "rows", [(0, a)], 1)
  for k, (a, b) in enumerate(zip(lc, rc)):
    last = k == len(lc) - 1
    g.add("len" if last else f"k{a}", "length", [(0, a), (1, b)],
          4 if last else 3)
  for b in free_r:
    g.add("n" if b == free_r[-1] else f"n{b}", "features", [(1, b)], 2)
  return g


def _conv_axes(call: Call) -> _Named:
  dn = call.kwargs["dimension_numbers"]
  lhs_spec, rhs_spec = dn.lhs_spec, dn.rhs_spec
  groups = int(call.kwargs.get("feature_group_count", 1) or 1)
  g = _Named(call)
  g.add("batch", "batch", [(0, lhs_spec[0])], 0)
  g.add("len", "length", [(0, lhs_spec[1]), (1, rhs_spec[1])], 3,
        valid=lambda n: groups == 1)
  g.add("channels", "features", [(1, rhs_spec[0])], 1,
        valid=lambda n: n % groups == 0)
  for i, (a, b) in enumerate(zip(lhs_spec[2:], rhs_spec[2:])):
    g.add(f"spatial{i}", "spatial", [(0, a)], 2, longest=1 << 12)
    g.add(f"window{i}", "spatial", [(1, b)], 2, longest=16)
  return g


def _reduce_axes(call: Call) -> _Named:
  x = call.args[0]
  axes = tuple(call.kwargs.get("axes", ()))
  keep = [a for a in range(x.ndim) if a not in axes]
  g = _Named(call)
  for (name, family), a in zip(_row_names(keep), keep):
    g.add(name, family, [(0, a)], 0)
  for a in axes:
    g.add("len" if a == axes[-1] else f"k{a}", "length", [(0, a)],
          2 if a == axes[-1] else 1)
  return g


def _rowwise_axes(call: Call, same: Sequence[int],
                  last_too: Sequence[int] = ()) -> _Named:
  """Axes of a row-wise call: input 0's leading axes, coupled with the
  inputs ``same`` of its shape; its last axis, coupled with theirs and
  with the last axis of the inputs ``last_too``."""
  x = call.args[0]
  g = _Named(call)
  lead = list(range(x.ndim - 1))
  for (name, family), a in zip(_row_names(lead), lead):
    g.add(name, family, [(0, a)] + [(i, a) for i in same], 0)
  last = [(0, x.ndim - 1)] + [(i, x.ndim - 1) for i in same] + [
      (i, call.args[i].ndim - 1) for i in last_too]
  g.add("len", "length", last, 1)
  return g


def _row_groups(g: _Named) -> list:
  return [w for _, f, w, _, _, _ in g.groups if f in ("batch", "rows")]


def _plans_of(base: Call, g: _Named, seed: int, rows: Sequence | None,
              one_row: bool = False) -> list[Plan]:
  """Lattice plans of every axis, ``rows=1`` over ``rows`` and the one
  row of :data:`ONE_ROW` (over every row axis)."""
  axes = g.axes()
  plans = L.axis_plans(base, axes, lambda name: _draws(seed, name, axes))
  plans += L.joint_plans(base, axes, seed)
  if rows and any(base.args[w[0][0]].shape[w[0][1]] != 1 for w in rows):
    plans.append(Plan("rows=1", "rows", lambda rng: _all_one(base, rows,
                                                              rng)))
  length = [a for a in axes if a.name == "len"]
  if one_row and length:
    every = _row_groups(g)

    def wide(rng):
      return length[0].set(_all_one(base, every, rng), ONE_ROW, rng)
    plans.append(Plan(f"len={ONE_ROW}", "length", wide))
  return plans


def _draws(seed: int, name: str, axes: Sequence[L.Axis]):
  size = next(a.size for a in axes if a.name == name)
  return rng_of(seed, f"{name}:{size}", "lattice")


def _all_one(call: Call, rows: Sequence, rng) -> Call:
  for where in rows:
    call = set_axis(call, where, 1, rng)
  return call


def _same_shape(call: Call) -> list[int]:
  x = call.args[0]
  return [i for i, y in enumerate(call.args) if i and isinstance(
      y, np.ndarray) and y.shape == x.shape]


def primitive_axes(kernel: str, call: Call) -> _Named:
  """The named axes of a primitive site's call."""
  if kernel == "dot_general":
    return _dot_axes(call)
  if kernel == "conv_general_dilated":
    return _conv_axes(call)
  if kernel.startswith("reduce_") or kernel in ("argmax", "argmin"):
    return _reduce_axes(call)
  return _rowwise_axes(call, _same_shape(call))


def primitive_plans(kernel: str, base: Call, golden, seed: int = 0
                    ) -> list[Plan]:
  """The plans of a primitive site (``dot_general``, convolutions,
  reductions, elementwise primitives)."""
  x = base.args[0]
  if np.ndim(x) == 0:
    return magnitude_plans(base, golden, linear=False)
  g = primitive_axes(kernel, base)
  linear = kernel in ("dot_general", "conv_general_dilated")
  if kernel == "dot_general":
    rows = [w for _, _, w, _, _, _ in g.groups  # the lhs's free axes
            if len(w) == 1 and w[0][0] == 0] or None
    plans = _plans_of(base, g, seed, rows)
  elif kernel == "conv_general_dilated":
    plans = _plans_of(base, g, seed, None)
  else:
    reduce = kernel.startswith("reduce_") or kernel in ("argmax", "argmin")
    plans = _plans_of(base, g, seed, _row_groups(g), one_row=not reduce)
  return plans + magnitude_plans(base, golden, linear=linear)


# ------------------------------------------------------------- composites


def _params(call: Call) -> list[int]:
  return [i for i in range(1, len(call.args)) if isinstance(
      call.args[i], np.ndarray) and call.args[i].ndim >= 1]


def composite_axes(kind: str, call: Call) -> _Named:
  """The named axes of a composite site's call (not ``attention``).

  Raises:
    PeatError: a kind without variants.
  """
  if kind in ("softmax", "log_softmax", "gelu"):
    return _rowwise_axes(call, ())
  if kind == "silu":
    return _rowwise_axes(call, _params(call))
  if kind in ("layer_norm", "rms_norm"):
    return _rowwise_axes(call, (), _params(call))
  if kind == "cross_entropy":
    return _cross_entropy_axes(call)
  if kind == "rope":
    return _rope_axes(call)
  raise PeatError(f"no fuzz variants for composite kind {kind!r}; expected "
                  f"one of {sorted(KINDS | {'attention'})}")


def composite_plans(kind: str, base: Call, golden, seed: int = 0
                    ) -> list[Plan]:
  """The plans of a composite site of a known kind.

  Raises:
    PeatError: a kind without variants (the message names those that have).
  """
  g = composite_axes(kind, base)
  rowwise = kind not in ("cross_entropy", "rope")
  plans = _plans_of(base, g, seed, _row_groups(g) if kind != "rope" else
                    None, one_row=rowwise)
  if kind in ("softmax", "log_softmax"):
    plans += _masks.plans(base)
  return plans + magnitude_plans(base, golden, linear=False)


def _cross_entropy_axes(call: Call) -> _Named:
  x = call.args[0]
  g = _Named(call)
  lead = list(range(x.ndim - 1))
  for (name, family), a in zip(_row_names(lead), lead):
    g.add(name, family, [(0, a), (1, a)], 0)
  g.groups.append(("len", "length", [(0, x.ndim - 1)], 1, None,
                   L.LONGEST))
  named = g.axes()
  classes = next(a for a in named if a.name == "len")
  others = [w for n, _, w, _, _, _ in g.groups if n != "len"]

  def set_classes(c: Call, n: int, rng) -> Call:
    c = L.fit(c, [(0, c.args[0].ndim - 1)], n, others, rng)
    logits, labels = c.args[0], np.asarray(c.args[1])
    v = logits.shape[-1]
    if n <= v:  # labels follow their class; a dropped one takes a kept one
      idx = cut_index(v, n, rng)
      new = np.searchsorted(idx, labels)
      kept = (new < n) & (idx[np.minimum(new, n - 1)] == labels)
      labels = np.where(kept, new, rng.integers(0, n, labels.shape))
      logits = np.take(logits, idx, axis=-1)
    else:
      logits = resize([logits], [logits.ndim - 1], n, rng)[0]
    args = (logits, labels.astype(c.args[1].dtype)) + tuple(c.args[2:])
    return Call(args, c.kwargs)
  g.custom = {"len": classes._replace(set=set_classes)}
  return g


def _positions(pos: np.ndarray, n: int, rng) -> np.ndarray:
  """Positions of ``n`` tokens: ``arange`` continued when they were one,
  else the real positions cut or grown."""
  if np.array_equal(pos, np.arange(pos.shape[0], dtype=pos.dtype)):
    return np.arange(n, dtype=pos.dtype)
  return resize([pos], [0], n, rng)[0]


def _rope_axes(call: Call) -> _Named:
  g = _Named(call)
  pos = np.ndim(call.args[1]) if len(call.args) > 1 else 0
  # Positions follow their tokens (and, [B, T], their batch) wherever
  # another axis cuts them to fit.
  g.add("batch", "batch", [(0, 0)] + ([(1, 0)] if pos == 2 else []), 0)
  g.add("heads", "heads", [(0, 2)], 1)
  g.add("head_dim", "head_dim", [(0, 3)], 3, longest=1 << 12,
        valid=lambda n: n % 2 == 0)
  g.groups.append(("len", "length", [(0, 1)] + (
      [(1, pos - 1)] if pos else []), 2, None, L.LONGEST))
  others = [[(0, 0)], [(0, 2)]]

  def set_len(c: Call, n: int, rng) -> Call:
    c = L.fit(c, [(0, 1)], n, others, rng)
    x, pos = c.args[0], c.args[1]
    y = resize([x], [1], n, rng)[0]
    return Call((y, _positions(pos, n, rng)) + tuple(c.args[2:]), c.kwargs)
  length = L.Axis("len", "length", call.args[0].shape[1], set_len,
                  where=((0, 1),))
  g.custom = {"len": length}
  return g


#: Composite kinds with variants here (``attention``'s are in
#: ``_attention``).
KINDS = frozenset({"softmax", "log_softmax", "gelu", "silu", "layer_norm",
                   "rms_norm", "cross_entropy", "rope"})
