"""Playback FI: replay saved golden steps with a KUT at selected sites.

For each checkpoint: restore the full state, run the step once with the
golden kernel everywhere and the KUT tapped at the selected sites (pseudo-
errors on identical inputs, float64 references, signatures, diagnoses), and
once with the KUT substituted (effect on loss, gradient norm and update).
Checkpoints are independent: errors do not accumulate between them.

Cost per checkpoint (benchmarks/bench_campaign.py): the two steps run as one
jitted call that returns only what the records need (taps, metrics, new
parameters); the parameter-update difference is reduced on the device in
float64; the float64 references of all primitive sites run in one x64
executable that splits them into float32 halves on the device, and all their
signatures in one more (:class:`DeviceReferences`, ``analyze_split_many``);
everything comes to the host in one transfer; checkpoints are read through a
:class:`peat_jax.profiler._golden.StateReader` (tensorstore, no per-array Orbax
work); and :func:`playback` restores the next checkpoints in a background
thread while the current one plays. The
records are those of the plain path (steps jitted apart, update difference
on the host), bitwise (tests/test_playback.py). Several KUTs played back
together (:class:`PlayerGroup`, :func:`playback_many`) share the restore,
the golden step (XLA merges the KUTs' identical golden steps in one jitted
call) and the float64 references of each checkpoint.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import os
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.analyzer import _signature as _analyzer
from peat_jax.detector import _detect as _detector
from peat_jax.profiler import _golden as _golden
from peat_jax.sites import _discovery as _sites
from peat_jax.sites import _substitution as _sites_subst
from peat_jax.profiler._checkpoint import saved_steps
from peat_jax.core._errors import PeatError
from peat_jax.profiler._records import PLAYBACK_FILE
from peat_jax.profiler._records import append_records
from peat_jax.profiler._records import read_records
from peat_jax.profiler._records import rewrite_records
from peat_jax.profiler._records import signature_record
from peat_jax.profiler._train_state import TrainTask
from peat_jax.kernels import kut as _kut

#: noise ratio above which a site counts as leaving the noise floor.
LOCALIZE_NOISE_RATIO = 2.0


class SiteCall(NamedTuple):
  """One selected site of a playback, with what its reference needs."""

  site: _sites.Site
  sub: _sites_subst.Substitution


class PlaybackResult(NamedTuple):
  """What :func:`playback` recorded.

  Attributes:
    records: site records ``{"kind": "site", "step", "site", ...}`` in
      (step, execution order).
    effects: per-step records ``{"kind": "effect", "step", "loss_golden",
      "loss_kut", "grad_rel_diff", "update_rel_diff"}``.
    sites: the selected sites, execution order.
    localization: ``{"site", "step", "noise_ratio"}`` or None.
    seconds_per_step: mean wall time of one checkpoint's playback after the
      first (compilation excluded), NaN when fewer than two ran.
  """

  records: list
  effects: list
  sites: list
  localization: dict | None
  seconds_per_step: float


def _reduction(site: _sites.Site, params: dict) -> int:
  shapes = site.in_shapes
  if site.kernel == "dot_general":
    return _kut.dot_general_reduction(shapes, params["dimension_numbers"])
  if site.kernel == "conv_general_dilated":
    rhs = shapes[1]
    out_dim = params["dimension_numbers"].rhs_spec[0]
    return int(np.prod(rhs) // rhs[out_dim])
  return int(shapes[0][-1]) if shapes and shapes[0] else 1


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


def select_calls(task: TrainTask, state, batch, kut_spec: str,
            select: str | Sequence[str] | None) -> tuple[list, list]:
  subs = _kut.resolve_kut(kut_spec)
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
  order = {s.name: i for i, s in enumerate(table)}
  chosen.sort(key=lambda c: order[c.site.name])
  if not chosen:
    raise PeatError(f"KUT {kut_spec!r} selects no site of task {task.name!r}"
                    f" (select={select!r}); expected at least one")
  return chosen, table


def _site_reference(site: _sites.Site, params: dict, inputs) -> Any:
  """float64 reference of a site's golden kernel on its tapped inputs.

  Under ``scan`` the taps have a leading iteration axis: the reference is
  computed per iteration. None when no reference applies.
  """
  try:
    fn = _kut.reference_fn(site.kernel, params)
    inputs = [np.asarray(x) for x in inputs]
    if "scan" in site.where and inputs and inputs[0].ndim == len(
        site.in_shapes[0]) + 1:
      return np.stack([np.asarray(fn(*[x[i] for x in inputs]))
                       for i in range(inputs[0].shape[0])])
    return fn(*inputs)
  except (PeatError, TypeError, ValueError):
    return None


class DeviceReferences:
  """float64 references of a Player's primitive sites, on the device.

  One jitted call (traced with x64) computes the references of the sites
  asked for and splits each into float32 (hi, lo) halves: neither the site
  inputs nor any float64 array come to the host. Composite sites (no
  traceable golden kernel) keep the host path (``_site_reference``).
  """

  def __init__(self, sites: Sequence[tuple[_sites.Site, dict]]):
    """Args: sites: ``(site, params)`` per site, as in ``site_records``."""
    self.fns = [_kut.reference_traced(site.kernel, params)
                for site, params in sites]

    def refs(which, inputs):
      return [_analyzer.split_on_device(
          self.fns[i](*[x.astype(jnp.float64) for x in xs]))
              for i, xs in zip(which, inputs)]
    self._jit = jax.jit(refs, static_argnums=0)

  def usable(self, i: int, site: _sites.Site, tp: _sites_subst.Tap) -> bool:
    """Site ``i``'s tap is one plain call (not scan-stacked, one output)."""
    return (self.fns[i] is not None and not isinstance(tp.golden, tuple)
            and len(tp.inputs) == len(site.in_shapes) and all(
                np.shape(x) == tuple(s)
                for x, s in zip(tp.inputs, site.in_shapes)))

  def __call__(self, which: tuple[int, ...], inputs: list) -> list:
    """``[(hi, lo)]`` of the sites ``which`` from their input tuples."""
    with jax.enable_x64(True):
      return self._jit(which, inputs)


