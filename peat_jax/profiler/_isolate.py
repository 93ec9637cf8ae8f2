"""Process isolation: a KUT's playback and runtime FI in worker processes.

A kernel under test may segfault, abort, hang or exhaust memory. Run in the
campaign's own process it would take the campaign down with it; here it runs
in a worker process (``python -m peat_jax.profiler._isolate_worker``) with limits:

* a time limit per checkpoint (playback) or per frequency (runtime FI),
  ``timeout_s``; the first unit of each worker gets ``startup_s`` more, for
  importing, tracing and compiling (so a KUT that hangs in a worker's first
  unit is caught after ``timeout_s + startup_s``: give ``startup_s`` what
  compilation needs on the machine, not more);
* a memory limit on the worker's resident memory (polled; the worker is
  killed when it grows past it).

When the worker dies by a signal, runs past its time limit, runs out of
memory or passes its memory limit, the campaign records a *finding* and goes
on with the next checkpoint (or frequency) in a fresh worker:

  {"kind": "crash"|"hang", "phase": "playback"|"runtime", "kut", "step",
   "site", "frequency", "signal", "timeout_s", "message"}

in ``<campaign>/crashes.msgpack``. A playback crash is attributed to sites by
replaying that step with one selected site at a time, each in a fresh worker
(``site`` None: no single site reproduces it alone). A crashed runtime
frequency gets a ``runtime.msgpack`` record too (``crash`` set, empty
``loss``), so a restarted campaign skips it.

The worker rebuilds the task from a picklable :class:`TaskFactory`
(``peat_jax`` never imports the model zoo) and sends records back; only the
parent writes campaign files (one writer), so a campaign killed at any point
resumes exactly like one without isolation.

>>> factory = TaskFactory("peat_jax.models", "get_task", {"name": "cnn"})
>>> pb = isolated_playback(factory, "runs/c/golden", "native:matmul:hang",
...                        campaign_dir="runs/c", timeout_s=60)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import select as _select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

from peat_jax.profiler import _golden as _golden
from peat_jax.profiler import _playback as _playback
from peat_jax.profiler import _runtime as _runtime
from peat_jax.core._errors import PeatError
from peat_jax.profiler._records import RUNTIME_FILE
from peat_jax.profiler._records import append_records
from peat_jax.profiler._records import read_records
from peat_jax.profiler._records import rewrite_records
from peat_jax.profiler._train_state import TrainTask

#: Findings (crash and hang records) of a campaign directory.
CRASH_FILE = "crashes.msgpack"
#: Default time limit of one checkpoint / frequency, seconds.
TIMEOUT_S = 600.0
#: Default extra time of a worker's first unit (import, trace, compile).
STARTUP_S = 900.0
#: Default limit of a worker's resident memory, MiB.
MEMORY_LIMIT_MB = 8192
_POLL_S = 0.05
_TMP_DIR = ".isolate"


class TaskFactory(NamedTuple):
  """A picklable recipe for a :class:`peat_jax.TrainTask`.

  A worker process calls ``module.function(**kwargs)`` to rebuild the task.

  Attributes:
    module: importable module name, e.g. ``"peat_jax.models"``.
    function: the function in it, e.g. ``"get_task"``.
    kwargs: its keyword arguments (picklable values).
  """

  module: str
  function: str
  kwargs: Mapping[str, Any] | None = None

  def build(self) -> TrainTask:
    """Imports the module and calls the function.

    Returns:
      The task.

    Raises:
      PeatError: the module or function does not exist, or the result is
        not a TrainTask.
    """
    try:
      fn = getattr(importlib.import_module(self.module), self.function)
    except (ImportError, AttributeError) as err:
      raise PeatError(
          f"task factory {self.module}.{self.function} cannot be imported "
          f"({err}); expected an importable module and function, e.g. "
          "TaskFactory('peat_jax.models', 'get_task', {'name': 'cnn'})"
      ) from err
    task = fn(**dict(self.kwargs or {}))
    if not isinstance(task, TrainTask):
      raise PeatError(f"task factory {self.module}.{self.function} returned "
                      f"{type(task).__name__}; expected a peat.TrainTask")
    return task


class Limits(NamedTuple):
  """Limits of a worker process.

  Attributes:
    timeout_s: seconds one checkpoint (or frequency) may take.
    startup_s: extra seconds for the first one in each worker (import,
      tracing, compilation).
    memory_limit_mb: resident memory a worker may use (None: no limit).
  """

  timeout_s: float = TIMEOUT_S
  startup_s: float = STARTUP_S
  memory_limit_mb: int | None = MEMORY_LIMIT_MB


class Death(NamedTuple):
  """How a worker died.

  Attributes:
    kind: ``"crash"`` (signal, out of memory, memory limit, exit) or
      ``"hang"`` (time limit).
    signal: the signal's name (``"SIGSEGV"``...) or None.
    timeout_s: the time limit that ran out (hangs), else None.
    message: what happened, for the user.
    unit: the unit of work in flight (a step or a frequency).
  """

  kind: str
  signal: str | None
  timeout_s: float | None
  message: str
  unit: Any


# ------------------------------------------------------------------ worker


def _rss_mb(pid: int) -> float:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) / 1024.0
  except (OSError, ValueError, IndexError):
    pass
  return 0.0


_NOISE = ("Current thread", "Thread 0x", "Extension modules",
          "<no Python frame>", "Stack (most recent")


def _tail(text: str, lines: int = 6, chars: int = 600) -> str:
  """The informative end of a worker's stderr (faulthandler noise and
  thread addresses dropped, so that messages repeat run to run)."""
  kept = []
  for line in text.splitlines():
    line = line.strip()
    if not line or line.startswith(_NOISE):
      continue
    if line.startswith("File \""):
      continue  # Python frames of the crash: jax internals, machine paths
    kept.append(line)
  return " | ".join(kept[-lines:])[-chars:]


class Worker:
  """One worker process running one job (a generator of events).

  Iterate :meth:`events` for the job's events; afterwards :attr:`death` is
  None (the job finished) or a :class:`Death`.
  """

  def __init__(self, module: str, function: str, kwargs: Mapping[str, Any],
               limits: Limits, *, what: str = "work"):
    """Starts the worker and hands it the job.

    Args:
      module: module of the job's generator function.
      function: its name.
      kwargs: its keyword arguments (picklable).
      limits: the worker's limits.
      what: what a unit of work is, for messages (``"step"``...).
    """
    self.limits = limits
    self.what = what
    self.death: Death | None = None
    job_r, job_w = os.pipe()
    msg_r, msg_w = os.pipe()
    self._stderr = tempfile.TemporaryFile()
    # The parent's import path, so that the worker imports the same peat_jax
    # and finds the task factory's module.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in sys.path if p and os.path.isdir(p)))
    self._proc = subprocess.Popen(
        [sys.executable, "-m", "peat_jax.profiler._isolate_worker", str(job_r),
         str(msg_w), str(os.getpid())],
        pass_fds=(job_r, msg_w), stdin=subprocess.DEVNULL,
        stdout=self._stderr, stderr=self._stderr, env=env)
    os.close(job_r)
    os.close(msg_w)
    self._msg = msg_r
    with os.fdopen(job_w, "wb") as f:
      f.write(pickle.dumps({"module": module, "function": function,
                            "kwargs": dict(kwargs)}))

  def _kill(self) -> None:
    if self._proc.poll() is None:
      self._proc.kill()
    self._proc.wait()

  def _stderr_text(self) -> str:
    self._stderr.seek(0)
    return self._stderr.read().decode("utf-8", "replace")

  def events(self) -> Iterator[tuple]:
    """Yields the job's events until it ends, fails or dies.

    Yields:
      Event tuples: ``("start", unit)``, ``("done", unit, payload)`` and
      whatever else the job yields. A job yields ``("warm",)`` when its
      start-up (compilation) is over: later units get ``timeout_s`` only.

    Raises:
      PeatError: the job raised an error that is not out-of-memory (a
        PeatError of the worker is re-raised as it is).
    """
    buf = b""
    started = time.monotonic()
    first = True
    unit = None
    deadline = started + self.limits.startup_s + self.limits.timeout_s
    limit_s = self.limits.startup_s + self.limits.timeout_s
    try:
      while True:
        now = time.monotonic()
        if now > deadline:
          self._kill()
          where = (f"{self.what} {unit}" if unit is not None
                   else "start-up")
          self.death = Death(
              "hang", None, round(limit_s, 3),
              f"no result for {where} within {limit_s:g} s (the time limit"
              + (", start-up and compilation included" if first else "")
              + "); the worker was killed", unit)
          return
        mem = self.limits.memory_limit_mb
        if mem is not None:
          rss = _rss_mb(self._proc.pid)
          if rss > mem:
            self._kill()
            self.death = Death(
                "crash", "SIGKILL", None,
                f"out of memory: the worker's resident memory reached "
                f"{rss:.0f} MiB, over the limit of {mem} MiB "
                f"(memory_limit_mb), during {self.what} {unit}; the worker "
                "was killed", unit)
            return
        ready, _, _ = _select.select([self._msg], [], [],
                                     min(_POLL_S, max(deadline - now, 0.0)))
        if ready:
          chunk = os.read(self._msg, 1 << 20)
          if not chunk:  # the worker exited
            self._proc.wait()
            self.death = self._exit_death(unit)
            return
          buf += chunk
        while len(buf) >= 8:
          n = struct.unpack(">Q", buf[:8])[0]
          if len(buf) < 8 + n:
            break
          event, buf = pickle.loads(buf[8:8 + n]), buf[8 + n:]
          kind = event[0]
          if kind == "end":
            self._proc.wait()
            return
          if kind == "oom":
            self._kill()
            self.death = Death("crash", None, None,
                               f"out of memory during {self.what} {unit}: "
                               f"{event[1]}", unit)
            return
          if kind == "error":
            self._kill()
            err, tb = event[1], event[2]
            if isinstance(err, PeatError):
              raise err
            raise PeatError(
                f"the worker process failed during {self.what} {unit}: "
                f"{err}\nworker traceback:\n{tb}")
          if kind == "warm":  # start-up over: the unit's own limit from now
            first = False
            limit_s = self.limits.timeout_s
            deadline = time.monotonic() + limit_s
          if kind == "start":
            if unit is not None:
              first = False
            unit = event[1]
            limit_s = self.limits.timeout_s + (
                self.limits.startup_s if first else 0.0)
            deadline = time.monotonic() + limit_s
          yield event
    finally:
      if self._proc.poll() is None:
        self._kill()
      os.close(self._msg)
      self._stderr.close()

  def _exit_death(self, unit) -> Death:
    rc = self._proc.returncode
    err = _tail(self._stderr_text())
    detail = f"; worker stderr: {err}" if err else ""
    if rc < 0:
      try:
        name = signal.Signals(-rc).name
      except ValueError:
        name = f"signal {-rc}"
      return Death("crash", name, None,
                   f"killed by {name} (signal {-rc}) during {self.what} "
                   f"{unit}{detail}", unit)
    return Death("crash", None, None,
                 f"the worker exited with status {rc} during {self.what} "
                 f"{unit} without a result{detail}", unit)


# --------------------------------------------------------------- findings


def finding_record(death: Death, kut_spec: str, phase: str, *,
                   step: int | None = None, site: str | None = None,
                   frequency: str | None = None,
                   note: str = "") -> dict:
  """The record of a crash or hang finding (``crashes.msgpack``).

  Args:
    death: how the worker died.
    kut_spec: the KUT.
    phase: ``"playback"`` or ``"runtime"``.
    step: the checkpoint step (playback).
    site: the attributed site, or None.
    frequency: the runtime FI frequency (runtime).
    note: appended to the message.

  Returns:
    ``{"kind", "phase", "kut", "step", "site", "frequency", "signal",
    "timeout_s", "message"}``.
  """
  return {"kind": death.kind, "phase": phase, "kut": kut_spec,
          "step": None if step is None else int(step), "site": site,
          "frequency": frequency, "signal": death.signal,
          "timeout_s": death.timeout_s, "message": death.message + note}


def read_findings(campaign_dir: str | os.PathLike,
                  kut_spec: str | None = None) -> list[dict]:
  """The crash and hang findings of a campaign directory (of one KUT)."""
  path = os.path.join(os.fspath(campaign_dir), CRASH_FILE)
  return [r for r in read_records(path)
          if kut_spec is None or r.get("kut") == kut_spec]


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


def play_steps(factory: tuple, ckpt: str, kut_spec: str, select: Any,
               steps: Sequence[int]) -> Iterator[tuple]:
  """Worker job: the records of each step, by a :class:`Player`."""
  _register_builtin(kut_spec)
  task = TaskFactory(*factory).build()
  player = None
  with _golden.StateReader(ckpt, task) as reader:
    for s in steps:
      yield ("start", s)
      state = reader.restore(s)
      if player is None:
        player = _playback.Player(task, kut_spec, state,
                                  task.batch_at(int(state.data_position)),
                                  select=select)
        yield ("sites", list(player.site_names))
        player.compile(state)  # everything but the KUT's run: no hang yet
        yield ("warm",)
      yield ("done", s, player.play(s, state))


def _step_line(s: int, recs: list[dict], seconds: float) -> str:
  sites, eff = recs[:-1], recs[-1]
  worst = max(sites, key=lambda r: (
      {"fail": 2, "warn": 1, "pass": 0}[r["diagnosis"]["verdict"]]))
  return (f"playback step {s}: {len(sites)} sites, worst "
          f"{worst['diagnosis']['model']} ({worst['diagnosis']['verdict']}) "
          f"at {worst['site']}; loss {eff['loss_golden']:.6g} -> "
          f"{eff['loss_kut']:.6g} ({seconds:.2f} s, isolated)")


def _attribute(factory: tuple, ckpt: str, kut_spec: str, step: int,
               sites: Sequence[str] | None, death: Death, limits: Limits,
               say: Callable[[str], None]) -> list[dict]:
  """Findings of a crashed step: one site at a time in fresh workers."""
  if not sites:
    return [finding_record(death, kut_spec, "playback", step=step,
                           note=" (before the sites were known)")]
  if len(sites) == 1:
    return [finding_record(death, kut_spec, "playback", step=step,
                           site=sites[0])]
  out = []
  for name in sites:
    say(f"playback step {step}: {death.kind}; replaying site {name} alone")
    w = Worker(__name__, "play_steps",
               dict(factory=factory, ckpt=ckpt, kut_spec=kut_spec,
                    select=[name], steps=[step]), limits, what="step")
    with contextlib.closing(w.events()) as events:
      for _ in events:
        pass
    if w.death is not None:
      out.append(finding_record(w.death, kut_spec, "playback", step=step,
                                site=name))
  if not out:
    out = [finding_record(
        death, kut_spec, "playback", step=step,
        note=f"; no selected site alone reproduces it (of {len(sites)}: it "
        "needs several together)")]
  return out


def isolated_playback(factory: TaskFactory, golden_dir: str | os.PathLike,
                      kut_spec: str, *,
                      campaign_dir: str | os.PathLike | None = None,
                      steps: Sequence[int] | None = None,
                      select: str | Sequence[str] | None = None,
                      timeout_s: float = TIMEOUT_S,
                      startup_s: float = STARTUP_S,
                      memory_limit_mb: int | None = MEMORY_LIMIT_MB,
                      progress: Callable[[str], None] | None = None
                      ) -> _playback.PlaybackResult:
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
    kut_spec: the KUT spec.
    campaign_dir: where the record files go (default: ``golden_dir``'s
      parent).
    steps: checkpoint steps (default: all saved but the last).
    select: narrow the spec's sites (``fnmatch`` pattern or names).
    timeout_s: time limit of one checkpoint.
    startup_s: extra time for a worker's first checkpoint.
    memory_limit_mb: a worker's resident memory limit (None: none).
    progress: called with one line per step.

  Returns:
    The :class:`peat_jax.PlaybackResult` of the steps that completed
    (findings: :func:`read_findings`).

  Raises:
    PeatError: bad spec or steps, or a worker error that is not a crash,
      hang or out-of-memory (e.g. the KUT selects no site).
  """
  say = progress or (lambda s: None)
  fac = _factory_tuple(factory)
  limits = Limits(timeout_s, startup_s, memory_limit_mb)
  ckpt, path, steps, todo = _playback.playback_plan(golden_dir, kut_spec,
                                                    campaign_dir, steps)
  crash_path = os.path.join(os.path.dirname(path), CRASH_FILE)
  hit = {r["step"] for r in read_records(crash_path)
         if r.get("kut") == kut_spec and r.get("phase") == "playback"}
  done_before = [s for s in steps if s not in todo and s not in hit]
  todo = [s for s in todo if s not in hit]
  sites = None
  while todo:
    w = Worker(__name__, "play_steps",
               dict(factory=fac, ckpt=ckpt, kut_spec=kut_spec, select=select,
                    steps=list(todo)), limits, what="step")
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
          say(_step_line(s, recs, time.perf_counter() - t0))
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
    found = _attribute(fac, ckpt, kut_spec, s, sites, w.death, limits, say)
    append_records(crash_path, found)
    say(f"playback step {s}: recorded {len(found)} {w.death.kind} "
        f"finding(s): " + ", ".join(str(f["site"]) for f in found))
    todo = todo[todo.index(s) + 1:]
  for s in steps:
    if s in hit:
      say(f"playback step {s}: crashed or hung before, skipped")
    elif s in done_before:
      say(f"playback step {s}: done before, skipped")
  return _playback.playback_result(path, steps, kut_spec, sites)


