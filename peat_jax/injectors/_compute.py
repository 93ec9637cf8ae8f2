"""Error models of the computation: ``accumulation:<fmt>``, ``reordering``,
``nondeterminism``.

These errors do not live in an output tensor but in how a reduction is
computed, so they are injected by re-computing every floating
``dot_general`` and ``conv_general_dilated`` of a golden function another
way:

* ``accumulation:<fmt>``: the reduction (contracting dimensions of a dot, input
  channels of a convolution) is split into chunks of ``chunk`` terms; each
  chunk's partial sum is rounded to ``<fmt>`` and added to an accumulator that
  is rounded to ``<fmt>`` after every addition, as in hardware with a narrow
  accumulator. The error grows with the reduction length.
* ``reordering``: the reduction is split into ``blocks`` contiguous blocks whose
  partial sums are added in another order (reverse, pairwise or forward) at
  working precision (float32; float64 for float64 data): rounding noise only.
* ``nondeterminism``: like ``reordering`` with the order of the blocks drawn
  from the key, so every call with a new key may give other bits, and the
  same key gives the same bits.

``emulate`` evaluates a golden function's jaxpr with those primitives
replaced; it is what ``injecting_kernel`` uses for the forward pass and, on the
golden VJP's jaxpr, for the backward pass. It runs on peat_jax's one jaxpr
interpreter (:mod:`peat_jax.sites._interpreter`), so calls inside lax control
flow (``scan``, ``while``, ``cond`` bodies) are replaced too.
"""

import math
from typing import Any, Callable, Mapping

import jax
from jax import lax
import jax.numpy as jnp

from peat_jax import sites as _sites
from peat_jax.injectors import _rounding as fm
from peat_jax.injectors import _params as pp
from peat_jax.injectors import _random as rnd
from peat_jax.core import PeatError

KERNEL_SPECS: dict[str, dict[str, pp.Param]] = {
    **{f"accumulation:{f}": {
        "chunk": pp.integer(1, default=16,
                            doc="terms summed exactly (in float32) before "
                            "each rounding to the narrow format"),
    } for f in sorted(fm.FORMATS)},
    "reordering": {
        "blocks": pp.integer(2, default=4,
                             doc="contiguous blocks the reduction is split "
                             "into"),
        "order": pp.choice(("reverse", "pairwise", "forward"),
                           default="reverse",
                           doc="order in which block sums are added"),
    },
    "nondeterminism": {
        "blocks": pp.integer(2, default=8,
                             doc="blocks whose summation order is drawn from "
                             "the key"),
    },
}

_SUBSTITUTED = ("dot_general", "conv_general_dilated")


# ---------------------------------------------------------------------------
# A reduction seen as a sum of partials.


class _Reduction:
  """``out = sum_i partial(i)`` over ``n`` chunks of ``chunk`` terms."""

  def __init__(self, n: int, partial: Callable[[Any], jax.Array],
               finish: Callable[[jax.Array], jax.Array]):
    self.n = n
    self.partial = partial
    self.finish = finish


