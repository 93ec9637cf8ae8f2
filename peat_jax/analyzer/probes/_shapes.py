"""Hypotheses of shape-gated bugs, fitted on one call's own inputs.

A kernel exact on training's shapes and wrong on others usually slips in
one of a few ways at the shape that gates it: a tail drops an element of
the reduction (the last term of a GEMV's contraction, the first of a
split), an epilogue writes a lane twice (the last output column or row
repeats the one before), a GEMV reads an operand's buffer in the other
layout, a long reduction keeps its sum in a narrow
format (fp16 past 2^11 terms of ones stops growing), a wide row's
statistic skips a block (a layer norm's mean over part of its row), a
row-wise sum drops or doubles a tile's tail (a softmax's normalizer). On a
fuzz variant the inputs are at hand: :func:`shape_probe` computes each
such hypothesis in float64 on them and measures how close the KUT's
output is to it, as the port probe does (``_ports``: the median of
``|t - h| / |t - r|`` over the elements that differ from the reference,
at most ``EXPLAINS``, and the KUT beyond ``BEYOND_GOLDEN`` x the golden
kernel's distance to float64). The error signature alone cannot tell a
dropped term (one product missing: an error of one term's size, random
in sign) from a coarse rounding of the inputs; the inputs can.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import ml_dtypes
import numpy as np

from peat_jax.analyzer.probes._forms import Variant, _f64
from peat_jax.analyzer.probes._ports import BEYOND_GOLDEN, best_answer

#: The most multiply-adds an in-order accumulation hypothesis evaluates
#: (it loops over K on the host).
MAX_ACC_WORK = 1 << 26
#: The narrow accumulators tried, with their numpy dtypes.
ACCUMULATORS = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def dot_general64(lhs, rhs, dimension_numbers) -> np.ndarray:
  """``lax.dot_general`` in float64 on the host (batch, lhs free, rhs free
  axes, in that order)."""
  (lc, rc), (lb, rb) = dimension_numbers
  lhs, rhs = _f64(lhs), _f64(rhs)
  lf = [a for a in range(lhs.ndim) if a not in lc and a not in lb]
  rf = [a for a in range(rhs.ndim) if a not in rc and a not in rb]
  shape = ([lhs.shape[a] for a in lb] + [lhs.shape[a] for a in lf]
           + [rhs.shape[a] for a in rf])
  b = int(np.prod([lhs.shape[a] for a in lb], dtype=np.int64))
  m = int(np.prod([lhs.shape[a] for a in lf], dtype=np.int64))
  k = int(np.prod([lhs.shape[a] for a in lc], dtype=np.int64))
  n = int(np.prod([rhs.shape[a] for a in rf], dtype=np.int64))
  left = np.transpose(lhs, list(lb) + lf + list(lc)).reshape(b, m, k)
  right = np.transpose(rhs, list(rb) + list(rc) + rf).reshape(b, k, n)
  return np.matmul(left, right).reshape(shape)


def _without(x: np.ndarray, axis: int, index: int) -> np.ndarray:
  return np.delete(x, index, axis=axis)


def _dot_forms(args, kwargs) -> list[Variant]:
  lhs, rhs = args[:2]
  dn = kwargs["dimension_numbers"]
  (lc, rc), _ = dn
  if not lc:
    return []
  a, b = lc[-1], rc[-1]
  k = np.shape(lhs)[a]
  out = []
  if k > 1:
    for where, i in (("last", k - 1), ("first", 0)):
      out.append(Variant(
          "indexing", f"dropped_{where}_term",
          f"a dropped element: the {where} term of the contraction (K = "
          f"{k}) left out of the sum",
          lambda i=i: dot_general64(_without(lhs, a, i), _without(rhs, b, i),
                                    dn)))
  out += _layout_forms(lhs, rhs, dn)
  work = int(np.prod(np.shape(lhs), dtype=np.int64)) * int(
      np.prod(np.shape(rhs), dtype=np.int64)) // max(k, 1)
  if len(lc) == 1 and work <= MAX_ACC_WORK:
    for fmt, dtype in ACCUMULATORS.items():
      out.append(Variant(
          f"accumulation:{fmt}", f"acc_{fmt}_in_order",
          f"a narrow accumulator: the K = {k} products added in order into "
          f"a {fmt} sum",
          lambda dtype=dtype: _dot_in_order(lhs, rhs, dn, dtype)))
  return out


def _layout_forms(lhs, rhs, dn) -> list[Variant]:
  """An operand's row-major buffer read in the other layout: the
  ``[batch, K, N]`` right operand as ``[batch, N, K]`` (a GEMV handed the
  transpose flag of the other layout), or the ``[batch, M, K]`` left one
  as ``[batch, K, M]``."""
  (lc, rc), (lb, rb) = dn
  lhs, rhs = _f64(lhs), _f64(rhs)
  lf = [a for a in range(lhs.ndim) if a not in lc and a not in lb]
  rf = [a for a in range(rhs.ndim) if a not in rc and a not in rb]
  size = lambda x, axes: int(np.prod([x.shape[a] for a in axes],  # noqa: E731
                                     dtype=np.int64))
  b, m, k, n = size(lhs, lb), size(lhs, lf), size(lhs, lc), size(rhs, rf)
  if k < 2:
    return []
  shape = ([lhs.shape[a] for a in lb] + [lhs.shape[a] for a in lf]
           + [rhs.shape[a] for a in rf])
  left = np.transpose(lhs, list(lb) + lf + list(lc)).reshape(b, m, k)
  right = np.transpose(rhs, list(rb) + list(rc) + rf).reshape(b, k, n)
  out = []
  if n > 1:
    out.append(Variant(
        "indexing", "rhs_other_layout",
        f"an operand in the other layout: the [K, N] = [{k}, {n}] right "
        "operand read as [N, K]",
        lambda: np.matmul(left, np.swapaxes(right.reshape(b, n, k), 1, 2)
                          ).reshape(shape)))
  if m > 1:
    out.append(Variant(
        "indexing", "lhs_other_layout",
        f"an operand in the other layout: the [M, K] = [{m}, {k}] left "
        "operand read as [K, M]",
        lambda: np.matmul(np.swapaxes(left.reshape(b, k, m), 1, 2), right
                          ).reshape(shape)))
  return out


def _dot_in_order(lhs, rhs, dn, dtype) -> np.ndarray:
  (lc, rc), _ = dn
  a, b = lc[-1], rc[-1]
  k = np.shape(lhs)[a]
  acc = None
  for i in range(k):
    term = dot_general64(np.take(lhs, [i], axis=a), np.take(rhs, [i], axis=b),
                         dn)
    acc = term.astype(dtype) if acc is None else (
        acc.astype(np.float64) + term).astype(dtype)
  return acc.astype(np.float64)


def _sum_forms(args, kwargs) -> list[Variant]:
  x = _f64(args[0])
  axes = tuple(kwargs.get("axes", ()))
  if len(axes) != 1 or x.shape[axes[0]] < 2:
    return []
  ax = axes[0]
  k = x.shape[ax]
  out = [Variant("indexing", f"dropped_{where}_term",
                 f"a dropped element: the {where} of the K = {k} terms left "
                 "out of the sum",
                 lambda i=i: _without(x, ax, i).sum(ax))
         for where, i in (("last", k - 1), ("first", 0))]
  if x.size <= MAX_ACC_WORK:
    for fmt, dtype in ACCUMULATORS.items():
      out.append(Variant(
          f"accumulation:{fmt}", f"acc_{fmt}_in_order",
          f"a narrow accumulator: the K = {k} terms added in order into a "
          f"{fmt} sum", lambda dtype=dtype: _sum_in_order(x, ax, dtype)))
  return out


def _sum_in_order(x: np.ndarray, axis: int, dtype) -> np.ndarray:
  y = np.moveaxis(x, axis, -1)
  acc = y[..., 0].astype(dtype)
  for i in range(1, y.shape[-1]):
    acc = (acc.astype(np.float64) + y[..., i]).astype(dtype)
  return acc.astype(np.float64)


def _layer_norm_forms(args, kwargs, test) -> list[Variant]:
  x = _f64(args[0])
  if x.shape[-1] < 4:
    return []
  scale = _f64(args[1]) if len(args) > 1 and args[1] is not None else 1.0
  bias = _f64(args[2]) if len(args) > 2 and args[2] is not None else 0.0
  eps = float(kwargs.get("eps", args[3] if len(args) > 3 else 1e-6))

  def row_mean():
    with np.errstate(all="ignore"):
      z = (_f64(test) - bias) / np.where(np.asarray(scale) == 0, 1.0, scale)
      zc = z - z.mean(-1, keepdims=True)
      slope = (zc * (x - x.mean(-1, keepdims=True))).sum(-1, keepdims=True
                                                         ) / np.square(
          zc).sum(-1, keepdims=True)
      m = x.mean(-1, keepdims=True) - slope * z.mean(-1, keepdims=True)
      m = np.where(np.isfinite(m), m, x.mean(-1, keepdims=True))
      v = np.square(x - m).mean(-1, keepdims=True)
      return (x - m) / np.sqrt(v + eps) * scale + bias
  return [Variant("indexing", "row_mean",
                  "a wrong mean: each row centred on a mean other than its "
                  "own (fitted per row; a mean over part of the row, a "
                  "skipped block)", row_mean)]


#: Tile widths whose tails a row-wise kernel's sum may mishandle.
SUM_TILES = (8, 16, 32, 64, 128, 256)


def _softmax_forms(args, kwargs) -> list[Variant]:
  """A softmax whose row sum leaves out, or counts twice, the last ``w``
  terms: a tile's tail (``L % p``) or a whole tile (``p``). The output is
  golden times a factor per row: ``scale``."""
  del kwargs
  x = _f64(args[0])
  n = x.shape[-1] if x.ndim else 0
  if n < 2:
    return []
  with np.errstate(all="ignore"):
    e = np.exp(x - np.max(x, -1, keepdims=True))
  widths = sorted({w for p in SUM_TILES for w in (n % p, p) if 0 < w < n})
  out = []
  for w in widths:
    out.append(Variant(
        "scale", f"sum_without_last_{w}",
        f"a dropped tail: each row's sum leaves out its last {w} of {n} "
        "terms (golden times a factor per row)",
        lambda w=w: e / e[..., :n - w].sum(-1, keepdims=True)))
    out.append(Variant(
        "scale", f"sum_with_last_{w}_twice",
        f"a repeated tail: each row's sum counts its last {w} of {n} terms "
        "twice (golden times a factor per row)",
        lambda w=w: e / (e.sum(-1, keepdims=True)
                         + e[..., n - w:].sum(-1, keepdims=True))))
  return out


def _output_forms(reference: np.ndarray) -> list[Variant]:
  """Structural slips of any kernel's epilogue, on its output."""
  r = _f64(reference)
  out = []
  if r.ndim >= 1 and r.shape[-1] >= 2:
    def col():
      h = r.copy()
      h[..., -1] = h[..., -2]
      return h
    out.append(Variant("indexing", "repeated_last_column",
                       "a repeated element: the last output column holds "
                       "the one before it", col))
  if r.ndim >= 2 and r.shape[-2] >= 2:
    def row():
      h = r.copy()
      h[..., -1, :] = h[..., -2, :]
      return h
    out.append(Variant("indexing", "repeated_last_row",
                       "a repeated element: the last output row holds the "
                       "one before it", row))
  return out