# ---------------------------------------------------------------- runtime


def run_frequencies(factory: tuple, golden_dir: str, kut_spec: str,
                    frequencies: Sequence[str], steps: int, start_step: int,
                    seeds: Sequence[int], select: Any,
                    tmp_dir: str) -> Iterator[tuple]:
  """Worker job: runtime FI one frequency at a time into ``tmp_dir``."""
  _register_builtin(kut_spec)
  task = TaskFactory(*factory).build()
  path = os.path.join(tmp_dir, RUNTIME_FILE)
  for f in frequencies:
    yield ("start", f)
    before = len(read_records(path))
    lines: list[str] = []
    _runtime.runtime(task, golden_dir, kut_spec, frequencies=[f], steps=steps,
                     start_step=start_step, seeds=seeds, campaign_dir=tmp_dir,
                     select=select, progress=lines.append)
    for line in lines:
      yield ("say", line + " (isolated)")
    yield ("done", f, read_records(path)[before:])


def runtime_result(records: Sequence[dict], frequencies: Sequence[str],
                   steps: int, start_step: int) -> _runtime.RuntimeResult:
  """A :class:`peat_jax.RuntimeResult` from ``runtime.msgpack`` records.

  A crashed frequency has ``crashed: True``, empty ``steps``, ``loss`` and
  ``golden_loss``, and the crash in ``reason``.
  """
  byname = {r["name"]: r for r in records}
  golden = byname.get("golden", {}).get("loss", [])
  spread = byname.get("spread", {}).get("loss", [])
  step_ids = list(range(start_step, start_step + steps))
  runs = []
  for f in frequencies:
    r = byname[f]
    crashed = r.get("crash") is not None
    runs.append({"frequency": r["label"],
                 "steps": [] if crashed else step_ids, "loss": r["loss"],
                 "golden_loss": [] if crashed else golden,
                 "diverged_at": r["diverged_at"], "reason": r["reason"],
                 "crashed": crashed})
  return _runtime.RuntimeResult(
      runs, {"steps": step_ids if spread else [], "loss_spread": spread},
      golden)


