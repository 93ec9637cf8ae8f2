"""Process isolation: a KUT's playback and runtime FI in worker processes.

A kernel under test may segfault, abort, hang or exhaust memory. Run in the
campaign's own process it would take the campaign down with it; here it runs
in a worker process (``python -m peat_jax.profiler.isolation._isolate_worker``) with limits:

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

import os
import pickle
import select as _select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator, Mapping, NamedTuple

from peat_jax.profiler import files as _files
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.profiler.golden import TrainTask

#: Findings (crash and hang records) of a campaign directory.
CRASH_FILE = _files.CRASH_FILE
#: Default time limit of one checkpoint / frequency, seconds.
TIMEOUT_S = 600.0
#: Default extra time of a worker's first unit (import, trace, compile).
STARTUP_S = 900.0
#: Default limit of a worker's resident memory, MiB.
MEMORY_LIMIT_MB = 8192
_POLL_S = 0.05
_TMP_DIR = _files.ISOLATE_TMP_DIR


class TaskFactory(NamedTuple):
  """A picklable recipe for a :class:`peat_jax.TrainTask`.

  A worker process calls ``module.function(**kwargs)`` to rebuild the task.
  The user's own task is ``TaskFactory.from_spec("my_model:task")`` (the
  tools' ``--task=my_model:task``); its function may return a TrainTask or
  another TaskFactory.

  Attributes:
    module: importable module name, e.g. ``"peat_jax.models"``.
    function: the function in it, e.g. ``"get_task"``.
    kwargs: its keyword arguments (picklable values).
  """

  module: str
  function: str
  kwargs: Mapping[str, Any] | None = None

  @classmethod
  def from_spec(cls, spec: str) -> "TaskFactory":
    """``TaskFactory(module, function)`` of a ``<module>:<function>`` spec.

    Raises:
      PeatError: a spec not of that form.
    """
    module, sep, function = str(spec).partition(":")
    if not sep or not module or not function.isidentifier():
      raise PeatError(f"task {spec!r}: expected <module>:<function>, e.g. "
                      "--task=my_model:task for a function task() in "
                      "my_model.py that returns a peat.TrainTask (or a "
                      "peat.TaskFactory)")
    return cls(module, function)

  def build(self) -> TrainTask:
    """Imports the module and calls the function.

    Returns:
      The task (a TaskFactory the function returns is built in turn).

    Raises:
      PeatError: the module or function does not exist, or the result is
        not a TrainTask or TaskFactory.
    """
    what = f"task factory {self.module}:{self.function}"
    fn = _core.user_function(self.module, self.function, what)
    task = fn(**dict(self.kwargs or {}))
    if isinstance(task, TaskFactory):
      task = task.build()
    if not isinstance(task, TrainTask):
      raise PeatError(f"{what} returned {type(task).__name__}; expected a "
                      "peat.TrainTask or a peat.TaskFactory (peat.nnx_task "
                      "builds a TrainTask from an nnx model)")
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
        [sys.executable, "-m", "peat_jax.profiler.isolation._isolate_worker", str(job_r),
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
