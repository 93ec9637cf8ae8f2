"""The unit of playback FI: one checkpoint's two steps and its records.

A :class:`Player` compiles one jitted function that runs the step twice on
the same state and batch (golden kernel everywhere with the KUT tapped at
every selected site, and the KUT substituted at those sites) and turns one
restored state into that step's records; a :class:`PlayerGroup` does it for
several KUTs in one call."""

from __future__ import annotations

import math
import zlib
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import sites as _sites
from peat_jax.core import PeatError
from peat_jax.profiler.files import tag_backward
from peat_jax.profiler.playback_fi._timing import NO_LAPS, Laps
from peat_jax.profiler import golden as _golden
from peat_jax.profiler.golden import TrainTask
from peat_jax.kernels import kut as _kut
from peat_jax.profiler.playback_fi._site_records import (
    DeviceReferences, ProbeCache, _SharedReferences, site_records)
from peat_jax.profiler.playback_fi._invariance import InvarianceChecks


class SiteCall(NamedTuple):
  """One selected site of a playback, with what its reference needs.

  Attributes:
    site: the site.
    sub: the spec's substitution it comes from.
    kind: ``"forward"``, or for a backward site of ``backward="kut"`` what
      the KUT computes there (``peat_jax.sites.BackwardSite.kind``).
    params: for a transposed primitive backward site (``kind == "vjp"``),
      its own primitive parameters (its float64 reference).
  """

  site: _sites.Site
  sub: _sites.Substitution
  kind: str = "forward"
  params: dict | None = None


def _update_sums(params, gparams, kparams) -> tuple[jax.Array, jax.Array]:
  """``(||dk - dg||^2, ||dg||^2)`` in float64 over parameter pytrees.

  ``dg = gparams - params`` (golden update), ``dk = kparams - params`` (the
  KUT step's update), every difference taken in float64. Trace it with x64
  enabled (:data:`_UPDATE_SUMS`): the sums stay on the device and only two
  scalars come back.
  """
  num = jnp.zeros((), jnp.float64)
  den = jnp.zeros((), jnp.float64)
  for p, g, k in zip(jax.tree.leaves(params), jax.tree.leaves(gparams),
                     jax.tree.leaves(kparams)):
    p = p.astype(jnp.float64)
    dg = g.astype(jnp.float64) - p
    dk = k.astype(jnp.float64) - p
    num = num + jnp.sum(jnp.square(dk - dg))
    den = den + jnp.sum(jnp.square(dg))
  return num, den


_UPDATE_SUMS = jax.jit(_update_sums)


def update_rel_diff(params, gparams, kparams) -> float:
  """``||dk - dg|| / ||dg||``: how far the KUT step's update is from golden.

  Computed on the device in float64 (x64 scoped to this call, so the
  caller's config is untouched); 0 when both updates are zero, ``inf`` when
  only the golden update is.

  Args:
    params: parameters before the step.
    gparams: parameters after the golden step.
    kparams: parameters after the step with the KUT.

  Returns:
    The relative difference of the two updates.
  """
  with jax.enable_x64(True):
    num, den = jax.device_get(_UPDATE_SUMS(params, gparams, kparams))
  num, den = float(num), float(den)
  if den == 0.0:
    return 0.0 if num == 0.0 else math.inf
  return math.sqrt(num / den)


def select_calls(task: TrainTask, state, batch,
                 kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec",
                 select: str | Sequence[str] | None,
                 backward: str = "golden") -> tuple[list, list]:
  """The sites a KUT runs at in playback, in execution order.

  Args:
    task: the task.
    state: a state of it (shapes only matter).
    batch: a batch of it.
    kut_spec: the KUT (a checked spec is used as is).
    select: narrow the spec's forward sites: an ``fnmatch`` pattern or
      names (with ``backward="kut"``, names may also be backward sites).
    backward: ``"kut"`` adds the backward sites of the selected forward
      sites (:func:`peat_jax.sites.backward_sites`).

  Returns:
    ``([SiteCall], site table)``.

  Raises:
    PeatError: no selected site, both ``select`` and a spec pattern.
  """
  kut = _kut.checked(kut_spec, backward)
  subs = _kut.resolve_kut(kut.spec, backward=kut.backward)
  table = _sites.discover_sites(task.step_fn, state, batch)
  chosen = []
  for sub in subs:
    kw = dict(kernel=sub.kernel, phase=sub.phase, pattern=sub.pattern)
    if isinstance(select, str):
      if kw["pattern"] is not None:
        raise PeatError("select= and the spec's pattern both set")
      kw["pattern"] = select
    elif select is not None:
      kw["names"] = tuple(select)
    chosen += [SiteCall(s, sub) for s in _sites.select_sites(table, **kw)]
    if backward == "kut":
      named = () if select is None or isinstance(select, str) else select
      chosen += [SiteCall(b.site, sub, b.kind, b.params)
                 for b in _sites.backward_sites(
                     task.step_fn, state, batch,
                     forward=[c.site.name for c in chosen],
                     backward=tuple(named))]
  order = {s.name: i for i, s in enumerate(table)}
  chosen.sort(key=lambda c: order[c.site.name])
  if not chosen:
    raise PeatError(f"KUT {kut.name!r} selects no site of task {task.name!r}"
                    f" (select={select!r}); expected at least one")
  return chosen, table


