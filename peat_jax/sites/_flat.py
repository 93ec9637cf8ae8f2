"""Flat traces of a forward function, cut at its sites.

A forward function ``fn(*args)`` is traced as for discovery
(:func:`peat_jax.sites.trace`), then evaluated once more with the one jaxpr
interpreter in its inlining mode (``Visitor.inline``: the bodies of nested
``jit``, custom-derivative calls and ``remat`` are evaluated in place) while
``jax.make_jaxpr`` records it: the result is one flat jaxpr, but for
``scan``, ``cond`` and ``while`` equations, where every chosen site's output
passes through an identity equation, its *mark*.

A mark cuts the flat jaxpr in two (:func:`suffix`): what the site's output
feeds (the equations that depend on it, transitively) and everything else,
whose values a golden evaluation computes once. The values the dependent
equations read from the rest are the site's *frontier*. Evaluating the
dependent equations on the frontier and a changed site output gives the
function's outputs with that change, without recomputing anything upstream
(``peat.forward_campaign``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.interpreters import batching
from jax.interpreters import mlir

from peat_jax.core import PeatError
from peat_jax.sites import _discovery
from peat_jax.sites import _interpreter

# The mark: an identity equation after a site's output (``site``: its name).
mark_p = jex_core.Primitive("peat_site_mark")
mark_p.def_impl(lambda x, *, site: x)
mark_p.def_abstract_eval(lambda x, *, site: x)
mlir.register_lowering(
    mark_p, mlir.lower_fun(lambda x, *, site: x, multiple_results=False))
batching.primitive_batchers[mark_p] = (
    lambda args, dims, *, site: (mark_p.bind(args[0], site=site), dims[0]))

#: Constructs the inlining evaluation enters (their bodies are flattened).
_INLINED = frozenset({
    "jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


class FlatTrace(NamedTuple):
  """A flat jaxpr of ``fn(*args)`` with the chosen sites marked.

  Attributes:
    jaxpr: the closed flat jaxpr (inputs: the flattened ``args``).
    out_tree: the tree structure of ``fn``'s output.
    marks: site name -> index of its mark equation in ``jaxpr.jaxpr.eqns``.
    sites: the site table of ``fn`` (:func:`peat_jax.sites.walk`).
  """

  jaxpr: jex_core.ClosedJaxpr
  out_tree: Any
  marks: dict
  sites: _discovery.SiteTable

  def mark_var(self, name: str):
    """The variable holding site ``name``'s (marked) output."""
    return self.jaxpr.jaxpr.eqns[self.marks[name]].outvars[0]


class _Marking(_interpreter.Visitor):
  """Inlines every construct it can and marks the chosen sites' outputs."""

  inline = True

  def __init__(self, chosen: dict):
    super().__init__()
    self.chosen = chosen  # address -> site

  def at(self, eqn, invals, addr):
    site = self.chosen.get(addr)
    if site is None:
      return None
    if site.composite:
      outs, _ = _interpreter.evaluate_container(eqn, invals, addr, self)
    else:
      outs = _interpreter.bind(eqn, invals)
    if len(outs) != 1:
      raise PeatError(
          f"site {site.name!r} has {len(outs)} outputs; a fault goes into a "
          "site with one output. Choose another site (sites=...).")
    return [mark_p.bind(outs[0], site=site.name)], {}

  def enters(self, eqn, addr):
    del addr
    return eqn.primitive.name in _INLINED