def _dot_reduction(lhs, rhs, params, chunk: int, wd) -> _Reduction:
  (lc, rc), (lb, rb) = params["dimension_numbers"]
  lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
  rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
  bsz = math.prod(lhs.shape[d] for d in lb)
  m = math.prod(lhs.shape[d] for d in lf)
  n = math.prod(rhs.shape[d] for d in rf)
  k = math.prod(lhs.shape[d] for d in lc)
  out_shape = ([lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lf]
               + [rhs.shape[d] for d in rf])
  chunk = max(1, min(chunk, k))
  nc = -(-k // chunk)
  pad = nc * chunk - k

  def prep(a, order, rows):
    a = jnp.transpose(a.astype(wd), list(order)).reshape(bsz, rows, k)
    a = jnp.pad(a, ((0, 0), (0, 0), (0, pad)))
    return jnp.moveaxis(a.reshape(bsz, rows, nc, chunk), 2, 0)

  l4 = prep(lhs, list(lb) + lf + list(lc), m)
  r4 = prep(rhs, list(rb) + rf + list(rc), n)
  dn = (((2,), (2,)), ((0,), (0,)))

  def partial(i):
    return lax.dot_general(l4[i], r4[i], dn, precision=lax.Precision.HIGHEST,
                           preferred_element_type=wd)

  return _Reduction(nc, partial, lambda y: y.reshape(out_shape))


def _conv_reduction(lhs, rhs, params, chunk: int, wd) -> _Reduction:
  if params["feature_group_count"] != 1 or params["batch_group_count"] != 1:
    raise PeatError(
        "accumulation/reordering/nondeterminism: grouped convolutions are not "
        f"emulated (expected feature_group_count == batch_group_count == 1, "
        f"got {params['feature_group_count']} and "
        f"{params['batch_group_count']}).")
  dn = params["dimension_numbers"]
  lfd, rfd = dn.lhs_spec[1], dn.rhs_spec[1]
  c = lhs.shape[lfd]
  chunk = max(1, min(chunk, c))
  nc = -(-c // chunk)
  pad = nc * chunk - c

  def padc(a, axis):
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, pad)
    return jnp.pad(a.astype(wd), widths)

  lp, rp = padc(lhs, lfd), padc(rhs, rfd)
  kw = {k: params[k] for k in ("window_strides", "padding", "lhs_dilation",
                                "rhs_dilation", "dimension_numbers")}

  def partial(i):
    ls = lax.dynamic_slice_in_dim(lp, i * chunk, chunk, axis=lfd)
    rs = lax.dynamic_slice_in_dim(rp, i * chunk, chunk, axis=rfd)
    return lax.conv_general_dilated(ls, rs, precision=lax.Precision.HIGHEST,
                                    preferred_element_type=wd, **kw)

  return _Reduction(nc, partial, lambda y: y)


def _reduction(prim: str, lhs, rhs, params, chunk: int, wd) -> _Reduction:
  if prim == "dot_general":
    return _dot_reduction(lhs, rhs, params, chunk, wd)
  return _conv_reduction(lhs, rhs, params, chunk, wd)


def _reduction_length(prim: str, lhs, params) -> int:
  if prim == "dot_general":
    (lc, _), _ = params["dimension_numbers"]
    return math.prod(lhs.shape[d] for d in lc)
  return lhs.shape[params["dimension_numbers"].lhs_spec[1]]


# ---------------------------------------------------------------------------
# The three emulated kernels: (prim, lhs, rhs, params, out_dtype, key) -> out.


def _accumulate(fmt: fm.Format, chunk: int):
  def kernel(prim, lhs, rhs, params, out_dtype, key):
    del key
    wd = fm.working_dtype(out_dtype)
    red = _reduction(prim, lhs, rhs, params, chunk, wd)

    def body(acc, i):
      p = fm.round_nearest(red.partial(i), fmt)
      return fm.round_nearest(acc + p, fmt), None

    shape = jax.eval_shape(red.partial, 0)
    acc0 = jnp.zeros(shape.shape, shape.dtype)
    acc, _ = lax.scan(body, acc0, jnp.arange(red.n))
    return red.finish(acc).astype(out_dtype)

  return kernel


def _sum_in_order(parts: list[jax.Array], order: str) -> jax.Array:
  if order == "reverse":
    parts = parts[::-1]
  if order == "pairwise":
    while len(parts) > 1:
      nxt = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
      if len(parts) % 2:
        nxt.append(parts[-1])
      parts = nxt
    return parts[0]
  acc = parts[0]
  for p in parts[1:]:
    acc = acc + p
  return acc


def _blocked(blocks: int, order: str | None):
  """Reordering (fixed ``order``) or nondeterminism (``order`` None)."""

  def kernel(prim, lhs, rhs, params, out_dtype, key):
    wd = fm.working_dtype(out_dtype)
    k = _reduction_length(prim, lhs, params)
    red = _reduction(prim, lhs, rhs, params, -(-k // blocks), wd)
    parts = jnp.stack([red.partial(i) for i in range(red.n)])
    if order is None:
      parts = parts[rnd.permutation(key, 0, red.n)]
      total = _sum_in_order([parts[i] for i in range(red.n)], "forward")
    else:
      total = _sum_in_order([parts[i] for i in range(red.n)], order)
    return red.finish(total).astype(out_dtype)

  return kernel


def kernel_for(name: str, params: Mapping[str, Any]) -> Callable:
  """The emulated dot/conv kernel of computation model ``name``."""
  if name.startswith("accumulation:"):
    return _accumulate(fm.FORMATS[name.split(":", 1)[1]], params["chunk"])
  if name == "reordering":
    return _blocked(params["blocks"], params["order"])
  return _blocked(params["blocks"], None)


# ---------------------------------------------------------------------------
# The golden function with its dot_general/conv calls replaced.


def emulate(fn: Callable, kernel: Callable, key: jax.Array) -> Callable:
  """Returns ``fn`` with its floating dot_general/conv calls re-computed.

  Runs on peat_jax's one jaxpr interpreter (:func:`peat_jax.sites.interpret`),
  so calls inside nested ``jit``, custom-derivative calls, ``remat``,
  ``scan``, ``cond`` and ``while`` bodies are re-computed too.

  Args:
    fn: a function of arrays (any pytree in and out).
    kernel: ``kernel(prim, lhs, rhs, params, out_dtype, key) -> out``.
    key: PRNG key; the i-th replaced call in program order gets
      ``derive(key, i)``, folded with the iteration index of each enclosing
      ``scan`` (``derive(derive(key, i), iteration)``), so every iteration
      draws its own order (``nondeterminism``).

  Returns:
    A function with ``fn``'s signature.
  """

  def wrapped(*args):
    ordinals: dict[tuple, int] = {}

    def at(eqn, invals, addr, loop_indices):
      prim = eqn.primitive.name
      out_dtype = eqn.outvars[0].aval.dtype if eqn.outvars else None
      if not (prim in _SUBSTITUTED and jnp.issubdtype(out_dtype, jnp.floating)
              and jnp.issubdtype(invals[0].dtype, jnp.floating)):
        return None
      # One ordinal per call site, stable when a cond branch is traced twice.
      k = rnd.derive(key, ordinals.setdefault(addr, len(ordinals)))
      for idx in loop_indices:
        k = rnd.derive(k, idx)
      return [kernel(prim, invals[0], invals[1], eqn.params, out_dtype, k)]

    return _sites.interpret(fn, at)(*args)

  return wrapped
