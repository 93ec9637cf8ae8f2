"""Substituting kernels under test at sites, taps and call schedules.

:func:`substitute` and :func:`tap` wrap a function (a train step) into one that,
when called (under ``jax.jit``), traces the original, lists its sites (see
:mod:`peat_jax.sites._discovery`) and re-evaluates the jaxpr with an interpreter that
calls the kernel under test (KUT) at the selected sites and binds every other
equation unchanged. Everything happens at trace time: the compiled step holds
the KUT in place of the golden kernel, and schedules are decided inside it from
the step counter and a key, so later steps do not retrace.

Kernel-under-test signatures
----------------------------
* Primitive site: ``kut(*operands, **params)`` with the golden primitive's
  operands and parameters, e.g. for ``dot_general``
  ``kut(lhs, rhs, *, dimension_numbers, precision, preferred_element_type,
  out_sharding)``. It returns what the primitive returns (one array, or a list
  for multi-result primitives), same shapes and dtypes.
* Composite site (``@peat.composite(kind)``): ``kut(*args, **kwargs)`` with the
  marked function's own arguments. At a composite's backward site the
  interpreter computes ``jax.vjp`` of the KUT at the forward inputs, so a KUT
  that is a ``jax.custom_vjp`` uses its own backward.
* :data:`GOLDEN`: the golden kernel itself (for golden-for-golden checks).

The KUT's backward (``Substitution(backward="kut")``)
-----------------------------------------------------
At the backward sites it adds (:func:`peat_jax.sites.backward_sites`), and at
any backward site it selects, the KUT's VJP runs:

* a transposed ``dot_general`` / ``conv_general_dilated`` site (the cotangent
  of one operand of a forward call): ``jax.vjp`` of the KUT at the forward
  call's operands and parameters, applied to the site's output cotangent,
  keeping the cotangent of that operand, laid out as the site's output
  (:mod:`peat_jax.sites._pairing` finds the forward call; a site it cannot
  pair raises :class:`PeatError` naming it);
* a composite's backward site: ``jax.vjp`` of the KUT, as above;
* forward work recomputed inside a backward container (a composite's
  backward, ``remat``): the KUT's forward;
* any other primitive: the KUT on the site's own operands.

Construct support: sites inside nested ``jit``, ``scan``, ``cond``, ``while``,
``remat`` and custom-derivative calls are substitutable (custom-derivative
calls that were not differentiated in the step are evaluated through their
primal body); taps inside ``while`` are not supported (the number of calls is
unknown), and any other construct (e.g. ``shard_map``) raises
:class:`PeatError` naming the construct and the site.
"""

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jax.extend import core as jex_core

from peat_jax.sites import _composite
from peat_jax.sites import _discovery as _sites
from peat_jax.sites import _backward
from peat_jax.sites import _pairing
from peat_jax.core import PeatError
from peat_jax.sites._interpreter import (
    Visitor, bind, evaluate, evaluate_container)
from peat_jax.sites._schedules import EveryCall
from peat_jax.sites._schedules import _check_schedule

GOLDEN = "golden"
"""Use as a KUT to call the golden kernel itself at a site."""


# ---------------------------------------------------------------------------
# What to do at sites


class Substitution(NamedTuple):
  """A kernel under test and the sites where it replaces the golden kernel.

  The site criteria (``kernel``, ``pattern``, ``phase``, ``sites``) are
  combined with AND; at least one must be given.

  Attributes:
    kut: the kernel under test (see the module docstring for signatures),
      :data:`GOLDEN`, or ``None`` (only for :func:`tap`: capture the golden
      kernel's inputs and outputs).
    kernel: kernel name(s) to select, e.g. ``"dot_general"``, ``"softmax"``.
    pattern: ``fnmatch`` glob over site names, e.g. ``"*/Attention/*"``.
    phase: ``"fwd"``, ``"bwd"``, ``"upd"`` or a tuple of them.
    sites: explicit site names.
    schedule: when the KUT runs: :class:`EveryCall`, :class:`EveryNSteps` or
      :class:`Fraction` (ignored by taps, which always run both kernels).
    backward: ``"golden"`` keeps the golden kernel at the backward sites of
      the selected forward sites; ``"kut"`` runs the KUT's VJP there and at
      the selected backward sites (module docstring): the backward sites
      that belong to a selected forward site (the calls they transpose,
      recompute or differentiate), or, for a backward site that belongs to
      no forward site, those of a selected forward site's kernel and
      module path.
  """

  kut: Any
  kernel: str | tuple | None = None
  pattern: str | None = None
  phase: str | tuple | None = None
  sites: tuple | None = None
  schedule: Any = EveryCall()
  backward: str = "golden"