def isolated_runtime(factory: TaskFactory, golden_dir: str | os.PathLike,
                     kut_spec: str, *,
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
                     ) -> _runtime.RuntimeResult:
  """Runtime FI (as :func:`peat_jax.runtime`) in worker processes.

  A worker runs the frequencies in order into a scratch directory and sends
  each one's new records; the parent appends them to ``runtime.msgpack``.
  A frequency whose worker crashes, hangs or runs out of memory is recorded
  as crashed (in ``runtime.msgpack`` and as a finding in
  ``crashes.msgpack``), and a fresh worker goes on with the next one.

  Args:
    factory: rebuilds the golden run's task in a worker.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: the KUT spec.
    frequencies: as for :func:`peat_jax.runtime`.
    steps: runtime FI steps.
    start_step: the golden checkpoint to start from.
    seeds: seeds of the golden seed-to-seed spread.
    campaign_dir: where the record files go (default: ``golden_dir``'s
      parent).
    select: narrow the spec's sites.
    timeout_s: time limit of one frequency.
    startup_s: extra time for a worker's first frequency (it also trains
      the golden trajectory and the spread when they are missing).
    memory_limit_mb: a worker's resident memory limit (None: none).
    progress: called with one line per frequency.

  Returns:
    A :class:`peat_jax.RuntimeResult` (crashed runs: :func:`runtime_result`).

  Raises:
    PeatError: unknown frequency, or a worker error that is not a crash,
      hang or out-of-memory.
  """
  say = progress or (lambda s: None)
  fac = _factory_tuple(factory)
  limits = Limits(timeout_s, startup_s, memory_limit_mb)
  labels = {f: _runtime.parse_frequency(f)[1] for f in frequencies}
  golden_dir = os.path.abspath(os.fspath(golden_dir))
  campaign_dir = os.path.abspath(os.fspath(
      campaign_dir or os.path.dirname(golden_dir)))
  path = os.path.join(campaign_dir, RUNTIME_FILE)
  crash_path = os.path.join(campaign_dir, CRASH_FILE)

  def mine() -> list[dict]:
    return [r for r in read_records(path) if r.get("kut") == kut_spec
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
                 dict(factory=fac, golden_dir=golden_dir, kut_spec=kut_spec,
                      frequencies=list(remaining), steps=steps,
                      start_step=start_step, seeds=list(seeds), select=select,
                      tmp_dir=tmp), limits, what="frequency")
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
      # The golden trajectory and spread it finished before dying are good.
      keep([r for r in read_records(os.path.join(tmp, RUNTIME_FILE))
            if r["name"] in ("golden", "spread")])
      d = w.death
      keep([{"kut": kut_spec, "n": steps, "start": start_step, "name": f,
             "loss": [], "label": labels[f], "diverged_at": None,
             "reason": f"{d.kind}: {d.message}",
             "crash": {"kind": d.kind, "signal": d.signal,
                       "timeout_s": d.timeout_s, "message": d.message}}])
      append_records(crash_path, [finding_record(d, kut_spec, "runtime",
                                                 frequency=f)])
      say(f"runtime {labels[f]}: {d.kind} ({d.message})")
      remaining = remaining[remaining.index(f) + 1:]
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return runtime_result(list(byname.values()), frequencies, steps,
                        start_step)


# ------------------------------------------------------------ one kernel


def _probe(kut_spec: str) -> Iterator[tuple]:
  """Worker job: the KUT once on small seeded inputs of its site kernel."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax import lax  # pylint: disable=g-import-not-at-top
  from peat_jax.kernels import kut as _kut  # pylint: disable=g-import-not-at-top
  _register_builtin(kut_spec)
  spec = _kut.parse_kut(kut_spec)
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
                    f"KUTs; {kut_spec!r} replaces {spec.site_kernel!r}")
  compiled = f.lower(*args).compile()
  yield ("warm",)
  yield ("start", kut_spec)
  yield ("done", kut_spec, float(jnp.sum(compiled(*args))))


def check_kut(kut_spec: str, *, timeout_s: float = 60.0,
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
  from peat_jax.kernels import kut as _kut  # pylint: disable=g-import-not-at-top
  _kut.parse_kut(kut_spec)
  w = Worker(__name__, "_probe", {"kut_spec": kut_spec},
             Limits(timeout_s, startup_s, memory_limit_mb), what="call of")
  with contextlib.closing(w.events()) as events:
    for _ in events:
      pass
  if w.death is None:
    return None
  return finding_record(w.death, kut_spec, "check")
