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
:class:`peat_jax.profiler.golden._golden.StateReader` (tensorstore, no per-array Orbax
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

import numpy as np

from peat_jax.profiler import files as _files
from peat_jax import detector as _detector
from peat_jax.kernels import kut as _kut
from peat_jax.profiler import golden as _golden
from peat_jax.profiler.golden import saved_steps
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.profiler.files import (
    PLAYBACK_FILE, append_records, of_campaign, read_records,
    rewrite_records)
from peat_jax.profiler.golden import TrainTask
from peat_jax.profiler.playback_fi._player import PlayerGroup
from peat_jax.profiler.playback_fi._player import check_specs



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


def playback_plan(golden_dir: str | os.PathLike, kut_spec: str,
                  campaign_dir: str | os.PathLike | None,
                  steps: Sequence[int] | None,
                  backward: str = "golden") -> tuple[str, str, list, list]:
  """Resolves paths and the steps to play; drops partial steps (resume).

  Args:
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: the KUT spec whose records count.
    campaign_dir: where ``playback.msgpack`` goes (default: the golden
      directory's parent).
    steps: the checkpoint steps wanted (default: all saved but the last).
    backward: the ``backward`` setting whose records count.

  Returns:
    ``(checkpoint_dir, record_path, steps, todo)``: ``todo`` are the steps
    without a complete record set (an effect record) of this KUT.

  Raises:
    PeatError: a wanted step is not saved.
  """
  _, ckpt, campaign_dir = _files.campaign_dirs(golden_dir, campaign_dir)
  path = os.path.join(campaign_dir, PLAYBACK_FILE)
  return (ckpt, path,
          *plan_steps(saved_steps(ckpt), ckpt, path, kut_spec, steps,
                      backward))


def plan_steps(saved: Sequence[int], ckpt: str, path: str, kut_spec: str,
               steps: Sequence[int] | None,
               backward: str = "golden") -> tuple[list[int], list[int]]:
  """The steps to play and those still to do; drops partial steps (resume).

  Args:
    saved: the golden run's saved steps.
    ckpt: its checkpoint directory (named in errors).
    path: the record file; partial steps of ``kut_spec`` (no effect
      record) are removed from it.
    kut_spec: the KUT spec whose records count.
    steps: the steps wanted (default: all saved but the last).
    backward: the ``backward`` setting whose records count (records of
      the other setting are another campaign's).

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
          and of_campaign(r, kut_spec, backward)}
  kept = [r for r in old if not of_campaign(r, kut_spec, backward)
          or r.get("step") in done]
  if len(kept) != len(old):
    rewrite_records(path, kept)
  return steps, [s for s in steps if s not in done]


def campaign_records(path: str, kut_spec: str,
                     backward: str = "golden") -> list[dict]:
  """The records of one KUT and backward setting in a record file (the
  complete steps a resumed playback keeps), in file order."""
  return [r for r in read_records(path) if of_campaign(r, kut_spec, backward)]


def playback_result(path: str, steps: Sequence[int], kut_spec: str,
                    site_order: Sequence[str] | None = None,
                    timings: Sequence[float] = (),
                    backward: str = "golden") -> PlaybackResult:
  """Reads a playback record file back into a :class:`PlaybackResult`.

  Args:
    path: ``playback.msgpack``.
    steps: the steps to include.
    kut_spec: the KUT whose records are read.
    site_order: execution order of the sites (default: first appearance).
    timings: wall seconds per played checkpoint (the first is compile).
    backward: the ``backward`` setting whose records are read.

  Returns:
    A :class:`PlaybackResult` sorted by (step, execution order); the
    records of a site with several outputs (``"output"``) follow their
    site in output order.
  """
  allrecs = [r for r in campaign_records(path, kut_spec, backward)
             if r.get("step") in set(steps)]
  site_recs = [r for r in allrecs if r.get("kind") == "site"]
  effects = sorted((r for r in allrecs if r.get("kind") == "effect"),
                   key=lambda r: r["step"])
  order = record_order(site_order or [], site_recs)
  rank = {n: i for i, n in enumerate(order)}
  site_recs.sort(key=lambda r: (r["step"], rank[r["site"]]))
  sps = float(np.mean(timings[1:])) if len(timings) > 1 else math.nan
  return PlaybackResult(site_recs, effects, order,
                        _detector.localize(site_recs, order), sps)


def record_order(site_order: Sequence[str], records: Sequence[dict]
                 ) -> list[str]:
  """The record names of ``records`` in execution order.

  Args:
    site_order: site names in execution order.
    records: site records; a site with several outputs has one record per
      output (``"output": i``, named ``<site>/d<i>``), which follow the
      site's place in output order; names in neither come last, in order
      of appearance.

  Returns:
    Every record name once.
  """
  outputs: dict[str, list] = {}
  for r in records:
    if "output" in r:
      base = r["site"][:-len(f"/d{r['output']}")]
      outputs.setdefault(base, [])
      if (r["output"], r["site"]) not in outputs[base]:
        outputs[base].append((r["output"], r["site"]))
  order: list[str] = []
  for name in site_order:
    order += ([n for _, n in sorted(outputs[name])] if name in outputs
              else [name])
  seen = set(order)
  for r in records:
    if r["site"] not in seen:
      order.append(r["site"])
      seen.add(r["site"])
  return order


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


def playback(task: TrainTask, golden_dir: str | os.PathLike,
             kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec",
             *, campaign_dir: str | os.PathLike | None = None,
             steps: Sequence[int] | None = None,
             select: str | Sequence[str] | None = None,
             progress: Callable[[str], None] | None = None,
             prefetch: int = 1,
             backward: str = "golden",
             invariance: bool = False,
             replay_golden_step: bool = False) -> PlaybackResult:
  """Playback FI of a KUT at every saved checkpoint of a golden run.

  For each saved step s (all but the last, or ``steps``): restore, and let a
  :class:`Player` run the step with the KUT substituted at every selected
  site and the golden kernel tapped beside it on the same inputs (jitted
  once). The golden step's loss and parameters come from the golden run
  where it stored them (``golden_train(store_golden_step=True)``, the
  default, and ``backward="golden"``); otherwise the golden step is
  replayed beside the KUT's, the KUT tapped in it. Records are appended
  per checkpoint, so a killed playback resumes. The records do not depend
  on ``prefetch``.

  Args:
    task: the golden run's task.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: a spec of :func:`peat_jax.kernels.kut.resolve_kut` (a
      string, parsed, or checked by ``kernels.checked``: used as is).
    campaign_dir: where ``playback.msgpack`` goes (default: ``golden_dir``'s
      parent). Finished steps found there are skipped.
    steps: checkpoint steps to play back (default: all saved but the last).
    select: narrow the spec's sites: an ``fnmatch`` pattern or site names.
    progress: called with one line per step.
    prefetch: checkpoints restored ahead in a background thread while one
      plays (0: restore each in turn, in this thread).
    backward: ``"golden"`` (default: the golden kernel at the backward
      sites, the forward-only question) or ``"kut"``: the KUT's VJP runs at
      the backward sites of the selected forward sites, which are recorded
      too (a signature per cotangent against the golden VJP and a float64
      reference VJP). Records carry the setting (``"backward": "kut"``;
      none for ``"golden"``), so the two never mix.
    invariance: also probe the KUT at each forward site and composite
      backward site for stale outputs (an earlier call's or checkpoint's
      values), mutated inputs, ignored inputs and batch variance; records
      get ``"invariance"`` facts and the diagnosis names ``stale``,
      ``input_mutation``, ``input_insensitive`` or ``batch_variance`` where
      they hold (docs/detector.md). Six more KUT calls per site and step.
    replay_golden_step: replay the golden step at every checkpoint even
      where the golden run stored it (the records of a campaign made
      before golden steps were stored; effect records then lack
      ``"golden_step": "stored"``).

  Returns:
    A :class:`PlaybackResult`.

  Raises:
    PeatError: unknown spec, no selected site, a step that is not saved, a
      negative ``prefetch``, a bad ``backward``, a backward site the KUT's
      VJP cannot run at (named).
    CheckpointError: a checkpoint that cannot be restored (raised when its
      turn comes; the steps before it are recorded).
  """
  _core.ensure_compilation_cache()  # compile once, reuse after
  kut = _kut.checked(kut_spec, backward)
  return playback_many(task, golden_dir, [kut],
                       campaign_dir=campaign_dir, steps=steps, select=select,
                       progress=progress, prefetch=prefetch,
                       backward=backward, invariance=invariance,
                       replay_golden_step=replay_golden_step)[kut.name]


def playback_many(task: TrainTask, golden_dir: str | os.PathLike,
                  kut_specs: "Sequence[str | _kut.KutSpec | _kut.CheckedSpec]",
                  *,
                  campaign_dir: str | os.PathLike | None = None,
                  steps: Sequence[int] | None = None,
                  select: str | Sequence[str] | None = None,
                  progress: Callable[[str], None] | None = None,
                  prefetch: int = 1,
                  backward: str = "golden",
                  invariance: bool = False,
                  replay_golden_step: bool = False
                  ) -> dict[str, PlaybackResult]:
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
    campaign_dir, steps, select, progress, prefetch, backward,
      invariance, replay_golden_step: as :func:`playback` (one setting
      for every KUT).

  Returns:
    KUT spec -> its :class:`PlaybackResult` (``seconds_per_step`` is the
    wall time of a checkpoint for all KUTs together).

  Raises:
    PeatError: as :func:`playback`; no spec or a repeated spec.
    CheckpointError: as :func:`playback`.
  """
  _core.ensure_compilation_cache()  # compile once, reuse after
  parsed = check_specs(kut_specs, backward)
  specs = [k.name for k in parsed]  # records and results are keyed by them
  if not isinstance(prefetch, int) or prefetch < 0:
    raise PeatError(f"prefetch must be an int >= 0 (checkpoints restored "
                    f"ahead); got {prefetch!r}")
  if not isinstance(invariance, bool):
    raise PeatError(f"invariance must be True (probe the KUT for stale "
                    f"outputs, mutated or ignored inputs, batch variance) or "
                    f"False; got {invariance!r}")
  say = progress or (lambda s: None)
  plans = {k: playback_plan(golden_dir, k, campaign_dir, steps, backward)
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
        group = PlayerGroup(task, parsed, state,
                            task.batch_at(int(state.data_position)),
                            select=select, backward=backward,
                            invariance=invariance,
                            golden_steps=None if replay_golden_step else
                            _golden.stored_golden_steps(ckpt, play))
        for k, player in group.players.items():
          player.resume_probes(campaign_records(path, k, backward))
      recs = group.play(s, state)
      for k in specs:
        if s in todo[k]:
          append_records(path, recs[k])
      timings.append(time.perf_counter() - t0)
      for k in specs:
        if s in todo[k]:
          say(step_line(s, recs[k], timings[-1],
                        kut=k if len(specs) > 1 else None))
  finally:
    loader.close()
  for s in steps:
    for k in specs:
      if s not in todo[k]:
        who = f" {k}" if len(specs) > 1 else ""
        say(f"playback step {s}{who}: done before, skipped")
  return {k: playback_result(
      path, steps, k,
      group.players[k].site_names if group else None, timings, backward)
          for k in specs}


def step_line(step: int, recs: Sequence[dict], seconds: float, *,
              kut: str | None = None, where: str = "") -> str:
  """The progress line of one KUT at one checkpoint (every playback driver).

  Args:
    step: the checkpoint's step.
    recs: that step's records of one KUT: site records, then its effect.
    seconds: wall time of the checkpoint.
    kut: named in the line when given (several KUTs played together).
    where: after the step, e.g. ``" on TFRT_CPU_0"`` (scale-out).

  Returns:
    ``"playback step <s>[ <kut>]<where>: <n> sites[ (<f> fwd, <b> bwd)],
    worst <model> (<verdict>) at <site>; loss <golden> -> <kut> (<seconds>
    s)"``; the fwd/bwd counts appear when backward sites are recorded.
  """
  sites, eff = recs[:-1], recs[-1]
  worst = max(sites, key=lambda r: _detector.severity(
      r["diagnosis"]["verdict"]))
  who = f" {kut}" if kut else ""
  nb = sum(r["phase"] == "bwd" for r in sites)
  split = f" ({len(sites) - nb} fwd, {nb} bwd)" if nb else ""
  return (f"playback step {step}{who}{where}: {len(sites)} sites{split}, worst "
          f"{worst['diagnosis']['model']} ({worst['diagnosis']['verdict']}) "
          f"at {worst['site']}; loss {eff['loss_golden']:.6g} -> "
          f"{eff['loss_kut']:.6g} ({seconds:.2f} s)")
