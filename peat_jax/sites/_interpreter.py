"""The one jaxpr interpreter of peat_jax.

A traced function is evaluated equation by equation; a :class:`Visitor`
decides, at every equation and at every nesting level (nested ``jit``,
custom-derivative calls, ``remat``, ``scan``, ``cond``, ``while``), whether
to compute it another way (:meth:`Visitor.at`), to descend into its body
(:meth:`Visitor.enters`) or to bind it unchanged. Everything happens at
trace time: the compiled program holds the replacement.

Two visitors use it: site substitution and taps
(:mod:`peat_jax.sites._substitution`: a KUT at selected sites) and the
computation injectors (:func:`interpret`: every floating ``dot_general``
and convolution re-computed, ``peat_jax.injectors``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import source_info_util
from jax.extend import core as jex_core

from peat_jax.core import PeatError
from peat_jax.sites._discovery import SUPPORTED_CONSTRUCTS, construct_label


class Visitor:
  """What the interpreter does at equations (the default: nothing).

  Attributes:
    loop_indices: the iteration indices of the enclosing ``scan`` loops,
      outermost first (traced int32), while a body is evaluated.
    inline: evaluate the bodies of the ``jit`` and ``remat`` constructs it
      enters in place (no nested ``jit`` or ``checkpoint`` is rebuilt), so
      that a trace of the evaluation is one flat jaxpr but for ``scan``,
      ``cond`` and ``while`` (class attribute; default False).
  """

  inline = False

  def __init__(self):
    self.loop_indices: list = []

  def at(self, eqn, invals: list, addr: tuple) -> tuple[list, dict] | None:
    """``(outputs, taps)`` computed another way, or None to go on.

    Args:
      eqn: the equation.
      invals: its input values.
      addr: its address (equation index, sub-jaxpr index, ... from the
        outermost jaxpr; the addresses of :class:`peat_jax.Site`).
    """
    del eqn, invals, addr
    return None

  def enters(self, eqn, addr: tuple) -> bool:
    """Whether to re-evaluate the body of a construct (else bind it)."""
    del eqn, addr
    return False

  def scope(self, prefix: tuple, env: dict) -> None:
    """Called when a jaxpr's evaluation starts (default: nothing).

    Args:
      prefix: the jaxpr's address prefix (``()`` for the outermost).
      env: its variable -> value mapping, filled as equations run.
    """
    del prefix, env


def bind(eqn, invals) -> list:
  """Binds an equation's primitive unchanged; returns its outputs as a list."""
  params = eqn.primitive.get_bind_params(eqn.params)
  out = eqn.primitive.bind(*invals, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def evaluate(jaxpr, consts, args, prefix: tuple, v: Visitor):
  """Evaluates an open jaxpr under a visitor; returns ``(outputs, taps)``."""
  env: dict = {}

  def read(x):
    return x.val if isinstance(x, jex_core.Literal) else env[x]

  for var, x in zip(jaxpr.constvars, consts):
    env[var] = x
  for var, x in zip(jaxpr.invars, args):
    env[var] = x
  v.scope(prefix, env)
  taps: dict = {}
  for i, eqn in enumerate(jaxpr.eqns):
    addr = prefix + (i,)
    invals = [read(x) for x in eqn.invars]
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), \
        eqn.ctx.manager:
      done = v.at(eqn, invals, addr)
      if done is not None:
        outs, t = done
      elif v.enters(eqn, addr):
        outs, t = evaluate_container(eqn, invals, addr, v)
      else:
        outs, t = bind(eqn, invals), {}
    taps.update(t)
    for var, x in zip(eqn.outvars, outs):
      if not isinstance(var, jex_core.DropVar):
        env[var] = x
  return [read(x) for x in jaxpr.outvars], taps