def computes_narrow(task: TrainTask, state, batch) -> bool:
  """Whether the training step computes any value in a float format
  narrower than float32 (bf16 mixed precision...).

  XLA may keep such values of the golden run's step in float32
  (``xla_allow_excess_precision``, on by default); a tapped step, whose
  taps make the sites' narrow outputs outputs of the program, rounds
  them, so its golden loss differs from the golden run's by that
  rounding (a few bf16 units). Playback then replays the golden step
  with the same taps as the KUT's (the two differ by the KUT alone),
  rather than read the golden run's stored step. A float32 step's
  tapped and untapped programs give the same bits.
  """
  closed = jax.make_jaxpr(task.step_fn)(state, batch)
  return _narrow_in(closed.jaxpr)


def _narrow_in(jaxpr) -> bool:
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      dtype = getattr(v.aval, "dtype", None)
      if (dtype is not None and jnp.issubdtype(dtype, jnp.floating)
          and jnp.finfo(dtype).bits < 32):
        return True
    if any(_narrow_in(j) for j, _ in _sites.sub_jaxprs(eqn)):
      return True
  return False


def _both_steps(task: TrainTask, taps: Sequence[_sites.Substitution],
                kut: _sites.Substitution):
  """The golden step with the KUT tapped at the sites, and the KUT's step
  (the golden step replayed)."""
  tapped = _sites.tap(task.step_fn, *taps)
  kstep = _sites.substitute(task.step_fn, kut)

  def both(state, batch):
    (gstate, gm), tp = tapped(state, batch)
    kstate, km = kstep(state, batch)
    return tp, gstate.params, gm, kstate.params, km
  return both


def _kut_step(task: TrainTask, taps: Sequence[_sites.Substitution]):
  """The KUT's step alone, the golden kernel tapped beside the KUT at the
  sites on the step's own inputs (the golden step is stored)."""
  tapped = _sites.tap(task.step_fn, *taps, continue_with="kut")

  def kut_only(state, batch):
    (kstate, km), tp = tapped(state, batch)
    return tp, None, None, kstate.params, km
  return kut_only


def warm_up_tap(tap: _sites.Tap, name: str, device=None) -> _sites.Tap:
  """Seeded stand-ins of a site's tap, for compiling what a benign KUT's
  records run (:meth:`Player.compile`).

  The inputs and the golden output are seeded random arrays of the tap's
  shapes and dtypes, committed to ``device`` as the taps of a real step
  are (uncommitted host arrays lower to other programs); the KUT's output
  is the golden one, so the screen finds nothing to decompose or probe: a
  faulty KUT's decomposition compiles at its first flagged record, a
  benign KUT never pays for it.

  Args:
    tap: the tap's shapes and dtypes (``jax.eval_shape`` of the steps).
    name: the site's name (seeds its arrays).
    device: where the step's arrays live (default: the first device).

  Returns:
    A :class:`peat_jax.sites.Tap` of device arrays.
  """
  rng = np.random.default_rng(zlib.crc32(name.encode()))
  sharding = jax.sharding.SingleDeviceSharding(device or jax.devices()[0])

  def fake(a):
    if jnp.issubdtype(a.dtype, jnp.floating):
      x = rng.standard_normal(a.shape).astype(a.dtype)
    else:
      x = np.zeros(a.shape, a.dtype)
    return jax.device_put(x, sharding)

  golden = jax.tree.map(fake, tap.golden)
  return tap._replace(inputs=jax.tree.map(fake, tap.inputs), golden=golden,
                      kut=golden if tap.kut is not None else None)