class Tap(NamedTuple):
  """What one tapped site saw in one step.

  Arrays of a site inside ``scan`` gain a leading axis (one row per
  iteration); a site in a ``cond`` branch not taken shows zeros.

  Attributes:
    inputs: the site's input arrays (tuple).
    golden: the golden kernel's output(s) on ``inputs`` (an array, or a
      tuple for multi-output sites).
    kut: the KUT's output(s) on the same inputs, or ``None`` if no KUT.
  """

  inputs: tuple
  golden: Any
  kut: Any


class _Action(NamedTuple):
  site: _sites.Site
  kut: Any
  schedule: Any
  tap: bool
  pair: Any = None  # _pairing.Pair: the KUT's VJP at a transposed site
  schedule_name: str | None = None  # the name schedules decide by


def _validate(sub, tap: bool) -> None:
  """Checks one Substitution in Python, before any tracing."""
  if not isinstance(sub, Substitution):
    raise PeatError(
        f"expected peat_jax.Substitution(kut, kernel=..., ...); got {type(sub).__name__}.")
  if sub.kernel is None and sub.pattern is None and sub.phase is None and sub.sites is None:
    raise PeatError(
        "a Substitution must select sites: give kernel=, pattern=, phase= or sites= "
        "(e.g. Substitution(kut, kernel='dot_general')).")
  if sub.kut is None and not tap:
    raise PeatError("substitute needs a kernel under test; got kut=None (only tap accepts None).")
  if sub.kut is not None and sub.kut != GOLDEN and not callable(sub.kut):
    raise PeatError(f"kut must be callable, peat_jax.GOLDEN or None; got {sub.kut!r}.")
  if sub.backward not in ("golden", "kut"):
    raise PeatError(f"backward must be 'golden' or 'kut'; got {sub.backward!r}.")
  if sub.phase is not None:
    for p in (sub.phase,) if isinstance(sub.phase, str) else sub.phase:
      if p not in _sites.PHASES:
        raise PeatError(f"phase must be one of {_sites.PHASES}; got {p!r}.")
  _check_schedule(sub.schedule)


def _resolve(sites: _sites.SiteTable, subs: Sequence[Substitution], tap: bool,
             closed=None) -> dict:
  actions: dict[tuple, _Action] = {}
  bmap = None
  for sub in subs:
    chosen = list(
        _sites.select_sites(sites, kernel=sub.kernel, pattern=sub.pattern, phase=sub.phase,
                            names=sub.sites)
    )
    if not chosen:
      raise PeatError(f"{sub._replace(kut='...')} selects no site; check discover_sites(...).table().")
    if sub.backward == "kut":
      bmap = bmap or _pairing.analyze_backward(closed, sites)
      seen = {s.name for s in chosen}
      chosen += [b.site for b in _backward.backward_of(sites, chosen, bmap)
                 if b.site.name not in seen]
    for s in chosen:
      if s.address in actions:
        raise PeatError(
            f"site {s.name!r} is selected by two substitutions; make their selections disjoint."
        )
      bad = [w for w in s.where if w not in _sites.SUPPORTED_CONSTRUCTS]
      if bad:
        raise PeatError(
            f"site {s.name!r} is inside a `{bad[0]}` construct, which peat_jax cannot rebuild; "
            f"supported: {sorted(_sites.SUPPORTED_CONSTRUCTS)}. Exclude it from the selection."
        )
      if tap and "while" in s.where:
        raise PeatError(
            f"site {s.name!r} is inside a `while` loop: taps need a known number of calls "
            "(use scan, or tap sites outside the loop)."
        )
      pair, sched_name = None, None
      if sub.backward == "kut" and s.phase == "bwd":
        sched_name = bmap.forward.get(s.address)
        if bmap.kind.get(s.address) == "vjp" and sub.kut not in (None, GOLDEN):
          pair = bmap.pairs.get(s.address)
          if pair is None:
            raise PeatError(
                f"backward site {s.name!r} cannot run the KUT's VJP: "
                f"{bmap.unpaired[s.address]}. Fix: backward='golden' (the "
                "forward-only question), or select forward sites whose "
                "backward sites peat_jax pairs (discover_sites(...).table()).")
      actions[s.address] = _Action(s, sub.kut, sub.schedule, tap, pair, sched_name)
  return actions