def evaluate_container(eqn, invals, addr: tuple, v: Visitor):
  """Re-evaluates a construct's body (or bodies) with the same visitor.

  Rebuilds ``jit`` (a nested ``jax.jit``), custom-derivative calls (their
  primal body), ``remat`` (``jax.checkpoint`` with the same policy),
  ``scan`` (iteration index pushed on ``v.loop_indices``), ``cond`` (every
  branch returns the union of taps, zeros where not taken) and ``while``.

  Returns:
    ``(outputs, taps)``.

  Raises:
    PeatError: any other construct (e.g. ``shard_map``).
  """
  name = eqn.primitive.name
  label = construct_label(eqn)
  p = eqn.params
  if label == "jit":
    inner = p["jaxpr"]
    if v.inline:
      return evaluate(inner.jaxpr, inner.consts, invals, addr + (0,), v)

    def f(*a):
      return evaluate(inner.jaxpr, inner.consts, a, addr + (0,), v)

    f.__name__ = p.get("name", "jit")
    f.__qualname__ = f.__name__
    outs, taps = jax.jit(f)(*invals)
    return list(outs), taps
  if label in ("custom_jvp", "custom_vjp"):
    inner = p["call_jaxpr"]
    return evaluate(inner.jaxpr, inner.consts, invals, addr + (0,), v)
  if label == "remat":
    inner = p["jaxpr"]
    if v.inline:
      return evaluate(inner, (), invals, addr + (0,), v)

    def g(*a):
      return evaluate(inner, (), a, addr + (0,), v)

    outs, taps = jax.checkpoint(g, prevent_cse=p["prevent_cse"], policy=p["policy"])(*invals)
    return list(outs), taps
  if label == "scan":
    body = p["jaxpr"]
    nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
    consts, init, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]

    def step(carry, x):
      xs_i, idx = x
      v.loop_indices.append(idx)
      try:
        outs, taps = evaluate(body.jaxpr, body.consts, [*consts, *carry, *xs_i], addr + (0,), v)
      finally:
        v.loop_indices.pop()
      return outs[:nk], (outs[nk:], taps)

    carry, (ys, taps) = lax.scan(
        step, list(init), (list(xs), jnp.arange(length, dtype=jnp.int32)),
        length=length, reverse=p["reverse"], unroll=p["unroll"],
    )
    return [*carry, *ys], taps
  if label == "cond":
    index, ops = invals[0], invals[1:]
    branches = p["branches"]

    def branch_fn(b):
      br = branches[b]
      return lambda *o: evaluate(br.jaxpr, br.consts, o, addr + (b,), v)

    shapes = [jax.eval_shape(branch_fn(b), *ops)[1] for b in range(len(branches))]
    union: dict = {}
    for s in shapes:
      union.update(s)

    def padded(b):
      fb = branch_fn(b)

      def run(*o):
        outs, taps = fb(*o)
        full = {k: taps[k] if k in taps else jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), v)
                for k, v in union.items()}
        return outs, full

      return run

    outs, taps = lax.switch(index, [padded(b) for b in range(len(branches))], *ops)
    return list(outs), taps
  if label == "while":
    cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]

    def cond_fn(c):
      return evaluate(cj.jaxpr, cj.consts, [*cconsts, *c], addr + (0,), v)[0][0]

    def body_fn(c):
      return evaluate(bj.jaxpr, bj.consts, [*bconsts, *c], addr + (1,), v)[0]

    return list(lax.while_loop(cond_fn, body_fn, list(init))), {}
  raise PeatError(
      f"cannot substitute inside a `{name}` equation at address {addr}; supported constructs: "
      f"{sorted(SUPPORTED_CONSTRUCTS)}."
  )


#: Primitives of constructs :func:`evaluate_container` can rebuild.
CONTAINER_PRIMITIVES = frozenset({
    "jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "scan",
    "cond", "while"})


class _EveryEquation(Visitor):
  """:func:`interpret`'s visitor: a handler at every equation, everywhere."""

  def __init__(self, handler):
    super().__init__()
    self.handler = handler

  def at(self, eqn, invals, addr):
    out = self.handler(eqn, invals, addr, tuple(self.loop_indices))
    return None if out is None else (list(out), {})

  def enters(self, eqn, addr):
    del addr
    return eqn.primitive.name in CONTAINER_PRIMITIVES


def interpret(fn: Callable, handler: Callable) -> Callable:
  """``fn`` with chosen equations computed by ``handler``, at every level.

  ``handler(eqn, invals, addr, loop_indices)`` is called at trace time for
  every equation, inside nested ``jit``, custom-derivative calls,
  ``remat``, ``scan``, ``cond`` and ``while`` bodies too; it returns the
  equation's outputs (a list) to replace it, or None to keep it.
  ``loop_indices`` are the traced iteration indices of the enclosing
  ``scan`` loops; ``addr`` is stable across traces (a ``cond`` branch is
  traced more than once).

  Args:
    fn: a function of arrays (any pytree in and out).
    handler: see above.

  Returns:
    A function with ``fn``'s signature.
  """

  def wrapped(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    flat = jax.tree_util.tree_leaves(args)
    outs, _ = evaluate(closed.jaxpr, closed.consts, flat, (),
                       _EveryEquation(handler))
    return jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(out_shape), outs)

  return wrapped