def _device_signatures(sites, refs: DeviceReferences) -> dict[int, Any]:
  """Signatures of the sites ``refs`` can serve: two dispatches in all."""
  which = tuple(i for i, (site, _, tp) in enumerate(sites)
                if refs.usable(i, site, tp))
  if not which:
    return {}
  hilo = refs(which, [tuple(sites[i][2].inputs) for i in which])
  ok = [(i, hl) for i, hl in zip(which, hilo)
        if np.shape(hl[0]) == np.shape(sites[i][2].golden)]
  sigs = _analyzer.analyze_split_many(
      [sites[i][2].kut for i, _ in ok], [sites[i][2].golden for i, _ in ok],
      [hl[0] for _, hl in ok], [hl[1] for _, hl in ok], to_host=True)
  return {i: sig for (i, _), sig in zip(ok, sigs)}


def _signature(site: _sites.Site, params: dict, tp: _sites_subst.Tap):
  """Dispatches one site's signature (not waited for) and its context."""
  ref = _site_reference(site, params, tp.inputs)
  test, gold = tp.kut, tp.golden
  if isinstance(gold, tuple):
    test, gold = test[0], gold[0]
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
  if ref is not None and np.shape(ref) != np.shape(gold):
    ref = None
  return _analyzer.analyze(test, gold, ref), _reduction(site, params)