class Player:
  """Plays back one checkpoint at a time: the unit of playback FI.

  Built once per (task, KUT, selection) from a sample state and batch; it
  compiles one jitted function that returns only what the records need:
  the taps, the steps' metrics and new parameters. With the golden run's
  stored steps (``golden_steps``, :mod:`peat_jax.profiler.golden._golden_step`)
  it runs the KUT's step alone, the KUT substituted at the selected sites
  and the golden kernel tapped beside it on the same inputs, and reads the
  golden step's loss and parameters from the store; without them it runs
  the step twice on the same state and batch (golden kernel everywhere
  with the KUT tapped at every selected site, and the KUT substituted at
  those sites). It turns one restored state into the records of its step.
  Campaign drivers (sequential :func:`playback`, process isolation,
  sharding over devices or hosts) call :meth:`play` on states they
  restore.

  Attributes:
    kut_spec: the KUT spec.
    calls: the selected sites (:class:`SiteCall`), execution order.
    site_names: their names, execution order.
    golden_steps: the golden run's stored steps the Player reads, or None
      (it replays the golden step).
    played: the pure function of the played steps, ``(state, batch) ->
      (taps, golden params or None, golden metrics or None, KUT params,
      KUT metrics)`` (:class:`PlayerGroup` jits several together).
  """

  def __init__(self, task: TrainTask,
               kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec", state,
               batch, *,
               select: str | Sequence[str] | None = None,
               backward: str = "golden", invariance: bool = False,
               golden_steps: "_golden.GoldenSteps | None" = None):
    """Selects the sites and builds (does not yet compile) the steps.

    Args:
      task: the golden run's task.
      kut_spec: a spec of :func:`peat_jax.resolve_kut`: a string, or
        parsed, or checked (``kernels.checked``: used as is).
      state: a state of the task (shapes only matter).
      batch: a batch of the task.
      select: narrow the spec's sites: an ``fnmatch`` pattern or names.
      backward: ``"golden"`` (the golden kernel at the backward sites) or
        ``"kut"`` (the KUT's VJP at the backward sites of the selected
        forward sites, tapped and recorded too).
      invariance: also probe the KUT at every forward site and composite
        backward site for stale outputs, mutated inputs, ignored inputs and
        batch variance (``peat_jax.profiler.playback_fi._invariance``; docs/detector.md).
      golden_steps: the golden run's stored steps, covering every
        checkpoint this Player plays (:func:`peat_jax.profiler.golden.stored_golden_steps`):
        the KUT's step runs alone. Ignored (the golden step is replayed)
        with ``backward="kut"`` and for a step that computes in a float
        format narrower than float32 (:func:`computes_narrow`).

    Raises:
      PeatError: unknown spec, no selected site, a bad ``backward``, a
        backward site the KUT's VJP cannot run at.
    """
    self.task = task
    self.kut = _kut.checked(kut_spec, backward)
    self.spec = self.kut.spec
    self.kut_spec = self.kut.name
    self.backward = backward
    self.calls, _ = select_calls(task, state, batch, self.kut, select,
                                 backward)
    self.site_names = [c.site.name for c in self.calls]
    self._store: dict = {}
    # The port probe runs once per site (and screened class) per campaign;
    # later records carry it (ProbeCache).
    self._probe_cache = ProbeCache()
    self._invariance = (InvarianceChecks(self.calls, self._store)
                        if invariance else None)
    self.golden_steps = golden_steps
    if golden_steps is not None and (
        backward != "golden" or computes_narrow(task, state, batch)):
      self.golden_steps = None
    subs = [self._tap_sub(c) for c in self.calls]
    if self.golden_steps is not None:
      self.played = _kut_step(task, subs)
    else:
      self.played = _both_steps(task, subs, _sites.Substitution(
          self.calls[0].sub.kut, sites=tuple(self.site_names),
          backward=self.calls[0].sub.backward))
    self._steps = jax.jit(self.played)
    self._compiled = None
    self._device_refs = None  # per call; built once the store is filled

  def _tap_sub(self, c: SiteCall) -> _sites.Substitution:
    """The substitution that taps one site (and records its reference)."""
    name = c.site.name
    if c.kind == "forward":
      return _sites.Substitution(_kut.recording(
          c.sub.kut, name, c.site.kernel, c.site.composite, self._store),
                                 sites=(name,))
    if c.kind == "vjp":  # the KUT's VJP; the reference: its own primitive
      self._store[name] = dict(c.params)
      return _sites.Substitution(c.sub.kut, sites=(name,), backward="kut")
    return _sites.Substitution(_kut.recording(
        c.sub.kut, name, c.site.kernel, c.site.composite, self._store,
        vjp=c.kind == "composite_vjp"), sites=(name,), backward="kut")

  def _refs(self) -> "DeviceReferences":
    """The calls' device references (after the steps were traced)."""
    if self._device_refs is None:
      self._device_refs = DeviceReferences(
          [(c.site, self._store[c.site.name]) for c in self.calls])
    return self._device_refs

  def compile(self, state) -> None:
    """Compiles everything :meth:`play` runs, without running the KUT.

    The two steps are compiled ahead of time (not run); the float64
    references and the signatures of every site run once on seeded random
    arrays of the taps' shapes and dtypes, which compiles them. After this,
    :meth:`play` of any state of this task runs compiled code only, so a
    worker's time limit can tell a hanging KUT from a slow compilation.

    Args:
      state: a state of the task (shapes only matter).
    """
    batch = self.task.batch_at(int(state.data_position))
    self._compiled = self._steps.lower(state, batch).compile()
    taps = jax.eval_shape(self._steps, state, batch)[0]
    site_records([(c.site, self._store[c.site.name],
                   warm_up_tap(taps[c.site.name], c.site.name))
                  for c in self.calls], self.kut_spec, 0, self._refs(),
                 backward=self.backward)
    update_rel_diff(state.params, state.params, state.params)

  def resume_probes(self, records: Sequence[dict]) -> None:
    """Carries the port probes of a campaign's recorded steps
    (:meth:`ProbeCache.from_records`): a resumed campaign's later records
    are then those an uninterrupted run writes.

    Args:
      records: this KUT's and backward setting's records of complete
        steps (a record file may hold other campaigns': filter them).
    """
    self._probe_cache = ProbeCache.from_records(records)

  def play(self, step: int, state, *, timings: dict | None = None
           ) -> list[dict]:
    """Records of one checkpoint: site records, then one effect record.

    Args:
      step: the checkpoint's step (stored in the records).
      state: the restored golden state at that step.
      timings: a dict to add the seconds of each phase to (benchmarks;
        every phase then waits for its device work). The records are the
        same either way.

    Returns:
      ``[site records in execution order..., effect record]``.
    """
    laps = NO_LAPS if timings is None else Laps()
    batch = self.task.batch_at(int(state.data_position))
    steps = self._compiled or self._steps
    laps.start()
    out = steps(state, batch)
    laps.lap("tapped + substituted steps", out)
    recs = self.records(step, state, out, self._refs(), laps=laps)
    if timings is not None:
      for k, v in laps.seconds.items():
        timings[k] = timings.get(k, 0.0) + v
    return recs

  def records(self, step: int, state, out, refs, laps=NO_LAPS) -> list[dict]:
    """Records of one checkpoint from the steps' outputs.

    Args:
      step: the checkpoint's step (stored in the records).
      state: the restored golden state at that step.
      out: what the steps returned (``both(state, batch)``).
      refs: the float64 references to use (:meth:`_refs`, or one shared
        among the KUTs of a :class:`PlayerGroup`).
      laps: times the phases (``Player.play(timings=...)``).

    Returns:
      ``[site records in execution order..., effect record]``.
    """
    taps, gparams, gm, kparams, km = out
    stored = None
    if gm is None:  # the KUT's step alone: the golden one was stored
      stored = self.golden_steps.read(step, state.params)
      # On the device, as the restored state's: the update difference is
      # then the program :meth:`compile` warmed.
      gparams = jax.tree.map(lambda h, x: jax.device_put(h, x.sharding),
                             stored.params, state.params)
      gm = {"loss": stored.loss, "grad_norm": stored.grad_norm}
    recs = site_records([(c.site, self._store[c.site.name],
                          taps[c.site.name]) for c in self.calls],
                        self.kut_spec, int(step), refs,
                        backward=self.backward, laps=laps,
                        probe_cache=self._probe_cache)
    if self._invariance is not None:
      recs = self._invariance.annotate(int(step), recs, taps)
    gm, km = jax.device_get((gm, km))
    lg, lk = float(gm["loss"]), float(km["loss"])
    gng, gnk = float(gm["grad_norm"]), float(km["grad_norm"])
    eff = {
        "kind": "effect", "kut": self.kut_spec, "step": int(step),
        "loss_golden": lg, "loss_kut": lk,
        "grad_rel_diff": (abs(gnk - gng) / gng if gng else
                          (0.0 if gnk == gng else math.inf)),
        "update_rel_diff": update_rel_diff(state.params, gparams, kparams)}
    if stored is not None:
      eff["golden_step"] = "stored"
    laps.lap("effect record (loss, update difference)")
    return recs + [tag_backward(eff, self.backward)]


