"""Reduction slips: blocks dropped, counted twice or not rescaled, and
narrow accumulators.

A kernel reduces along one axis (:data:`peat_jax.core.REDUCTION_AXES`): a
GEMM's contraction, a convolution's input features, a normalization's
row, a softmax's sum of exponentials, attention's keys. A tiled kernel
reduces in blocks of a tile width (:data:`peat_jax.core.TILE_LATTICE`),
and its slips are a block's: the first or last (the partial one) left
out or counted twice (``indexing``), and, for an online softmax, the
running sum or output not rescaled when a block raises the running max
(``scale``: a per-row factor). A kernel that accumulates in a narrow
format rounds each term and partial sum (``accumulation:<fmt>``).

GEMMs and convolutions are linear in the operand carrying the reduction
axis: a block of terms left out or counted twice is that operand's block
times 0 or 2. The other kinds' families take the reduction as a hook.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.slips import _families as fam
from peat_jax.analyzer.slips import _numerics as num
from peat_jax.analyzer.slips._call import Call, reduction_axis
from peat_jax.analyzer.slips._call import reduction_length

#: Narrow accumulators tried.
ACC_FORMATS = ("bf16", "fp16", "tf32")
#: A sequential accumulation emulated on the host costs (reduction
#: length x outputs) float64 operations: beyond this it is not tried.
ACC_MAX_OPS = 2 ** 27

Run = Callable[[Sequence[np.ndarray]], np.ndarray]


def block_slips(call: Call) -> list[_core.Slip]:
  """The blocked-reduction slips of a call (one per distinct block)."""
  n = reduction_length(call)
  if n is None or n < 2:
    return []
  if call.kind in ("softmax", "log_softmax") and call.structured()[1].get(
      "axis", -1) not in (-1, np.ndim(call.arrays[0]) - 1):
    return []
  out, seen = [], set()
  for w in _core.TILE_LATTICE:
    if w >= n:
      continue
    for where in ("first", "last"):
      span = num.block_span(n, w, where)
      if span in seen:
        continue
      seen.add(span)
      out += [_core.Slip("blocked", op, where=where, width=w)
              for op in ("drop", "twice")]
    if call.kind in _core.ONLINE_SOFTMAX_KINDS:
      places = ("sum", "acc", "both") if call.kind == "attention" else (
          "sum",)
      out += [_core.Slip("blocked", "norescale", where=p, width=w)
              for p in places]
  return out


def block_output(call: Call, slip: _core.Slip, run: Run,
                 arrays: Sequence[np.ndarray] | None = None) -> np.ndarray:
  """The float64 output of a blocked-reduction slip on ``arrays`` (the
  call's own: None)."""
  arrays = list(call.arrays if arrays is None else arrays)
  n = reduction_length(call)
  lin = reduction_axis(call)
  if lin is not None:
    arg, axis = lin
    wts = num.block_weights(n, slip.width, slip.where, slip.op)
    shape = [1] * np.ndim(arrays[arg])
    shape[axis] = -1
    arrays[arg] = arrays[arg] * wts.reshape(shape)
    return run(arrays)
  args, kwargs = call.structured(arrays)
  if slip.op == "norescale":
    hooks = fam.Hooks(online=num.Online(slip.width, slip.where))
  else:
    wts = num.block_weights(n, slip.width, slip.where, slip.op)
    hooks = (fam.Hooks(weights=wts) if call.kind == "attention" else
             fam.Hooks(reduce=num.weighted_sum(wts)))
  return fam.evaluate(call.kind, args, kwargs, hooks)


def block_sentence(call: Call, slip: _core.Slip) -> str:
  """A blocked-reduction slip in the kernel engineer's words."""
  n = reduction_length(call)
  axis = _core.REDUCTION_AXES.get(call.kind, "the reduction axis")
  if slip.op == "norescale":
    what = {"sum": "its running sum", "acc": "its running output",
            "both": "its running sum and output"}[slip.where]
    return (f"an online softmax over blocks of {slip.width} along {axis} "
            f"that does not rescale {what} by exp(m_old - m_new) when a "
            "block raises the running max")
  lo, hi = num.block_span(n, slip.width, slip.where)
  done = "left out" if slip.op == "drop" else "counted twice"
  part = (" (the partial block)" if slip.where == "last" and n % slip.width
          else "")
  return (f"the {slip.where} block of {slip.width} along {axis} (terms "
          f"{lo}-{hi - 1} of {n}){part} {done}")


def accumulate_slips(call: Call) -> list[_core.Slip]:
  """The narrow-accumulator slips of a call (kinds whose reduction the
  host emulates in order, within :data:`ACC_MAX_OPS`)."""
  n = reduction_length(call)
  if n is None:
    return []
  out_size = _output_size(call)
  if call.kind == "attention":
    out_size *= int(np.shape(call.arrays[1])[1])  # p v, key by key
  if call.kind not in ("dot_general", "conv_general_dilated", "softmax",
                       "log_softmax", "cross_entropy", "layer_norm",
                       "rms_norm", "attention") or (
                           n * out_size > ACC_MAX_OPS):
    return []
  return [_core.Slip("precision", "accumulate", fmt=f) for f in ACC_FORMATS]


def _output_size(call: Call) -> int:
  if call.kind == "dot_general":
    (lc, rc), (lb, _) = call.kwargs["dimension_numbers"]
    a, b = np.shape(call.arrays[0]), np.shape(call.arrays[1])
    free_a = [n for i, n in enumerate(a) if i not in lc and i not in lb]
    free_b = [n for i, n in enumerate(b) if i not in rc and i not in
              call.kwargs["dimension_numbers"][1][1]]
    return int(np.prod([a[i] for i in lb] + free_a + free_b))
  return int(np.size(call.arrays[0]))


def _dot_sequential(call: Call, arrays, fmt: str) -> np.ndarray:
  """dot_general with its contraction summed in order in ``fmt``."""
  (lc, rc), (lb, rb) = call.kwargs["dimension_numbers"]
  a, b = (np.asarray(x, np.float64) for x in arrays[:2])
  fa = [i for i in range(a.ndim) if i not in lc and i not in lb]
  fb = [i for i in range(b.ndim) if i not in rc and i not in rb]
  a2 = np.transpose(a, list(lb) + fa + list(lc))
  b2 = np.transpose(b, list(rb) + list(rc) + fb)
  nb = int(np.prod([a.shape[i] for i in lb]))
  m, n = int(np.prod([a.shape[i] for i in fa])), int(np.prod(
      [b.shape[i] for i in fb]))
  k = int(np.prod([a.shape[i] for i in lc]))
  a3, b3 = a2.reshape(nb, m, k), b2.reshape(nb, k, n)
  acc = np.zeros((nb, m, n))
  for i in range(k):
    term = num.round_nearest(a3[:, :, i, None] * b3[:, None, i, :], fmt)
    acc = num.round_nearest(acc + term, fmt)
  shape = ([a.shape[i] for i in lb] + [a.shape[i] for i in fa]
           + [b.shape[i] for i in fb])
  return acc.reshape(shape)


def _conv_sequential(call: Call, run: Run, arrays, fmt: str) -> np.ndarray:
  """A convolution summed over its input features in order in ``fmt``:
  each feature's window sum (float64) a term."""
  arg, axis = reduction_axis(call)
  lspec = call.kwargs["dimension_numbers"].lhs_spec
  terms = []
  for c in range(np.shape(arrays[arg])[axis]):
    part = list(arrays)
    part[0] = np.take(arrays[0], [c], axis=int(lspec[1]))
    part[arg] = np.take(arrays[arg], [c], axis=axis)
    terms.append(run(part))
  return num.sequential_sum(fmt)(np.stack(terms, -1), -1)[..., 0]


def accumulate_output(call: Call, slip: _core.Slip,
                      arrays: Sequence[np.ndarray] | None = None,
                      run: Run | None = None) -> np.ndarray:
  """The float64 output of a narrow-accumulator slip on ``arrays`` (a
  convolution's terms by ``run``, its float64 reference)."""
  arrays = list(call.arrays if arrays is None else arrays)
  if call.kind == "dot_general":
    return _dot_sequential(call, arrays, slip.fmt)
  if call.kind == "conv_general_dilated":
    return _conv_sequential(call, run, arrays, slip.fmt)
  args, kwargs = call.structured(arrays)
  return fam.evaluate(call.kind, args, kwargs,
                      fam.Hooks(reduce=num.sequential_sum(slip.fmt)))


def accumulate_sentence(call: Call, slip: _core.Slip) -> str:
  axis = _core.REDUCTION_AXES.get(call.kind, "the reduction axis")
  return (f"the reduction along {axis} accumulated in order in {slip.fmt} "
          "(each term and each partial sum rounded to nearest)")