def site_records(sites: Sequence[tuple[_sites.Site, dict, _sites_subst.Tap]],
                 kut_spec: str, step: int,
                 device_refs: DeviceReferences | None = None
                 ) -> list[dict]:
  """(step, site) records of many sites of one step.

  Every signature is dispatched before any is read, then all come to the
  host in one transfer; the Detector runs on host copies.

  Args:
    sites: ``(site, params, tap)`` triples: the tapped site, its call
      parameters as recorded by ``kut.recording``, and its tap (inputs,
      golden and KUT outputs of one step).
    kut_spec: the KUT's spec, stored with the records.
    step: the step the taps come from.
    device_refs: the sites' :class:`DeviceReferences` (None: every float64
      reference is computed on host copies); same records either way.

  Returns:
    One msgpack-ready dict (``kind == "site"``) per site, in order.
  """
  done = _device_signatures(sites, device_refs) if device_refs else {}
  pending = [(site, done[i], _reduction(site, params)) if i in done
             else (site, *_signature(site, params, tp))
             for i, (site, params, tp) in enumerate(sites)]
  # Signatures of `done` are on the host already (packed transfer).
  fetched = iter(jax.device_get([sig for i, (_, sig, _) in enumerate(pending)
                                 if i not in done]))
  host = [sig if i in done else next(fetched)
          for i, (_, sig, _) in enumerate(pending)]
  out = []
  for (site, _, red), sig in zip(pending, host):
    diag = _detector.detect(sig, context={"kernel": site.kernel,
                                          "reduction": red})
    out.append({
        "kind": "site", "kut": kut_spec, "step": step, "site": site.name,
        "kernel": site.kernel, "phase": site.phase, "reduction": red,
        "signature": signature_record(sig),
        "diagnosis": {"model": diag.model,
                      "confidence": float(diag.confidence),
                      "evidence": diag.evidence, "verdict": diag.verdict}})
  return out


def site_record(site: _sites.Site, params: dict, tp: _sites_subst.Tap,
                kut_spec: str, step: int) -> dict:
  """One (step, site) record: signature vs golden and float64, diagnosis.

  Args:
    site: the tapped site.
    params: its call parameters, as recorded by ``kut.recording``.
    tp: the site's tap (inputs, golden and KUT outputs of one step).
    kut_spec: the KUT's spec, stored with the record.
    step: the step the tap comes from.

  Returns:
    A msgpack-ready dict (``kind == "site"``); see :func:`site_records`
    for many sites of one step.
  """
  return site_records([(site, params, tp)], kut_spec, step)[0]


def localize(records: Sequence[dict], site_order: Sequence[str]
             ) -> dict | None:
  """First site (execution order) leaving the noise floor, earliest step.

  A record leaves it when its noise ratio exceeds
  :data:`LOCALIZE_NOISE_RATIO`, or when it is not exact and its diagnosis
  fails.
  """
  order = {n: i for i, n in enumerate(site_order)}
  hits = []
  for r in records:
    nr = r["signature"].get("noise_ratio", math.nan)
    bad = (nr == nr and nr > LOCALIZE_NOISE_RATIO) or (
        r["diagnosis"]["model"] != "exact"
        and r["diagnosis"]["verdict"] == "fail")
    if bad:
      hits.append((order.get(r["site"], 1 << 30), r["step"], r["site"], nr))
  if not hits:
    return None
  _, step, site, nr = min(hits)
  return {"site": site, "step": int(step),
          "noise_ratio": None if nr != nr else float(nr)}


