"""A large call searched on a slice of itself.

The search evaluates a few hundred slips; on a large record (attention
over long sequences, a wide GEMM) each evaluation costs as much as the
kernel in float64. Most slips act on every row alike, so the search
reads a slice of the call along its *separable* axes (rows of a
normalization, a GEMM's rows and columns, attention's batch and heads,
a convolution's batch) and the best candidates are confirmed on the
whole call. The slice keeps the first and the last entries of each axis
(a slip at an edge, the first or last row, stays in it; a reversed axis
maps the kept entries onto each other).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from peat_jax.analyzer.slips._call import Call, make_call

#: The search reads at most about this many output elements (and
#: attention at most this many scores per output element kept).
SEARCH_ELEMENTS = 2 ** 15


class Group(NamedTuple):
  """Array arguments' axes that map one to one onto an output axis."""

  arrays: tuple[tuple[int, int], ...]  # (array argument, axis)
  out_axis: int


class SubCall(NamedTuple):
  """A slice of a call.

  Attributes:
    args, kwargs: the sliced call.
    arrays: its array arguments (the flat order of the call's).
    index: the output's index of the slice (``t[index]``).
  """

  args: tuple
  kwargs: Mapping[str, Any]
  arrays: tuple
  index: tuple


def _groups(call: Call, out_ndim: int) -> list[Group]:
  """The separable axes of a call, most elements first."""
  kind, kw = call.kind, call.kwargs
  nd = [np.ndim(a) for a in call.arrays]
  if kind == "dot_general" and kw.get("dimension_numbers") is not None:
    (lc, rc), (lb, rb) = kw["dimension_numbers"]
    fa = [i for i in range(nd[0]) if i not in lc and i not in lb]
    fb = [i for i in range(nd[1]) if i not in rc and i not in rb]
    out = []
    if fa:
      out.append(Group(((0, fa[0]),), len(lb)))
    if fb:
      out.append(Group(((1, fb[0]),), len(lb) + len(fa)))
    return out
  if kind == "conv_general_dilated":
    dn = kw.get("dimension_numbers")
    if dn is None or not hasattr(dn, "lhs_spec"):
      return []
    return [Group(((0, int(dn.lhs_spec[0])),), int(dn.out_spec[0]))]
  if kind == "attention":
    if kw.get("bias") is not None or len(call.arrays) > 4:
      return []
    same_heads = np.shape(call.arrays[0])[2] == np.shape(call.arrays[1])[2]
    batch = [(i, 0) for i in range(min(3, len(call.arrays)))]
    if len(call.arrays) > 3 and np.shape(call.arrays[3])[0] > 1:
      batch.append((3, 0))
    out = [Group(tuple(batch), 0)]
    if same_heads and (len(call.arrays) < 4 or np.shape(
        call.arrays[3])[1] == 1):
      out.append(Group(((0, 2), (1, 2), (2, 2)), 2))
    return out
  if kind == "rope":
    return [Group(((0, 0),), 0), Group(((0, 2),), 2)]
  if kind == "cross_entropy":
    if out_ndim == 0:
      return []
    return [Group(((0, 0), (1, 0)), 0)] if nd[0] >= 2 else []
  if kind in ("layer_norm", "rms_norm", "softmax", "log_softmax", "gelu",
              "silu"):
    x = np.shape(call.arrays[0])
    if kind in ("softmax", "log_softmax") and kw.get("axis", -1) not in (
        -1, len(x) - 1):
      return []
    last = len(x) - (0 if kind in ("gelu", "silu") else 1)
    out = []
    for ax in range(max(last, 0)):
      members = tuple((i, ax) for i, a in enumerate(call.arrays)
                      if np.shape(a) == x)
      out.append(Group(members, ax))
    return out
  return []


def _keep(n: int, k: int) -> np.ndarray:
  """``k`` entries of ``n``: the first and the last halves."""
  if k >= n:
    return np.arange(n)
  lo = (k + 1) // 2
  return np.concatenate([np.arange(lo), np.arange(n - (k - lo), n)])


def sub_call(kind: str, args: Sequence[Any], kwargs: Mapping[str, Any],
             out_shape: tuple[int, ...], budget: int = SEARCH_ELEMENTS
             ) -> SubCall | None:
  """A slice of the call with about ``budget`` output elements (None:
  small enough already, or no separable axis).

  Args:
    kind: the site kind.
    args, kwargs: the call.
    out_shape: the output's shape.
    budget: the output elements the slice keeps.

  Returns:
    The :class:`SubCall`, or None.
  """
  size = int(np.prod(out_shape)) if out_shape else 1
  call = make_call(kind, args, kwargs)
  if kind == "attention" and call.arrays:
    # Each output element reads every key: scores count too.
    size *= max(1, int(np.shape(call.arrays[1])[1]) // 8)
  if size <= budget:
    return None
  groups = _groups(call, len(out_shape))
  if not groups:
    return None
  arrays = [np.asarray(a) for a in call.arrays]
  index = [slice(None)] * len(out_shape)
  for grp in groups:
    n = out_shape[grp.out_axis]
    k = max(2, int(n * budget / size)) if size > budget else n
    if k >= n:
      continue
    keep = _keep(n, k)
    for i, ax in grp.arrays:
      arrays[i] = np.take(arrays[i], keep, axis=ax)
    index[grp.out_axis] = keep
    size = size // n * k
  idx = tuple(index)
  if all(isinstance(i, slice) for i in idx):
    return None
  sargs, skwargs = call.rebuild(arrays)
  return SubCall(tuple(sargs), skwargs, tuple(arrays), np.ix_(*[
      np.arange(out_shape[a]) if isinstance(i, slice) else i
      for a, i in enumerate(idx)]) if idx else ())