class PlayerGroup:
  """Plays back several KUTs at one checkpoint with one compiled call.

  One jitted function holds every KUT's two steps (:class:`Player`). The
  golden step, tapped, is the same computation for every KUT but for the
  KUT calls on the taps, and XLA merges the common part, so it runs once;
  the float64 references of a site are computed once for all KUTs
  (:class:`_SharedReferences`). Each KUT's records are those its own
  :class:`Player` writes (tests/test_playback.py compares them bitwise).

  Attributes:
    players: KUT spec -> its :class:`Player`, in the given order.
  """

  def __init__(self, task: TrainTask, kut_specs: Sequence[str], state,
               batch, *, select: str | Sequence[str] | None = None,
               backward: str = "golden", invariance: bool = False,
               golden_steps: "_golden.GoldenSteps | None" = None):
    """Selects every KUT's sites and builds (not compiles) the call.

    Args:
      task: the golden run's task.
      kut_specs: distinct KUT specs (:func:`peat_jax.resolve_kut`).
      state: a state of the task (shapes only matter).
      batch: a batch of the task.
      select: narrow every spec's sites (as :class:`Player`).
      backward: as :class:`Player`, for every KUT.
      invariance: as :class:`Player`, for every KUT.
      golden_steps: as :class:`Player`, for every KUT.

    Raises:
      PeatError: no spec, a repeated spec, an unknown spec, a spec that
        selects no site.
    """
    self.task = task
    self.players = {k.name: Player(task, k, state, batch, select=select,
                                   backward=backward, invariance=invariance,
                                   golden_steps=golden_steps)
                    for k in check_specs(kut_specs, backward)}
    fns = [p.played for p in self.players.values()]
    self._steps = jax.jit(lambda state, batch: [f(state, batch)
                                                for f in fns])

  def play(self, step: int, state) -> dict[str, list[dict]]:
    """Every KUT's records of one checkpoint.

    Args:
      step: the checkpoint's step (stored in the records).
      state: the restored golden state at that step.

    Returns:
      KUT spec -> ``[site records in execution order..., effect record]``.
    """
    batch = self.task.batch_at(int(state.data_position))
    outs = self._steps(state, batch)
    cache: dict = {}
    return {k: p.records(step, state, out, _SharedReferences(
        p._refs(), p.site_names, cache))  # pylint: disable=protected-access
            for (k, p), out in zip(self.players.items(), outs)}


def check_specs(kut_specs, backward: str = "golden"
                ) -> list[_kut.CheckedSpec]:
  """The checked specs of a list of KUTs (strings are parsed here, once).

  Raises:
    PeatError: no spec, a repeated spec, a bad spec or ``backward``.
  """
  kinds = (str, _kut.KutSpec, _kut.CheckedSpec)
  if isinstance(kut_specs, kinds):
    kut_specs = [kut_specs]
  given = list(kut_specs)
  if not given or not all(isinstance(k, kinds) for k in given):
    raise PeatError(f"kut_specs must be one or more KUT spec strings; got "
                    f"{kut_specs!r}")
  names = [k if isinstance(k, str) else k.spec if isinstance(
      k, _kut.KutSpec) else k.name for k in given]
  twice = sorted({k for k in names if names.count(k) > 1})
  if twice:
    raise PeatError(f"KUT specs given more than once: {twice}; each KUT is "
                    "played back once per checkpoint")
  return [_kut.checked(k, backward) for k in given]
