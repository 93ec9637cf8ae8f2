"""Playback FI, runtime FI and a one-call check in worker processes.

The drivers of process isolation (:mod:`peat_jax.profiler.isolation._isolate`): each
unit of work (a checkpoint, a frequency) runs in a :class:`Worker`; a worker
that crashes, hangs or runs out of memory becomes a finding in
``crashes.msgpack`` and a fresh worker goes on."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterator, Sequence

from peat_jax.profiler import files as _files
from peat_jax.profiler import golden as _golden
from peat_jax.profiler import playback_fi as _playback_fi
from peat_jax.profiler import runtime_fi as _runtime_fi
from peat_jax.core import PeatError
from peat_jax.profiler.files import (
    RUNTIME_FILE, append_records, of_campaign, read_records, record_backward,
    rewrite_records, tag_backward)
from peat_jax.kernels import kut as _kut
from peat_jax.profiler.isolation._isolate import (
    CRASH_FILE, Death, Limits, MEMORY_LIMIT_MB, STARTUP_S, TIMEOUT_S,
    TaskFactory, Worker, _TMP_DIR)


# --------------------------------------------------------------- findings


def finding_record(death: Death, kut_spec: str, phase: str, *,
                   step: int | None = None, site: str | None = None,
                   frequency: str | None = None,
                   note: str = "", backward: str = "golden") -> dict:
  """The record of a crash or hang finding (``crashes.msgpack``).

  Args:
    death: how the worker died.
    kut_spec: the KUT.
    phase: ``"playback"`` or ``"runtime"``.
    step: the checkpoint step (playback).
    site: the attributed site, or None.
    frequency: the runtime FI frequency (runtime).
    note: appended to the message.
    backward: the campaign's ``backward`` setting (stored when ``"kut"``).

  Returns:
    ``{"kind", "phase", "kut", "step", "site", "frequency", "signal",
    "timeout_s", "message"[, "backward"]}``.
  """
  return tag_backward(
      {"kind": death.kind, "phase": phase, "kut": kut_spec,
       "step": None if step is None else int(step), "site": site,
       "frequency": frequency, "signal": death.signal,
       "timeout_s": death.timeout_s, "message": death.message + note},
      backward)


def read_findings(campaign_dir: str | os.PathLike,
                  kut_spec: str | None = None,
                  backward: str | None = None) -> list[dict]:
  """The crash and hang findings of a campaign directory (of one KUT).

  Args:
    campaign_dir: the campaign directory.
    kut_spec: only this KUT's (None: every KUT's).
    backward: only those of this ``backward`` setting (None: both).
  """
  path = os.path.join(os.fspath(campaign_dir), CRASH_FILE)
  return [r for r in read_records(path)
          if (kut_spec is None or r.get("kut") == kut_spec)
          and (backward is None or record_backward(r) == backward)]


def _factory_tuple(factory: TaskFactory) -> tuple:
  if not isinstance(factory, TaskFactory):
    raise PeatError(f"isolation needs a peat.TaskFactory to rebuild the task "
                    f"in a worker process, got {type(factory).__name__}")
  return (factory.module, factory.function, dict(factory.kwargs or {}))


def _register_builtin(kut_spec: str) -> None:
  """In a worker: registers the built-in specs a fresh process lacks.

  ``torch:*`` specs are registered by importing the PyTorch bridge (the
  parent imported it). A KUT the user registered with ``register_kut`` in
  the parent is unknown in a worker unless the task factory's module
  registers it on import.
  """
  if kut_spec.startswith("torch:"):
    importlib.import_module("peat_jax.bridges")


# --------------------------------------------------------------- playback


def play_steps(factory: tuple, ckpt: str, kut: _kut.CheckedSpec, select: Any,
               steps: Sequence[int], invariance: bool = False,
               records_path: str | None = None,
               replay_golden_step: bool = False) -> Iterator[tuple]:
  """Worker job: the records of each step, by a :class:`Player` that
  carries the port probes of the campaign's steps recorded in
  ``records_path`` (a worker started after a kill or a crash)."""
  _register_builtin(kut.name)
  task = TaskFactory(*factory).build()
  player = None
  with _golden.StateReader(ckpt, task) as reader:
    for s in steps:
      yield ("start", s)
      state = reader.restore(s)
      if player is None:
        player = _playback_fi.Player(
            task, kut, state, task.batch_at(int(state.data_position)),
            select=select, backward=kut.backward, invariance=invariance,
            golden_steps=None if replay_golden_step else
            _golden.stored_golden_steps(ckpt, steps))
        if records_path is not None:
          player.resume_probes(_playback_fi.campaign_records(
              records_path, kut.name, kut.backward))
        yield ("sites", list(player.site_names))
        player.compile(state)  # everything but the KUT's run: no hang yet
        yield ("warm",)
      yield ("done", s, player.play(s, state))


def _attribute(factory: tuple, ckpt: str, kut: _kut.CheckedSpec, step: int,
               sites: Sequence[str] | None, death: Death, limits: Limits,
               say: Callable[[str], None]) -> list[dict]:
  """Findings of a crashed step: one site at a time in fresh workers."""
  tag = dict(backward=kut.backward)
  if not sites:
    return [finding_record(death, kut.name, "playback", step=step,
                           note=" (before the sites were known)", **tag)]
  if len(sites) == 1:
    return [finding_record(death, kut.name, "playback", step=step,
                           site=sites[0], **tag)]
  out = []
  for name in sites:
    say(f"playback step {step}: {death.kind}; replaying site {name} alone")
    w = Worker(__name__, "play_steps",
               dict(factory=factory, ckpt=ckpt, kut=kut,
                    select=[name], steps=[step]), limits,
               what="step")
    with contextlib.closing(w.events()) as events:
      for _ in events:
        pass
    if w.death is not None:
      out.append(finding_record(w.death, kut.name, "playback", step=step,
                                site=name, **tag))
  if not out:
    out = [finding_record(
        death, kut.name, "playback", step=step,
        note=f"; no selected site alone reproduces it (of {len(sites)}: it "
        "needs several together)", **tag)]
  return out


def isolated_playback(factory: TaskFactory, golden_dir: str | os.PathLike,
                      kut: _kut.CheckedSpec, *,
                      campaign_dir: str | os.PathLike | None = None,
                      steps: Sequence[int] | None = None,
                      select: str | Sequence[str] | None = None,
                      timeout_s: float = TIMEOUT_S,
                      startup_s: float = STARTUP_S,
                      memory_limit_mb: int | None = MEMORY_LIMIT_MB,
                      progress: Callable[[str], None] | None = None,
                      invariance: bool = False,
                      replay_golden_step: bool = False
                      ) -> _playback_fi.PlaybackResult:
  """Playback FI (as :func:`peat_jax.playback`) in worker processes.

  One worker plays the checkpoints in order and sends each one's records;
  the parent appends them to ``playback.msgpack``. When the worker crashes,
  hangs or runs out of memory at a checkpoint, the crash is attributed to
  sites (one at a time, in fresh workers), findings go to
  ``crashes.msgpack``, and a fresh worker goes on with the next checkpoint.
  Steps with records or findings are skipped when run again.

  Args:
    factory: rebuilds the golden run's task in a worker.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut: the KUT, checked for its ``backward`` setting
      (``kernels.checked``, at the campaign's entry; workers get it as is).
    campaign_dir: where the record files go (default: ``golden_dir``'s
      parent).
    steps: checkpoint steps (default: all saved but the last).
    select: narrow the spec's sites (``fnmatch`` pattern or names).
    timeout_s: time limit of one checkpoint.
    startup_s: extra time for a worker's first checkpoint.
    memory_limit_mb: a worker's resident memory limit (None: none).
    progress: called with one line per step.
    invariance: as for :func:`peat_jax.playback`.
    replay_golden_step: as for :func:`peat_jax.playback`.

  Returns:
    The :class:`peat_jax.PlaybackResult` of the steps that completed
    (findings: :func:`read_findings`).

  Raises:
    PeatError: bad spec or steps, or a worker error that is not a crash,
      hang or out-of-memory (e.g. the KUT selects no site).
  """
  say = progress or (lambda s: None)
  fac = _factory_tuple(factory)
  kut_spec, backward = kut.name, kut.backward  # the records' keys
  limits = Limits(timeout_s, startup_s, memory_limit_mb)
  ckpt, path, steps, todo = _playback_fi.playback_plan(golden_dir, kut_spec,
                                                    campaign_dir, steps,
                                                    backward)
  crash_path = os.path.join(os.path.dirname(path), CRASH_FILE)
  hit = {r["step"] for r in read_records(crash_path)
         if of_campaign(r, kut_spec, backward)
         and r.get("phase") == "playback"}
  done_before = [s for s in steps if s not in todo and s not in hit]
  todo = [s for s in todo if s not in hit]
  sites = None
  while todo:
    w = Worker(__name__, "play_steps",
               dict(factory=fac, ckpt=ckpt, kut=kut, select=select,
                    steps=list(todo), invariance=invariance,
                    records_path=path,
                    replay_golden_step=replay_golden_step), limits,
               what="step")
    t0 = time.perf_counter()
    with contextlib.closing(w.events()) as events:
      for event in events:
        if event[0] == "sites":
          sites = event[1]
        elif event[0] == "start":
          t0 = time.perf_counter()
        elif event[0] == "done":
          _, s, recs = event
          append_records(path, recs)
          todo.remove(s)
          say(_playback_fi.step_line(s, recs, time.perf_counter() - t0)[:-1]
              + ", isolated)")
    if w.death is None:
      if todo:
        raise PeatError(f"the playback worker ended without playing steps "
                        f"{todo}; expected every step or a crash")
      break
    s = w.death.unit
    if s is None:
      raise PeatError(f"the playback worker died before playing a step: "
                      f"{w.death.message}")
    say(f"playback step {s}: {w.death.kind} ({w.death.message})")
    found = _attribute(fac, ckpt, kut, s, sites, w.death, limits, say)
    append_records(crash_path, found)
    say(f"playback step {s}: recorded {len(found)} {w.death.kind} "
        f"finding(s): " + ", ".join(str(f["site"]) for f in found))
    todo = todo[todo.index(s) + 1:]
  for s in steps:
    if s in hit:
      say(f"playback step {s}: crashed or hung before, skipped")
    elif s in done_before:
      say(f"playback step {s}: done before, skipped")
  return _playback_fi.playback_result(path, steps, kut_spec, sites,
                                   backward=backward)


# ---------------------------------------------------------------- runtime


def run_frequencies(factory: tuple, golden_dir: str, kut: _kut.CheckedSpec,
                    frequencies: Sequence[str], steps: int, start_step: int,
                    seeds: Sequence[int], select: Any,
                    tmp_dir: str) -> Iterator[tuple]:
  """Worker job: runtime FI one frequency at a time into ``tmp_dir``."""
  _register_builtin(kut.name)
  task = TaskFactory(*factory).build()
  path = os.path.join(tmp_dir, RUNTIME_FILE)
  for f in frequencies:
    yield ("start", f)
    before = len(read_records(path))
    lines: list[str] = []
    _runtime_fi.runtime(task, golden_dir, kut, frequencies=[f], steps=steps,
                        start_step=start_step, seeds=seeds,
                        campaign_dir=tmp_dir, select=select,
                        progress=lines.append, backward=kut.backward)
    for line in lines:
      yield ("say", line + " (isolated)")
    yield ("done", f, read_records(path)[before:])


def isolated_runtime(factory: TaskFactory, golden_dir: str | os.PathLike,
                     kut: _kut.CheckedSpec, *,
                     frequencies: Sequence[str] = ("every", "every_4",
                                                   "fraction_0.25"),
                     steps: int = 50, start_step: int = 0,
                     seeds: Sequence[int] = (1, 2),
                     campaign_dir: str | os.PathLike | None = None,
                     select: str | Sequence[str] | None = None,
                     timeout_s: float = TIMEOUT_S,
                     startup_s: float = STARTUP_S,
                     memory_limit_mb: int | None = MEMORY_LIMIT_MB,
                     progress: Callable[[str], None] | None = None
                     ) -> _runtime_fi.RuntimeResult:
  """Runtime FI (as :func:`peat_jax.runtime`) in worker processes.

  A worker runs the frequencies in order into a scratch directory and sends
  each one's new records; the parent appends them to ``runtime.msgpack``.
  A frequency whose worker crashes, hangs or runs out of memory is recorded
  as crashed (in ``runtime.msgpack`` and as a finding in
  ``crashes.msgpack``), and a fresh worker goes on with the next one.

  Args:
    factory: rebuilds the golden run's task in a worker.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut: the KUT, checked for its ``backward`` setting
      (``kernels.checked``, at the campaign's entry; workers get it as is).
    frequencies: as for :func:`peat_jax.runtime`.
    steps: runtime FI steps.
    start_step: the golden checkpoint to start from.
    seeds: seeds of the golden seed-to-seed spread.
    campaign_dir: where the record files go (default: ``golden_dir``'s
      parent).
    select: narrow the spec's sites.
    timeout_s: time limit of one frequency.
    startup_s: extra time for a worker's first frequency (it also trains
      the golden trajectory, the spread and the bf16 proxy when they are
      missing).
    memory_limit_mb: a worker's resident memory limit (None: none).
    progress: called with one line per frequency.

  Returns:
    A :class:`peat_jax.RuntimeResult` (crashed runs: ``_runtime_fi.runtime_result``).

  Raises:
    PeatError: unknown frequency, or a worker error that is not a crash,
      hang or out-of-memory.
  """
  kut_spec, backward = kut.name, kut.backward  # the records' keys
  say = progress or (lambda s: None)
  fac = _factory_tuple(factory)
  limits = Limits(timeout_s, startup_s, memory_limit_mb)
  labels = {f: _runtime_fi.parse_frequency(f)[1] for f in frequencies}
  golden_dir, _, campaign_dir = _files.campaign_dirs(golden_dir,
                                                      campaign_dir)
  path = os.path.join(campaign_dir, RUNTIME_FILE)
  crash_path = os.path.join(campaign_dir, CRASH_FILE)

  def mine() -> list[dict]:
    return [r for r in read_records(path) if of_campaign(r, kut_spec, backward)
            and r.get("n") == steps and r.get("start") == start_step]

  byname = {r["name"]: r for r in mine()}

  def keep(recs: Sequence[dict]) -> None:
    new = [r for r in recs if r["name"] not in byname]
    if new:
      append_records(path, new)
      byname.update((r["name"], r) for r in new)

  remaining = [f for f in frequencies if f not in byname]
  scratch = os.path.join(campaign_dir, _TMP_DIR)
  shutil.rmtree(scratch, ignore_errors=True)  # left by a killed campaign
  try:
    while remaining:
      os.makedirs(scratch, exist_ok=True)
      tmp = tempfile.mkdtemp(dir=scratch)
      rewrite_records(os.path.join(tmp, RUNTIME_FILE), list(byname.values()))
      w = Worker(__name__, "run_frequencies",
                 dict(factory=fac, golden_dir=golden_dir, kut=kut,
                      frequencies=list(remaining), steps=steps,
                      start_step=start_step, seeds=list(seeds), select=select,
                      tmp_dir=tmp), limits,
                 what="frequency")
      with contextlib.closing(w.events()) as events:
        for event in events:
          if event[0] == "say":
            say(event[1])
          elif event[0] == "done":
            keep(event[2])
            remaining.remove(event[1])
      if w.death is None:
        if remaining:
          raise PeatError(f"the runtime worker ended without running "
                          f"{remaining}; expected every frequency or a crash")
        break
      f = w.death.unit
      if f is None:
        raise PeatError(f"the runtime worker died before running a "
                        f"frequency: {w.death.message}")
      # The references (golden trajectory, spread, bf16 proxy) it finished
      # before dying are good.
      keep([r for r in read_records(os.path.join(tmp, RUNTIME_FILE))
            if r["name"] in _runtime_fi.REFERENCE_RUNS])
      d = w.death
      keep([tag_backward(
          {"kut": kut_spec, "n": steps, "start": start_step, "name": f,
           "loss": [], "label": labels[f], "diverged_at": None,
           "reason": f"{d.kind}: {d.message}",
           "crash": {"kind": d.kind, "signal": d.signal,
                     "timeout_s": d.timeout_s, "message": d.message}},
          backward)])
      append_records(crash_path, [finding_record(d, kut_spec, "runtime",
                                                 frequency=f,
                                                 backward=backward)])
      say(f"runtime {labels[f]}: {d.kind} ({d.message})")
      remaining = remaining[remaining.index(f) + 1:]
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return _runtime_fi.runtime_result(list(byname.values()), frequencies, steps,
                                 start_step)


# ------------------------------------------------------------ one kernel


def _probe(kut_spec: _kut.KutSpec) -> Iterator[tuple]:
  """Worker job: the KUT once on small seeded inputs of its site kernel."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax import lax  # pylint: disable=g-import-not-at-top
  _register_builtin(kut_spec.spec)
  spec = kut_spec
  fn = _kut.kut_callable(spec)
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  if spec.site_kernel == "dot_general":
    a = jax.random.normal(k1, (8, 16), jnp.float32)
    b = jax.random.normal(k2, (16, 4), jnp.float32)
    f = jax.jit(lambda x, y: fn(
        x, y, dimension_numbers=(((1,), (0,)), ((), ())), precision=None,
        preferred_element_type=None, out_sharding=None))
    args = (a, b)
  elif spec.site_kernel == "conv_general_dilated":
    x = jax.random.normal(k1, (2, 6, 6, 3), jnp.float32)
    w = jax.random.normal(k2, (3, 3, 3, 4), jnp.float32)
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
    f = jax.jit(lambda x, w: fn(
        x, w, window_strides=(1, 1), padding=((1, 1), (1, 1)),
        lhs_dilation=(1, 1), rhs_dilation=(1, 1), dimension_numbers=dn,
        feature_group_count=1, batch_group_count=1, precision=None,
        preferred_element_type=None, out_sharding=None))
    args = (x, w)
  else:
    raise PeatError(f"check_kut runs dot_general and conv_general_dilated "
                    f"KUTs; {spec.spec!r} replaces {spec.site_kernel!r}")
  compiled = f.lower(*args).compile()
  yield ("warm",)
  yield ("start", spec.spec)
  yield ("done", spec.spec, float(jnp.sum(compiled(*args))))


def check_kut(kut_spec: "str | _kut.KutSpec", *, timeout_s: float = 60.0,
              startup_s: float = 120.0,
              memory_limit_mb: int | None = 2048) -> dict | None:
  """Runs a KUT once on small inputs in a worker: does it crash or hang?

  A cheap check before a campaign (and what the isolation tests use).

  Args:
    kut_spec: a ``dot_general`` or ``conv_general_dilated`` KUT spec.
    timeout_s: time limit of the call.
    startup_s: extra time for start-up and compilation.
    memory_limit_mb: the worker's resident memory limit (None: none).

  Returns:
    None when the call returned, else the finding record (``phase``
    ``"check"``).

  Raises:
    PeatError: unknown spec or a KUT of another kernel.
  """
  spec = _kut.checked(kut_spec).spec
  w = Worker(__name__, "_probe", {"kut_spec": spec},
             Limits(timeout_s, startup_s, memory_limit_mb), what="call of")
  with contextlib.closing(w.events()) as events:
    for _ in events:
      pass
  if w.death is None:
    return None
  return finding_record(w.death, spec.spec, "check")
