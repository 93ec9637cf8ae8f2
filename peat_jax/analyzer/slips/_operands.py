"""Operand slips: the call's arguments read in the wrong places.

Each slip transforms one array argument (or exchanges two) before the
golden computation runs (:data:`peat_jax.core.SLIP_OPS` ``operand``): an
axis read backwards, rolled by one, two axes of one length transposed,
two arguments of one shape exchanged, the first or last entry (or the
last partial tile) along an axis read as zero or from its neighbour, and
attention's mask one key off. The model is ``indexing``: golden values
in the wrong places.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator, Sequence

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.slips._call import Call, axis_phrase, reduction_axis
from peat_jax.analyzer.slips._numerics import last_block

Run = Callable[[Sequence[np.ndarray]], np.ndarray]


def _tile(length: int, width: int, where: str) -> tuple[int, int]:
  if where == "first":
    return 0, min(width, length)
  return last_block(length, width)


def transform(slip: _core.Slip, arrays: Sequence[np.ndarray]) -> list:
  """The call's array arguments with an operand slip applied (a new
  list; the arrays it changes are copies)."""
  out = list(arrays)
  a = out[slip.arg] if slip.arg >= 0 else None
  op = slip.op
  if op == "reverse":
    out[slip.arg] = np.flip(a, axis=tuple(slip.axes))
  elif op == "roll":
    out[slip.arg] = np.roll(a, slip.shift, axis=slip.axes[0])
  elif op == "transpose":
    out[slip.arg] = np.swapaxes(a, *slip.axes)
  elif op == "swap":
    out[slip.arg], out[slip.other] = out[slip.other], out[slip.arg]
  elif op in ("drop", "repeat"):
    axis = slip.axes[0]
    n = a.shape[axis]
    lo, hi = _tile(n, slip.width, slip.where)
    b = np.array(a, copy=True)
    idx = [slice(None)] * a.ndim
    idx[axis] = slice(lo, hi)
    if op == "drop":
      b[tuple(idx)] = 0
    else:  # the tile reads its neighbour's entries
      step = (hi - lo) if slip.where == "first" else -slip.width
      src = np.clip(np.arange(lo, hi) + step, 0, n - 1)
      b[tuple(idx)] = np.take(a, src, axis=axis)
    out[slip.arg] = b
  return out


def _ops_on_axis(length: int, floating: bool) -> Iterator[tuple]:
  """``(op, where, width, shift)`` of the one-axis slips of an axis."""
  if length < 2:
    return
  yield "reverse", "", 0, 0
  yield "roll", "", 0, 1
  yield "roll", "", 0, -1
  if not floating:
    return
  for op in ("drop", "repeat"):
    yield op, "first", 1, 0
    yield op, "last", 1, 0
  seen = {(0, 1), (length - 1, length)}
  for w in _core.TILE_LATTICE:
    if w >= length:
      continue
    for where in ("first", "last"):
      span = _tile(length, w, where)
      if span in seen:
        continue
      seen.add(span)
      for op in ("drop", "repeat"):
        yield op, where, w, 0


def operand_slips(call: Call) -> list[_core.Slip]:
  """Every operand slip of a call."""
  out = []
  for i, a in enumerate(call.arrays):
    floating = call.floating(i)
    shape = np.shape(a)
    for axis, n in enumerate(shape):
      for op, where, width, shift in _ops_on_axis(n, floating):
        out.append(_core.Slip("operand", op, arg=i, axes=(axis,),
                              where=where, width=width, shift=shift))
    big = [ax for ax, n in enumerate(shape) if n >= 2]
    for x, y in itertools.combinations(big, 2):
      out.append(_core.Slip("operand", "reverse", arg=i, axes=(x, y)))
      if shape[x] == shape[y]:
        out.append(_core.Slip("operand", "transpose", arg=i, axes=(x, y)))
  for i, j in itertools.combinations(range(len(call.arrays)), 2):
    if (call.floating(i) and call.floating(j)
        and np.shape(call.arrays[i]) == np.shape(call.arrays[j])):
      out.append(_core.Slip("operand", "swap", arg=i, other=j))
  if call.kind == "attention" and (
      len(call.arrays) > 3 or call.kwargs.get("is_causal")):
    out += [_core.Slip("operand", "mask_shift", shift=s) for s in (1, -1)]
  return out


def _entry(call: Call, slip: _core.Slip) -> str:
  """"the last column" / "the last partial tile (7 entries, tile 16)"."""
  n = np.shape(call.arrays[slip.arg])[slip.axes[0]]
  role = call.roles[slip.arg][slip.axes[0]]
  lo, hi = _tile(n, slip.width, slip.where)
  if slip.width == 1:
    return f"the {slip.where} entry ({role} {lo})"
  part = "partial " if hi - lo < slip.width else ""
  return (f"the {slip.where} {part}tile of {slip.width} ({role}s {lo}-"
          f"{hi - 1}, {hi - lo} of {n})")


def sentence(call: Call, slip: _core.Slip) -> str:
  """An operand slip in the kernel engineer's words."""
  op = slip.op
  if op == "swap":
    return (f"{call.names[slip.arg]} and {call.names[slip.other]} "
            "exchanged (each read where the other belongs)")
  if op == "mask_shift":
    return ("the mask one key off: query i attends as query i + 1 may "
            "(one future key let through)" if slip.shift > 0 else
            "the mask one key off: query i attends as query i - 1 may "
            "(its own key masked)")
  where = axis_phrase(call, slip.arg, slip.axes)
  if op == "reverse":
    what = ("flipped" if len(slip.axes) == 2 else "read backwards")
    return f"{where} {what}"
  if op == "transpose":
    return f"{where} exchanged (the argument read transposed)"
  if op == "roll":
    return (f"{where} rolled by {slip.shift:+d} (each entry read from its "
            "neighbour, wrapping at the edge)")
  entry = _entry(call, slip)
  lin = reduction_axis(call)
  term = (" (the reduction's terms there dropped)" if op == "drop" and lin
          is not None and tuple(lin) == (slip.arg, slip.axes[0]) else "")
  if op == "drop":
    return f"{entry} along {where} read as zero{term}"
  return f"{entry} along {where} read from its neighbour (an index one off)"