def flat_trace(fn: Callable, args: Sequence[Any],
               names: Sequence[str]) -> FlatTrace:
  """Traces ``fn(*args)`` flat, with the sites ``names`` marked.

  Args:
    fn: the forward function.
    args: its arguments (pytrees of arrays).
    names: the sites to mark (:func:`peat_jax.discover_sites` names).

  Returns:
    A :class:`FlatTrace`.

  Raises:
    PeatError: an unknown site, a site inside ``scan``, ``cond`` or
      ``while`` (it has no place in a flat jaxpr), or one with several
      outputs.
  """
  closed, out_shape = _discovery.trace(fn, *args)
  table = _discovery.walk(closed)
  by_name = table.by_name()
  chosen = {}
  for n in names:
    if n not in by_name:
      raise PeatError(f"unknown site {n!r}; close matches: "
                      f"{_discovery.close_matches(n, table.names())}")
    s = by_name[n]
    bad = [w for w in s.where if w in ("scan", "cond", "while")]
    if bad:
      raise PeatError(
          f"site {n!r} lies inside a `{bad[0]}`; a forward campaign injects "
          "into sites outside scan, cond and while bodies. Choose another "
          "site.")
    chosen[s.address] = s
  leaves = jax.tree.leaves(args)
  vis = _Marking(chosen)
  flat = jax.make_jaxpr(lambda *a: _interpreter.evaluate(
      closed.jaxpr, closed.consts, a, (), vis)[0])(*leaves)
  marks = {}
  for i, eqn in enumerate(flat.jaxpr.eqns):
    if eqn.primitive is mark_p:
      marks[eqn.params["site"]] = i
  missing = [n for n in names if n not in marks]
  if missing:
    raise PeatError(f"sites {missing} were not reached when {fn!r} was "
                    "evaluated again; expected every discovered site once")
  return FlatTrace(flat, jax.tree.structure(out_shape), marks, table)


class Suffix(NamedTuple):
  """What one site's output feeds in a flat jaxpr.

  Attributes:
    start: the variable whose value is replaced (the mark's output, or an
      input of the site's equation).
    eqns: indices of the equations that depend on ``start``, in order.
    frontier: the variables those equations (and the outputs) read from
      the rest, in a fixed order.
    outs: per output of the jaxpr, whether it depends on ``start``.
  """

  start: Any
  eqns: tuple
  frontier: tuple
  outs: tuple


def is_var(v) -> bool:
  """Whether an equation operand is a variable (not a literal)."""
  return not isinstance(v, jex_core.Literal)


_is_var = is_var


def suffix(jaxpr: jex_core.Jaxpr, start, first: int,
           only: int | None = None) -> Suffix:
  """The equations from ``first`` on that depend on ``start``.

  Args:
    jaxpr: a flat open jaxpr.
    start: the variable whose value changes.
    first: the index of the first equation that may read it.
    only: with an index, ``start`` is changed only as that equation reads
      it (a weight as one site reads it); other readers see its golden
      value, which is then part of the frontier.

  Returns:
    A :class:`Suffix`.
  """
  dep = {start}
  eqns = []
  for i in range(first, len(jaxpr.eqns)):
    e = jaxpr.eqns[i]
    if only is None:
      hit = any(_is_var(v) and v in dep for v in e.invars)
    else:
      hit = i == only or any(_is_var(v) and v in dep and v is not start
                             for v in e.invars)
    if hit:
      eqns.append(i)
      dep.update(e.outvars)
  if only is not None:
    dep.discard(start)  # its other readers read the golden value
  front, seen = [], set()
  readers = [v for i in eqns for v in jaxpr.eqns[i].invars] + list(
      jaxpr.outvars)
  for v in readers:
    if _is_var(v) and v not in seen and v not in dep and not (
        only is None and v is start):
      seen.add(v)
      front.append(v)
  outs = tuple(_is_var(v) and v in dep for v in jaxpr.outvars)
  return Suffix(start, tuple(eqns), tuple(front), outs)