class Player:
  """Plays back one checkpoint at a time: the unit of playback FI.

  Built once per (task, KUT, selection) from a sample state and batch; it
  compiles one jitted function that runs the step twice on the same state
  and batch (golden kernel everywhere with the KUT tapped at every selected
  site, and the KUT substituted at those sites) and returns only what the
  records need: the taps, both steps' metrics and new parameters. It turns
  one restored state into the records of its step. Campaign drivers
  (sequential :func:`playback`, process isolation, sharding over devices or
  hosts) call :meth:`play` on states they restore.

  Attributes:
    kut_spec: the KUT spec.
    calls: the selected sites (:class:`SiteCall`), execution order.
    site_names: their names, execution order.
  """

  def __init__(self, task: TrainTask, kut_spec: str, state, batch, *,
               select: str | Sequence[str] | None = None):
    """Selects the sites and builds (does not yet compile) the steps.

    Args:
      task: the golden run's task.
      kut_spec: a spec of :func:`peat_jax.kernels.kut.resolve_kut`.
      state: a state of the task (shapes only matter).
      batch: a batch of the task.
      select: narrow the spec's sites: an ``fnmatch`` pattern or names.

    Raises:
      PeatError: unknown spec, no selected site.
    """
    self.task = task
    self.kut_spec = kut_spec
    self.calls, _ = select_calls(task, state, batch, kut_spec, select)
    self.site_names = [c.site.name for c in self.calls]
    self._store: dict = {}
    subs = [_sites_subst.Substitution(
        _kut.recording(c.sub.kut, c.site.name, c.site.kernel,
                       c.site.composite, self._store), sites=(c.site.name,))
            for c in self.calls]
    tapped = _sites_subst.tap(task.step_fn, *subs)
    eff = [_sites_subst.Substitution(
        self.calls[0].sub.kut, sites=tuple(self.site_names),
        backward=self.calls[0].sub.backward)]
    kstep = _sites_subst.substitute(task.step_fn, *eff)

    def both(state, batch):
      (gstate, gm), taps = tapped(state, batch)
      kstate, km = kstep(state, batch)
      return taps, gstate.params, gm, kstate.params, km

    self.both = both  # pure; PlayerGroup jits several together
    self._steps = jax.jit(both)
    self._compiled = None
    self._device_refs = None  # per call; built once the store is filled

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
    rng = np.random.default_rng(0)

    def fake(a):
      if jnp.issubdtype(a.dtype, jnp.floating):
        return rng.standard_normal(a.shape).astype(a.dtype)
      return np.zeros(a.shape, a.dtype)
    site_records([(c.site, self._store[c.site.name],
                   jax.tree.map(fake, taps[c.site.name]))
                  for c in self.calls], self.kut_spec, 0, self._refs())
    update_rel_diff(state.params, state.params, state.params)

  def play(self, step: int, state) -> list[dict]:
    """Records of one checkpoint: site records, then one effect record.

    Args:
      step: the checkpoint's step (stored in the records).
      state: the restored golden state at that step.

    Returns:
      ``[site records in execution order..., effect record]``.
    """
    batch = self.task.batch_at(int(state.data_position))
    steps = self._compiled or self._steps
    return self.records(step, state, steps(state, batch), self._refs())

  def records(self, step: int, state, out, refs) -> list[dict]:
    """Records of one checkpoint from the steps' outputs.

    Args:
      step: the checkpoint's step (stored in the records).
      state: the restored golden state at that step.
      out: what the steps returned (``both(state, batch)``).
      refs: the float64 references to use (:meth:`_refs`, or one shared
        among the KUTs of a :class:`PlayerGroup`).

    Returns:
      ``[site records in execution order..., effect record]``.
    """
    taps, gparams, gm, kparams, km = out
    recs = site_records([(c.site, self._store[c.site.name],
                          taps[c.site.name]) for c in self.calls],
                        self.kut_spec, int(step), refs)
    gm, km = jax.device_get((gm, km))
    lg, lk = float(gm["loss"]), float(km["loss"])
    gng, gnk = float(gm["grad_norm"]), float(km["grad_norm"])
    eff = {
        "kind": "effect", "kut": self.kut_spec, "step": int(step),
        "loss_golden": lg, "loss_kut": lk,
        "grad_rel_diff": (abs(gnk - gng) / gng if gng else
                          (0.0 if gnk == gng else math.inf)),
        "update_rel_diff": update_rel_diff(state.params, gparams, kparams)}
    return recs + [eff]


class _SharedReferences:
  """A Player's device references, shared with the other KUTs of a group.

  A site's float64 reference depends only on its golden inputs, which are
  the same for every KUT played back from the same state: the first KUT
  to ask for a site computes its ``(hi, lo)``, the others reuse it. The
  cache lives for one checkpoint.
  """

  def __init__(self, inner: DeviceReferences, names: Sequence[str],
               cache: dict):
    self._inner, self._names, self._cache = inner, list(names), cache

  def usable(self, i: int, site: _sites.Site, tp: _sites_subst.Tap) -> bool:
    return self._inner.usable(i, site, tp)

  def __call__(self, which: tuple[int, ...], inputs: list) -> list:
    missing = tuple(i for i in which if self._names[i] not in self._cache)
    if missing:
      given = dict(zip(which, inputs))
      got = self._inner(missing, [given[i] for i in missing])
      self._cache.update(
          (self._names[i], hl) for i, hl in zip(missing, got))
    return [self._cache[self._names[i]] for i in which]


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
               batch, *, select: str | Sequence[str] | None = None):
    """Selects every KUT's sites and builds (not compiles) the call.

    Args:
      task: the golden run's task.
      kut_specs: distinct KUT specs (:func:`peat_jax.resolve_kut`).
      state: a state of the task (shapes only matter).
      batch: a batch of the task.
      select: narrow every spec's sites (as :class:`Player`).

    Raises:
      PeatError: no spec, a repeated spec, an unknown spec, a spec that
        selects no site.
    """
    self.task = task
    self.players = {k: Player(task, k, state, batch, select=select)
                    for k in _check_specs(kut_specs)}
    fns = [p.both for p in self.players.values()]
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