# ---------------------------------------------------------------------------
# The visitor of the interpreter (peat_jax.sites._interpreter)


class _Runtime(Visitor):
  """Substitution and taps: the KUT at the selected sites' addresses."""

  def __init__(self, actions: dict, containing: set, step: Any,
               continue_with: str):
    super().__init__()
    self.actions = actions
    self.containing = containing
    self.step = step
    self.continue_with = continue_with
    self.envs: dict = {}

  def scope(self, prefix, env):
    self.envs[prefix] = env

  def read(self, prefix, var):
    """A variable's value in the jaxpr at ``prefix`` (being evaluated)."""
    if isinstance(var, jex_core.Literal):
      return var.val
    return self.envs[prefix][var]

  def at(self, eqn, invals, addr):
    if addr in self.actions:
      return _apply_site(eqn, invals, addr, self.actions[addr], self)
    return None

  def enters(self, eqn, addr):
    del eqn
    return addr in self.containing


def _kut_fn(eqn, action: _Action, rt: "_Runtime"):
  """Returns ``f(*invals) -> list of outputs`` for the KUT at a site."""
  kut = action.kut
  if kut == GOLDEN:
    return lambda *a: bind(eqn, a)
  site = action.site
  if action.pair is not None:
    aval = eqn.outvars[0].aval
    return lambda *a: [_backward.vjp_output(action.pair, kut, list(a), rt.read,
                                           site.name, aval)]
  if site.composite:
    _, is_bwd, call = _composite.lookup(eqn.params["name"])
    if is_bwd:
      return lambda *a: _composite.kut_backward(call, kut, list(a))
    return lambda *a: _composite.kut_forward(call, kut, list(a))

  def prim_kut(*a):
    out = kut(*a, **eqn.params)
    return list(out) if eqn.primitive.multiple_results else [out]

  return prim_kut


def _checked(fn, eqn, site):
  """Wraps a KUT so that its outputs must match the golden avals."""

  def wrapped(*a):
    try:
      outs = fn(*a)
    except PeatError as err:  # a KUT's own check: say where it ran
      if site.name in str(err):
        raise
      raise PeatError(f"at site {site.name!r}: {err}") from err
    except Exception as err:  # the KUT itself failed while being traced
      raise PeatError(
          f"the KUT at site {site.name!r} raised {type(err).__name__}: "
          f"{err}. Fix the KUT, or leave the site out of the selection"
      ) from err
    if len(outs) != len(eqn.outvars):
      raise PeatError(
          f"KUT at site {site.name!r} returned {len(outs)} outputs; expected {len(eqn.outvars)}"
          f" like the golden kernel."
      )
    fixed = []
    for o, v in zip(outs, eqn.outvars):
      o = jnp.asarray(o)
      if o.shape != v.aval.shape or o.dtype != v.aval.dtype:
        raise PeatError(
            f"KUT at site {site.name!r} returned {o.dtype}{list(o.shape)}; expected "
            f"{v.aval.dtype}{list(v.aval.shape)} (the golden output). Cast or reshape in the KUT."
        )
      fixed.append(o)
    return fixed

  return wrapped


def _one(xs):
  return xs[0] if len(xs) == 1 else tuple(xs)


def _apply_site(eqn, invals, addr, action: _Action, rt: _Runtime):
  site = action.site
  golden = lambda *a: bind(eqn, a)
  kut = None if action.kut is None else _checked(_kut_fn(eqn, action, rt), eqn, site)
  if action.tap:
    if addr in rt.containing:  # sites inside this composite are tapped too
      g, taps = evaluate_container(eqn, invals, addr, rt)
    else:
      g, taps = golden(*invals), {}
    k = kut(*invals) if kut is not None else None
    out = k if (rt.continue_with == "kut" and k is not None) else g
    taps[site.name] = Tap(tuple(invals), _one(g), None if k is None else _one(k))
    return out, taps
  if action.kut == GOLDEN and addr in rt.containing:
    # A golden composite with selected sites inside: evaluate its body.
    kut = lambda *a: evaluate_container(eqn, list(a), addr, rt)[0]
  active = action.schedule.active(rt.step, action.schedule_name or site.name,
                                  tuple(rt.loop_indices))
  if active is True:
    return kut(*invals), {}
  return lax.cond(active, lambda a: kut(*a), lambda a: golden(*a), list(invals)), {}