def evaluate_all(closed: jex_core.ClosedJaxpr, leaves: Sequence[Any],
                 keep: Sequence[Any]) -> tuple[list, dict]:
  """Evaluates a flat closed jaxpr (marks are the identity).

  Args:
    closed: the flat closed jaxpr.
    leaves: its input values.
    keep: variables whose values to return besides the outputs.

  Returns:
    ``(outputs, {var: value for var in keep})``.
  """
  env: dict = {}
  jaxpr = closed.jaxpr
  for v, x in zip(jaxpr.constvars, closed.consts):
    env[v] = x
  for v, x in zip(jaxpr.invars, leaves):
    env[v] = x
  read = lambda v: v.val if isinstance(v, jex_core.Literal) else env[v]
  for e in jaxpr.eqns:
    ins = [read(v) for v in e.invars]
    outs = ins[:1] if e.primitive is mark_p else _bind(e, ins)
    for v, x in zip(e.outvars, outs):
      if not isinstance(v, jex_core.DropVar):
        env[v] = x
  return [read(v) for v in jaxpr.outvars], {v: env[v] for v in keep}


def evaluate_suffix(jaxpr: jex_core.Jaxpr, sfx: Suffix, values: dict,
                    start_value, golden_outs: Sequence[Any]) -> list:
  """Evaluates a suffix: the outputs with ``start`` changed.

  Args:
    jaxpr: the flat open jaxpr of ``sfx`` (or one with the same structure
      whose variables ``values`` and ``sfx`` name).
    sfx: the suffix.
    values: frontier variable -> value.
    start_value: the changed value of ``sfx.start`` (what its first
      equation reads; later readers of a weight read its golden value
      from ``values``).
    golden_outs: the outputs that do not depend on ``start`` (the others'
      entries are ignored).

  Returns:
    The jaxpr's outputs.
  """
  env = dict(values)
  weight = sfx.start in env  # changed only where its site reads it
  if not weight:
    env[sfx.start] = start_value
  read = lambda v: v.val if isinstance(v, jex_core.Literal) else env[v]
  for i in sfx.eqns:
    e = jaxpr.eqns[i]
    ins = [start_value if (weight and i == sfx.eqns[0] and _is_var(v)
                           and v is sfx.start) else read(v)
           for v in e.invars]
    outs = ins[:1] if e.primitive is mark_p else _bind(e, ins)
    for v, x in zip(e.outvars, outs):
      if not isinstance(v, jex_core.DropVar):
        env[v] = x
  return [read(v) if dep else g
          for v, dep, g in zip(jaxpr.outvars, sfx.outs, golden_outs)]


def _bind(eqn, invals) -> list:
  return _interpreter.bind(eqn, invals)


def corresponding_vars(a: jex_core.Jaxpr, b: jex_core.Jaxpr) -> dict | None:
  """Variable of ``a`` -> variable of ``b`` when both have one structure.

  Two traces of one function at two batch sizes usually have: the same
  equations, primitives and variable positions, with other shapes. None
  when they differ (a trace that branched on a shape).
  """
  if (len(a.eqns) != len(b.eqns) or len(a.invars) != len(b.invars)
      or len(a.constvars) != len(b.constvars)
      or len(a.outvars) != len(b.outvars)):
    return None
  m = {}

  def pair(x, y) -> bool:
    if isinstance(x, jex_core.Literal) != isinstance(y, jex_core.Literal):
      return False
    if _is_var(x):
      m[x] = y
    return True

  for x, y in zip(a.constvars + a.invars, b.constvars + b.invars):
    pair(x, y)
  for ea, eb in zip(a.eqns, b.eqns):
    if (ea.primitive is not eb.primitive or len(ea.invars) != len(eb.invars)
        or len(ea.outvars) != len(eb.outvars)):
      return None
    for x, y in zip(ea.invars + ea.outvars, eb.invars + eb.outvars):
      if not pair(x, y):
        return None
  for x, y in zip(a.outvars, b.outvars):
    if not pair(x, y):
      return None
  return m


def shape_of(v) -> tuple:
  return tuple(getattr(v.aval, "shape", ()))


def is_floating(v) -> bool:
  dt = getattr(v.aval, "dtype", None)
  return dt is not None and jnp.issubdtype(dt, jnp.floating)


def zeros_like_var(v):
  return np.zeros(shape_of(v), v.aval.dtype)