def _check_specs(kut_specs) -> list[str]:
  if isinstance(kut_specs, str):
    kut_specs = [kut_specs]
  specs = list(kut_specs)
  if not specs or not all(isinstance(k, str) for k in specs):
    raise PeatError(f"kut_specs must be one or more KUT spec strings; got "
                    f"{kut_specs!r}")
  twice = sorted({k for k in specs if specs.count(k) > 1})
  if twice:
    raise PeatError(f"KUT specs given more than once: {twice}; each KUT is "
                    "played back once per checkpoint")
  return specs


def playback_plan(golden_dir: str | os.PathLike, kut_spec: str,
                  campaign_dir: str | os.PathLike | None,
                  steps: Sequence[int] | None) -> tuple[str, str, list, list]:
  """Resolves paths and the steps to play; drops partial steps (resume).

  Args:
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: the KUT spec whose records count.
    campaign_dir: where ``playback.msgpack`` goes (default: the golden
      directory's parent).
    steps: the checkpoint steps wanted (default: all saved but the last).

  Returns:
    ``(checkpoint_dir, record_path, steps, todo)``: ``todo`` are the steps
    without a complete record set (an effect record) of this KUT.

  Raises:
    PeatError: a wanted step is not saved.
  """
  golden_dir = os.path.abspath(os.fspath(golden_dir))
  ckpt = _golden._checkpoint_dir_of(golden_dir)  # pylint: disable=protected-access
  campaign_dir = os.path.abspath(os.fspath(
      campaign_dir or os.path.dirname(golden_dir)))
  os.makedirs(campaign_dir, exist_ok=True)
  path = os.path.join(campaign_dir, PLAYBACK_FILE)
  return (ckpt, path,
          *plan_steps(saved_steps(ckpt), ckpt, path, kut_spec, steps))


def plan_steps(saved: Sequence[int], ckpt: str, path: str, kut_spec: str,
               steps: Sequence[int] | None) -> tuple[list[int], list[int]]:
  """The steps to play and those still to do; drops partial steps (resume).

  Args:
    saved: the golden run's saved steps.
    ckpt: its checkpoint directory (named in errors).
    path: the record file; partial steps of ``kut_spec`` (no effect
      record) are removed from it.
    kut_spec: the KUT spec whose records count.
    steps: the steps wanted (default: all saved but the last).

  Returns:
    ``(steps, todo)``.

  Raises:
    PeatError: a wanted step is not saved.
  """
  if steps is None:
    steps = saved[:-1] if len(saved) > 1 else saved
  steps = [int(s) for s in steps]
  missing = [s for s in steps if s not in saved]
  if missing:
    raise PeatError(f"playback steps {missing} are not saved in {ckpt}; "
                    f"saved steps: {saved}")
  # Resume: keep complete steps (with an effect record), drop partial ones.
  old = read_records(path)
  done = {r["step"] for r in old if r.get("kind") == "effect"
          and r.get("kut") == kut_spec}
  kept = [r for r in old if r.get("kut") != kut_spec or r.get("step") in done]
  if len(kept) != len(old):
    rewrite_records(path, kept)
  return steps, [s for s in steps if s not in done]


