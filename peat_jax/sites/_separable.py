"""Whether part of a traced function is separable over the batch.

``fn`` is traced flat twice (:mod:`peat_jax.sites._flat`): with its batched
arguments of batch size B and with one sample of them. Where the two flat
jaxprs have the same structure, every variable's *batch axis* is the one
axis whose size is B in the first and 1 in the second (None when its shape
does not change: weights, constants, batch statistics). A suffix of the
first jaxpr (what one site's output feeds) is *separable* when every
equation in it computes each sample from that sample alone: it keeps a
batch axis on every value that depends on the change, and no equation
reduces, contracts, sorts, shifts, gathers or scans along it. Then the
second jaxpr's suffix, on one sample's frontier values, gives that sample's
outputs of the first: a fault in one sample is recomputed for that sample
only. The rules are conservative (a primitive they do not know mixes
samples), checked on the traced equations, never assumed: batch statistics,
a softmax over the batch, attention across samples or a custom call make a
suffix inseparable.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.extend import core as jex_core
import numpy as np

from peat_jax.sites import _flat

#: A variable whose shape changed otherwise than one axis from B to 1.
MIXED = "mixed"

_ELEMENTWISE = frozenset("""
abs acos acosh add and asin asinh atan atan2 atanh bitcast_convert_type cbrt
ceil clamp clz complex conj convert_element_type copy copy_p cos cosh
digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt igamma igammac
imag integer_pow is_finite le lgamma log log1p logistic lt max min mul ne
neg nextafter not or population_count pow real reduce_precision rem round
rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign
sin sinh sqrt square stop_gradient sub tan tanh xor
""".split())

_REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
    "reduce_or", "reduce_xor", "argmax", "argmin"})

_CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin",
                         "cumlogsumexp"})

#: Parameters that may differ between the two traces (sizes of the batch).
_SHAPE_PARAMS = frozenset({"shape", "new_sizes", "limit_indices", "sizes"})


def batch_axes(corr: dict, size: int) -> dict:
  """Variable of the batch-B trace -> its batch axis, None or MIXED.

  Args:
    corr: variable of the batch-B trace -> the same variable of the
      one-sample trace (:func:`peat_jax.sites._flat.corresponding_vars`).
    size: B.
  """
  out = {}
  for a, b in corr.items():
    sa, sb = _flat.shape_of(a), _flat.shape_of(b)
    if sa == sb:
      out[a] = None
      continue
    diff = [k for k, (x, y) in enumerate(zip(sa, sb)) if x != y]
    if len(sa) == len(sb) and len(diff) == 1 and sa[diff[0]] == size and (
        sb[diff[0]] == 1):
      out[a] = diff[0]
    else:
      out[a] = MIXED
  return out


def _ax(axes, v):
  return None if isinstance(v, jex_core.Literal) else axes.get(v, MIXED)


def _params_agree(e, e1) -> bool:
  if set(e.params) != set(e1.params):
    return False
  for k, v in e.params.items():
    try:
      same = bool(v == e1.params[k])
    except Exception:  # pylint: disable=broad-except
      same = v is e1.params[k]
    if not same and k not in _SHAPE_PARAMS:
      return False
  return True


def _rule(e, axes) -> bool:
  """Whether equation ``e`` computes each sample from that sample alone."""
  name = e.primitive.name
  ins = [_ax(axes, v) for v in e.invars]
  outs = [_ax(axes, v) for v in e.outvars]
  if MIXED in ins or MIXED in outs:
    return False
  batched = [(i, k) for i, k in enumerate(ins) if k is not None]
  if not batched:
    return True  # reads no batched value: the same for every sample
  p = e.params
  k = batched[0][1]
  if name in _ELEMENTWISE or name == "peat_site_mark":
    return all(a == k for _, a in batched) and all(o == k for o in outs)
  if name == "broadcast_in_dim":
    return outs[0] == p["broadcast_dimensions"][k]
  if name == "transpose":
    return outs[0] == list(p["permutation"]).index(k)
  if name in ("reshape", "squeeze", "expand_dims"):
    o = outs[0]
    if o is None:
      return False
    si, so = _flat.shape_of(e.invars[0]), _flat.shape_of(e.outvars[0])
    return math.prod(si[:k]) == math.prod(so[:o]) and si[k] == so[o]
  if name in _REDUCTIONS:
    ax = tuple(p["axes"])
    return k not in ax and outs[0] == k - sum(a < k for a in ax)
  if name in _CUMULATIVE:
    return p["axis"] != k and outs[0] == k
  if name == "dot_general":
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    la, ra = ins[0], ins[1]
    if la is not None and la in lc or ra is not None and ra in rc:
      return False
    nb = len(lb)
    if la is not None and ra is not None:  # both batched: a dot batch dim
      if la not in lb or ra not in rb or lb.index(la) != rb.index(ra):
        return False
      return outs[0] == lb.index(la)
    if la is not None:
      if la in lb:
        return False  # the other operand's batch dim would need it
      free = [d for d in range(len(_flat.shape_of(e.invars[0])))
              if d not in lc and d not in lb]
      return outs[0] == nb + free.index(la)
    if ra in rb:
      return False
    nl = len(_flat.shape_of(e.invars[0])) - len(lc) - nb
    free = [d for d in range(len(_flat.shape_of(e.invars[1])))
            if d not in rc and d not in rb]
    return outs[0] == nb + nl + free.index(ra)
  if name == "conv_general_dilated":
    dn = p["dimension_numbers"]
    return (ins[1] is None and ins[0] == dn.lhs_spec[0]
            and p["batch_group_count"] == 1 and outs[0] == dn.out_spec[0])
  if name == "concatenate":
    return (all(a == k for _, a in batched) and len(batched) == len(ins)
            and p["dimension"] != k and outs[0] == k)
  if name == "pad":
    return (ins[1] is None and tuple(p["padding_config"][k]) == (0, 0, 0)
            and outs[0] == k)
  if name == "slice":
    si = _flat.shape_of(e.invars[0])
    st = p["strides"]
    return (p["start_indices"][k] == 0 and p["limit_indices"][k] == si[k]
            and (st is None or st[k] == 1) and outs[0] == k)
  if name == "rev":
    return k not in p["dimensions"] and outs[0] == k
  if name == "split":
    return p["axis"] != k and all(o == k for o in outs)
  if name in ("sort", "argsort"):
    return (all(a == k for _, a in batched) and len(batched) == len(ins)
            and p["dimension"] != k and all(o == k for o in outs))
  if name.startswith("reduce_window") and name != "reduce_window":
    return (p["window_dimensions"][k] == 1 and p["window_strides"][k] == 1
            and tuple(p["padding"][k]) == (0, 0) and outs[0] == k)
  return False


def separable(jb: jex_core.Jaxpr, j1: jex_core.Jaxpr, corr: dict,
              axes: dict, sfx: _flat.Suffix) -> str | None:
  """Why a suffix is not separable over the batch, or None when it is.

  Args:
    jb: the batch-B flat jaxpr.
    j1: the one-sample flat jaxpr (same structure).
    corr: ``jb``'s variables -> ``j1``'s.
    axes: :func:`batch_axes` of ``corr``.
    sfx: a suffix of ``jb`` (:func:`peat_jax.sites._flat.suffix`).

  Returns:
    None, or a short reason naming the first equation that mixes samples.
  """
  if _ax(axes, sfx.start) != 0:
    return "the site's output has no leading batch axis"
  for v in sfx.frontier:
    if _ax(axes, v) is MIXED:
      return f"a value it reads ({v.aval}) changes shape with the batch"
  for i in sfx.eqns:
    e, e1 = jb.eqns[i], j1.eqns[i]
    if not _params_agree(e, e1):
      return (f"equation {i} ({e.primitive.name}) has other parameters at "
              "one sample")
    if not _rule(e, axes):
      return f"equation {i} ({e.primitive.name}) mixes samples"
  for v, dep in zip(jb.outvars, sfx.outs):
    if dep and _ax(axes, v) in (None, MIXED):
      return f"an output ({v.aval}) that the site feeds has no batch axis"
  return None


def leading_batch(args_leaves: list, size: int) -> list[bool]:
  """Which argument leaves are batched: leading dimension ``size``."""
  return [bool(getattr(x, "ndim", 0)) and x.shape[0] == size
          for x in args_leaves]


def one_sample(args_leaves: list, batched: list[bool]) -> list[Any]:
  """The arguments of the one-sample trace (shapes and dtypes only)."""
  out = []
  for x, b in zip(args_leaves, batched):
    x = x if hasattr(x, "dtype") else np.asarray(x)
    shape = tuple(x.shape)
    out.append(jax.ShapeDtypeStruct((1,) + shape[1:] if b else shape,
                                    x.dtype))
  return out