def shape_hypotheses(kind: str, args: Sequence[Any],
                     kwargs: Mapping[str, Any], test, reference
                     ) -> list[Variant]:
  """The shape-gated hypotheses of one call (module docstring)."""
  out = []
  if kind == "dot_general":
    out += _dot_forms(args, kwargs)
  elif kind == "reduce_sum":
    out += _sum_forms(args, kwargs)
  elif kind == "layer_norm":
    out += _layer_norm_forms(args, kwargs, test)
  elif kind == "softmax":
    out += _softmax_forms(args, kwargs)
  return out + _output_forms(reference)


def shape_probe(kind: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                test, golden, reference) -> dict | None:
  """Which shape-gated slip the KUT's output matches on these inputs.

  Args:
    kind: the site's kernel (``dot_general``, ``reduce_sum``,
      ``layer_norm``, ``softmax``; every kernel gets the output's repeated
      column and row).
    args, kwargs: the call (a primitive's inputs and parameters, or the
      KUT convention of a composite).
    test, golden: the KUT's and the golden kernel's outputs.
    reference: their float64 reference.

  Returns:
    None when the KUT is within ``BEYOND_GOLDEN`` x the golden kernel's
    distance to float64 or no hypothesis evaluates; else the port probe's
    answer dict (``model``, ``name``, ``explains``, ``evidence``,
    ``ratio``, ...) for the closest hypothesis.
  """
  t, g, r = _f64(test), _f64(golden), _f64(reference)
  if t.shape != r.shape or t.shape != g.shape:
    return None
  fin = np.isfinite(t) & np.isfinite(r) & np.isfinite(g)
  if not fin.any():
    return None
  rms = lambda a: float(np.sqrt(np.mean(np.square(a[fin]))))  # noqa: E731
  d_ref, d_gold = rms(t - r), rms(g - r)
  if not d_ref > BEYOND_GOLDEN * d_gold:
    return None
  hyps = shape_hypotheses(kind, args, kwargs, test, r)
  best = best_answer(hyps, test, t, r, g, fin, d_ref, d_gold, rms)
  return None if best is None else best[0]