def playback_result(path: str, steps: Sequence[int], kut_spec: str,
                    site_order: Sequence[str] | None = None,
                    timings: Sequence[float] = ()) -> PlaybackResult:
  """Reads a playback record file back into a :class:`PlaybackResult`.

  Args:
    path: ``playback.msgpack``.
    steps: the steps to include.
    kut_spec: the KUT whose records are read.
    site_order: execution order of the sites (default: first appearance).
    timings: wall seconds per played checkpoint (the first is compile).

  Returns:
    A :class:`PlaybackResult` sorted by (step, execution order).
  """
  allrecs = [r for r in read_records(path) if r.get("kut") == kut_spec
             and r.get("step") in set(steps)]
  site_recs = [r for r in allrecs if r.get("kind") == "site"]
  effects = sorted((r for r in allrecs if r.get("kind") == "effect"),
                   key=lambda r: r["step"])
  order: list[str] = list(site_order or [])
  for r in site_recs:
    if r["site"] not in order:
      order.append(r["site"])
  rank = {n: i for i, n in enumerate(order)}
  site_recs.sort(key=lambda r: (r["step"], rank[r["site"]]))
  sps = float(np.mean(timings[1:])) if len(timings) > 1 else math.nan
  return PlaybackResult(site_recs, effects, order,
                        localize(site_recs, order), sps)


class _Prefetcher:
  """Restores checkpoints in order, ``ahead`` of the one being played.

  Restores run in one background thread, so the next checkpoint loads
  (Orbax's Python, tensorstore's reads) while the current one's steps and
  signatures run in XLA, outside the GIL; the gain needs a spare core.
  ``ahead=0`` restores in the calling thread, one at a time.
  """

  def __init__(self, ckpt: str, task: TrainTask, steps: Sequence[int],
               ahead: int):
    self._ckpt, self._task, self._ahead = ckpt, task, ahead
    self._reader: _golden.StateReader | None = None  # opened on first use
    self._todo = collections.deque(steps)
    self._queue: collections.deque = collections.deque()
    self._pool = (concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix="peat-restore") if ahead > 0 else None)

  def _fill(self, want: int) -> None:
    while self._todo and len(self._queue) < want:
      s = self._todo.popleft()
      self._queue.append((s, self._pool.submit(self._restore, s)))

  def _restore(self, step: int):
    if self._reader is None:
      self._reader = _golden.StateReader(self._ckpt, self._task)
    return self._reader.restore(step)

  def next(self) -> tuple[int, Any]:
    """The next step and its restored state (waits for it if needed)."""
    if self._pool is None:
      s = self._todo.popleft()
      return s, self._restore(s)
    self._fill(1)
    s, fut = self._queue.popleft()
    self._fill(self._ahead)
    return s, fut.result()

  def close(self) -> None:
    """Cancels restores not started and waits for a running one."""
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)
    if self._reader is not None:
      self._reader.close()


def playback(task: TrainTask, golden_dir: str | os.PathLike, kut_spec: str,
             *, campaign_dir: str | os.PathLike | None = None,
             steps: Sequence[int] | None = None,
             select: str | Sequence[str] | None = None,
             progress: Callable[[str], None] | None = None,
             prefetch: int = 1) -> PlaybackResult:
  """Playback FI of a KUT at every saved checkpoint of a golden run.

  For each saved step s (all but the last, or ``steps``): restore, and let a
  :class:`Player` run the step with the golden kernel and the KUT tapped at
  every selected site and with the KUT substituted (jitted once).
  Records are appended per checkpoint, so a killed playback resumes. The
  records do not depend on ``prefetch``.

  Args:
    task: the golden run's task.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: a spec of :func:`peat_jax.kernels.kut.resolve_kut`.
    campaign_dir: where ``playback.msgpack`` goes (default: ``golden_dir``'s
      parent). Finished steps found there are skipped.
    steps: checkpoint steps to play back (default: all saved but the last).
    select: narrow the spec's sites: an ``fnmatch`` pattern or site names.
    progress: called with one line per step.
    prefetch: checkpoints restored ahead in a background thread while one
      plays (0: restore each in turn, in this thread).

  Returns:
    A :class:`PlaybackResult`.

  Raises:
    PeatError: unknown spec, no selected site, a step that is not saved, a
      negative ``prefetch``.
    CheckpointError: a checkpoint that cannot be restored (raised when its
      turn comes; the steps before it are recorded).
  """
  return playback_many(task, golden_dir, [kut_spec],
                       campaign_dir=campaign_dir, steps=steps, select=select,
                       progress=progress, prefetch=prefetch)[kut_spec]