def _default_counter(*args):
  state = args[0] if args else None
  step = getattr(state, "step", None)
  if step is None:
    raise PeatError(
        "a schedule other than EveryCall needs the step counter: the first argument has no "
        "`.step` (expected a peat_jax TrainState); pass counter=lambda *args: <int32 step>."
    )
  return step


def _build(fn, subs, tap: bool, continue_with: str, counter, include_structural: bool):
  if not callable(fn):
    raise PeatError(f"expected a callable train step; got {type(fn).__name__}.")
  if continue_with not in ("golden", "kut"):
    raise PeatError(f"continue_with must be 'golden' or 'kut'; got {continue_with!r}.")
  subs = tuple(subs)
  if not subs:
    raise PeatError("give at least one Substitution(kut, kernel=..., ...).")
  for sub in subs:
    _validate(sub, tap)
  needs_step = not tap and any(not isinstance(s.schedule, EveryCall) for s in subs)

  def run(*args):
    closed, out_shape = _sites.trace(fn, *args)
    sites = _sites.walk(closed, include_structural=include_structural)
    actions = _resolve(sites, subs, tap, closed)
    containing = {a[:k] for a in actions for k in range(1, len(a), 2)}
    step = (counter or _default_counter)(*args) if needs_step else None
    rt = _Runtime(actions, containing, step, continue_with)
    flat = jax.tree.leaves(args)
    outs, taps = evaluate(closed.jaxpr, closed.consts, flat, (), rt)
    out = jax.tree.unflatten(jax.tree.structure(out_shape), outs)
    return out, taps

  return run


def substitute(
    fn: Callable,
    *substitutions: Substitution,
    counter: Callable | None = None,
    include_structural: bool = False,
) -> Callable:
  """Returns ``fn`` with kernels under test at the selected sites.

  The result has ``fn``'s signature and outputs; jit it like ``fn``. Sites
  are resolved each time it is traced (names are stable), the KUT is traced
  into the step, and schedules are evaluated inside the compiled step, so
  repeated calls do not retrace.

  >>> kut = lambda l, r, **p: lax.dot_general(l.astype(jnp.bfloat16),
  ...     r.astype(jnp.bfloat16), p["dimension_numbers"],
  ...     preferred_element_type=jnp.float32)
  >>> step = jax.jit(substitute(task.step_fn,
  ...     Substitution(kut, kernel="dot_general", phase="fwd",
  ...                  schedule=EveryNSteps(10))))

  Args:
    fn: the function, typically a train step ``(state, batch) -> (state,
      metrics)``.
    *substitutions: what to substitute where (disjoint selections).
    counter: ``(*args) -> int32 step`` for schedules; default
      ``args[0].step`` (a :class:`peat_jax.TrainState`).
    include_structural: let selections reach data-movement primitives.

  Returns:
    A function with ``fn``'s signature.

  Raises:
    PeatError: at trace time, for a selection that matches nothing or an
      unknown site name (with close matches), a KUT whose output shape or
      dtype differs from the golden kernel's, or a site in an unsupported
      construct.
  """
  run = _build(fn, substitutions, False, "golden", counter, include_structural)

  def substituted(*args):
    return run(*args)[0]

  return substituted


def tap(
    fn: Callable,
    *selections: Substitution,
    continue_with: str = "golden",
    include_structural: bool = False,
) -> Callable:
  """Returns ``fn`` that also reports inputs and outputs of selected sites.

  At each selected site both the golden kernel and the KUT (if any) run on the
  *same* inputs; the step continues on the golden output (or on the KUT's
  with ``continue_with="kut"``). This is what playback needs: the
  pseudo-error ``taps[name].kut - taps[name].golden`` of a site, on identical
  inputs.

  >>> tapped = jax.jit(tap(task.step_fn, Substitution(kut, kernel="softmax")))
  >>> (state, metrics), taps = tapped(state, batch)
  >>> err = taps["fwd/Block/Attention/softmax:0"].kut - taps[...].golden

  Args:
    fn: the function, typically a train step.
    *selections: sites to tap and the KUT to run there (``kut=None`` taps
      the golden kernel alone); ``schedule`` is ignored.
    continue_with: ``"golden"`` or ``"kut"``: which output the step uses.
    include_structural: let selections reach data-movement primitives.

  Returns:
    A function ``(*args) -> (fn's outputs, {site name: Tap})``.

  Raises:
    PeatError: as :func:`substitute`; also for a tapped site inside ``while``.
  """
  return _build(fn, selections, True, continue_with, None, include_structural)