def playback_many(task: TrainTask, golden_dir: str | os.PathLike,
                  kut_specs: Sequence[str], *,
                  campaign_dir: str | os.PathLike | None = None,
                  steps: Sequence[int] | None = None,
                  select: str | Sequence[str] | None = None,
                  progress: Callable[[str], None] | None = None,
                  prefetch: int = 1) -> dict[str, PlaybackResult]:
  """Playback FI of several KUTs together, one restore per checkpoint.

  Each checkpoint is restored once and played by a :class:`PlayerGroup`:
  the golden step and the float64 references run once for all KUTs, each
  KUT's taps, substituted step and signatures once per KUT. The records of
  every KUT go to the same ``playback.msgpack`` (records carry their
  ``kut``) and equal, bitwise, what :func:`playback` of that KUT alone
  writes; each KUT resumes on its own (a step is played when any KUT lacks
  it, and recorded only for those).

  Args:
    task: the golden run's task.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_specs: distinct specs of :func:`peat_jax.kernels.kut.resolve_kut`.
    campaign_dir, steps, select, progress, prefetch: as :func:`playback`.

  Returns:
    KUT spec -> its :class:`PlaybackResult` (``seconds_per_step`` is the
    wall time of a checkpoint for all KUTs together).

  Raises:
    PeatError: as :func:`playback`; no spec or a repeated spec.
    CheckpointError: as :func:`playback`.
  """
  specs = _check_specs(kut_specs)
  if not isinstance(prefetch, int) or prefetch < 0:
    raise PeatError(f"prefetch must be an int >= 0 (checkpoints restored "
                    f"ahead); got {prefetch!r}")
  say = progress or (lambda s: None)
  plans = {k: playback_plan(golden_dir, k, campaign_dir, steps)
           for k in specs}
  ckpt, path, steps, _ = plans[specs[0]]  # the same for every KUT
  todo = {k: plan[3] for k, plan in plans.items()}
  play = [s for s in steps if any(s in todo[k] for k in specs)]
  group = None
  timings = []
  loader = _Prefetcher(ckpt, task, play, prefetch)
  try:
    for _ in play:
      t0 = time.perf_counter()
      s, state = loader.next()
      if group is None:
        group = PlayerGroup(task, specs, state,
                            task.batch_at(int(state.data_position)),
                            select=select)
      recs = group.play(s, state)
      for k in specs:
        if s in todo[k]:
          append_records(path, recs[k])
      timings.append(time.perf_counter() - t0)
      for k in specs:
        if s in todo[k]:
          say(_step_line(s, recs[k], timings[-1], len(specs) > 1))
  finally:
    loader.close()
  for s in steps:
    for k in specs:
      if s not in todo[k]:
        who = f" {k}" if len(specs) > 1 else ""
        say(f"playback step {s}{who}: done before, skipped")
  return {k: playback_result(
      path, steps, k,
      group.players[k].site_names if group else None, timings)
          for k in specs}


def _step_line(step: int, recs: list[dict], seconds: float,
               named: bool) -> str:
  """The progress line of one KUT at one checkpoint."""
  sites, eff = recs[:-1], recs[-1]
  worst = max(sites, key=lambda r: (
      {"fail": 2, "warn": 1, "pass": 0}[r["diagnosis"]["verdict"]]))
  who = f" {eff['kut']}" if named else ""
  return (f"playback step {step}{who}: {len(sites)} sites, worst "
          f"{worst['diagnosis']['model']} ({worst['diagnosis']['verdict']}) "
          f"at {worst['site']}; loss {eff['loss_golden']:.6g} -> "
          f"{eff['loss_kut']:.6g} ({seconds:.2f} s)")
