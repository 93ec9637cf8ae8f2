"""Scale-out of playback FI over local devices and over hosts.

Playback FI is embarrassingly parallel over checkpoints: each one is restored
and played (:meth:`peat_jax.profiler.playback_fi._playback.Player.play`) independently.
:func:`sharded_playback` spreads the checkpoints of a campaign

* over the local devices of a process: one worker thread per device restores
  a checkpoint straight onto its device and plays it there (JAX dispatches
  each jitted call to the device its committed inputs live on); one writer
  appends the records in step order, so the record file is the one
  sequential :func:`peat_jax.profiler.playback_fi._playback.playback` writes;
* over processes started with :func:`jax.distributed.initialize` (one
  controller per host): process 0 plans, every process plays a
  deterministic share of the checkpoints into its own shard file, and after
  a barrier of JAX's coordination service process 0 merges the shards into
  ``playback.msgpack`` in step order, without duplicates.

Sites are not split across devices: one checkpoint's step runs once for all
its selected sites (splitting sites would run the step once per share).

Checkpoints are read with :mod:`peat_jax.profiler.golden._checkpoint_local` (no all-process
Orbax barriers). Data-parallel runtime FI is :mod:`peat_jax.profiler.scaleout._data_parallel`.
"""

from __future__ import annotations

import glob
import itertools
import json
import math
import os
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax.profiler import files as _files
from peat_jax.profiler.golden import (
    reader, restore_on, saved_steps_local)
from peat_jax.core import PeatError
from peat_jax.kernels import kut as _kut
from peat_jax.profiler.playback_fi import Player
from peat_jax.profiler.playback_fi import (
    PlaybackResult, plan_steps, playback_result, step_line)
from peat_jax.profiler.files import (
    PLAYBACK_FILE, append_records, read_records, record_backward)
from peat_jax.profiler.golden import TrainTask

#: Folder of a campaign directory holding per-process shard record files.
SHARD_DIR = _files.SHARD_DIR

_CALLS = itertools.count()  # per-call ids of barriers and keys (lockstep)


# --------------------------------------------------------------------------
# Processes


def init_distributed(coordinator_address: str, num_processes: int,
                     process_id: int,
                     local_device_ids: Sequence[int] | None = None) -> None:
  """Joins this process to a multi-process JAX run (one per host).

  Calls :func:`jax.distributed.initialize`, then initializes the backend in
  this process right away: backend start-up exchanges the device topology
  through the coordinator, so every process must do it before any barrier.

  Args:
    coordinator_address: ``host:port`` of process 0's coordinator, the same
      on every process.
    num_processes: number of processes.
    process_id: this process, in ``[0, num_processes)``.
    local_device_ids: devices this process drives (default: all visible).

  Raises:
    PeatError: inconsistent arguments, or JAX is already initialized.
  """
  if not (isinstance(num_processes, int) and num_processes >= 1):
    raise PeatError(f"num_processes must be an int >= 1; got "
                    f"{num_processes!r}")
  if not (isinstance(process_id, int) and 0 <= process_id < num_processes):
    raise PeatError(f"process_id must be in [0, {num_processes}); got "
                    f"{process_id!r}")
  if not coordinator_address or ":" not in coordinator_address:
    raise PeatError(f"coordinator_address must be 'host:port' (process 0's "
                    f"host); got {coordinator_address!r}")
  try:
    jax.distributed.initialize(coordinator_address, num_processes,
                               process_id, local_device_ids=local_device_ids)
  except RuntimeError as e:
    raise PeatError(
        f"jax.distributed.initialize failed: {e}. Call init_distributed "
        "before any JAX computation, once per process") from e
  jax.devices()


def _client():
  """The coordination-service client of :func:`jax.distributed.initialize`.

  The same object JAX's own array serialization and Orbax use for barriers
  and key-value exchange; JAX has no public accessor for it.
  """
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  client = distributed.global_state.client
  if client is None:
    raise PeatError(
        f"{jax.process_count()} JAX processes but no coordination client; "
        "start them with peat_jax's init_distributed (jax.distributed."
        "initialize)")
  return client


class _Sync:
  """Barriers and a key-value exchange among the processes of one call.

  With one process, barriers return at once and values stay in this object.
  """

  def __init__(self, timeout_s: float):
    self.n = jax.process_count()
    self.me = jax.process_index()
    self._id = next(_CALLS)
    self._ms = int(timeout_s * 1000)
    self._client = _client() if self.n > 1 else None
    self._local: dict[str, Any] = {}

  def barrier(self, name: str) -> None:
    if self._client is not None:
      self._client.wait_at_barrier(f"peat_playback_{self._id}_{name}",
                                   self._ms)

  def publish(self, name: str, value: Any) -> None:
    if self._client is None:
      self._local[name] = value
    else:
      self._client.key_value_set(f"peat_playback/{self._id}/{name}",
                                 json.dumps(value))

  def fetch(self, name: str) -> Any:
    if self._client is None:
      return self._local[name]
    return json.loads(self._client.blocking_key_value_get(
        f"peat_playback/{self._id}/{name}", self._ms))


# --------------------------------------------------------------------------
# Record files: plan, shards, merge


def _complete_groups(records: Sequence[dict]) -> dict[tuple, list]:
  """``{(kut, backward, step): records}`` of the groups with an effect."""
  groups: dict[tuple, list] = {}
  for r in records:
    groups.setdefault((r.get("kut"), record_backward(r), r.get("step")),
                      []).append(r)
  return {k: v for k, v in groups.items()
          if any(r.get("kind") == "effect" for r in v)}


def merge_shards(path: str, shard_dir: str,
                 order: Sequence[int] = ()) -> int:
  """Moves the complete steps of every shard file into ``path``.

  A (KUT, step) already complete in ``path``, or in an earlier shard, is
  not added again; a step without its effect record (a process killed while
  playing it) is dropped and will be played again. Merged groups are
  appended ordered by their position in ``order`` (then by step), so a
  merged file equals the one sequential playback writes. Shard files are
  deleted after the append.

  Args:
    path: the campaign's ``playback.msgpack``.
    shard_dir: the folder of shard files (``*.msgpack``).
    order: the planned step order.

  Returns:
    The number of (KUT, step) groups added.
  """
  shards = sorted(glob.glob(os.path.join(shard_dir, "*.msgpack")))
  if not shards:
    return 0
  done = set(_complete_groups(read_records(path)))
  rank = {s: i for i, s in enumerate(order)}
  new: dict[tuple, list] = {}
  for shard in shards:
    for key, recs in _complete_groups(read_records(shard)).items():
      if key not in done and key not in new:
        new[key] = recs
  keys = sorted(new, key=lambda k: (rank.get(k[2], len(rank)), k[2],
                                    str(k[0]), k[1]))
  if keys:
    append_records(path, [r for k in keys for r in new[k]])
  for shard in shards:
    os.remove(shard)
  if not os.listdir(shard_dir):
    os.rmdir(shard_dir)
  return len(keys)


def plan_playback(ckpt: str, path: str, kut_spec: str,
                  steps: Sequence[int] | None,
                  backward: str = "golden") -> tuple[list[int], list[int]]:
  """Steps to play and those still to do; drops partial steps (resume).

  The rules of :func:`peat_jax.profiler.playback_fi._playback.playback_plan`, reading the
  checkpoint list with :func:`saved_steps_local`.

  Returns:
    ``(steps, todo)``.

  Raises:
    PeatError: a wanted step is not saved.
  """
  return plan_steps(saved_steps_local(ckpt), ckpt, path, kut_spec, steps,
                    backward)


def process_share(todo: Sequence[int], process_index: int,
                  process_count: int) -> list[int]:
  """The steps one process plays: every ``process_count``-th, round robin."""
  return list(todo[process_index::process_count])


# --------------------------------------------------------------------------
# Playing on local devices


def local_devices(devices: int | Sequence[Any] | None = None) -> list:
  """Resolves a device choice to devices this process drives.

  Args:
    devices: None (all local devices), a count (the first n), or devices.

  Returns:
    The devices.

  Raises:
    PeatError: a count out of range, or a device of another process.
  """
  local = jax.local_devices()
  if devices is None:
    return local
  if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
    if not 1 <= int(devices) <= len(local):
      raise PeatError(f"devices={devices}: this process has {len(local)} "
                      f"local devices ({local}); pass 1..{len(local)}")
    return local[:int(devices)]
  devices = list(devices)
  foreign = [d for d in devices if d not in local]
  if not devices or foreign:
    raise PeatError(f"devices must be non-empty and local to process "
                    f"{jax.process_index()}; not local: {foreign}; local: "
                    f"{local}")
  return devices


class _LocalRun(NamedTuple):
  site_order: list | None
  timings: list


def _play_local(task: TrainTask, ckpt: str, kut: _kut.CheckedSpec, select,
                devices: list, todo: Sequence[int], out_path: str,
                say: Callable[[str], None]) -> _LocalRun:
  """Plays ``todo`` on ``devices``; appends records to ``out_path`` in order.

  One worker thread per device takes the next step, restores it onto its
  device and plays it with one shared :class:`Player` (its jitted functions
  are traced once and compiled once per device). The calling thread writes
  each step's records as soon as the steps before it are written.
  """
  if not todo:
    return _LocalRun(None, [])
  first = restore_on(ckpt, task, todo[0],
                     jax.sharding.SingleDeviceSharding(devices[0]))
  player = Player(task, kut, first,
                  task.batch_at(int(first.data_position)), select=select,
                  backward=kut.backward)
  results: dict[int, tuple] = {}
  errors: list[BaseException] = []
  cond = threading.Condition()
  next_index = itertools.count(1)  # index 0 is devices[0]'s, restored above
  steady: list[float] = []

  def work(device, index, state):
    sharding = jax.sharding.SingleDeviceSharding(device)
    first_on_device = True
    manager = None
    try:
      while index < len(todo):
        t0 = time.perf_counter()
        if state is None:
          manager = manager or reader(ckpt)
          state = restore_on(ckpt, task, todo[index], sharding,
                             manager=manager)
        recs = player.play(todo[index], state)
        state = None
        dt = time.perf_counter() - t0
        with cond:
          results[index] = (recs, device, dt)
          if not first_on_device:
            steady.append(dt)
          cond.notify_all()
          if errors:
            return
          index = next(next_index)
        first_on_device = False
    except BaseException as e:  # pylint: disable=broad-except
      with cond:
        errors.append(e)
        cond.notify_all()
    finally:
      if manager is not None:
        manager.close()

  with cond:
    starts = [(0, first)] + [(next(next_index), None) for _ in devices[1:]]
  threads = [threading.Thread(target=work, args=(d, i, s), daemon=True,
                              name=f"peat-playback-{d}")
             for d, (i, s) in zip(devices, starts)]
  for t in threads:
    t.start()
  written = 0
  try:
    while written < len(todo):
      with cond:
        cond.wait_for(lambda: written in results or bool(errors))
        if written not in results:
          raise errors[0]
        recs, device, dt = results.pop(written)
      append_records(out_path, recs)
      say(step_line(todo[written], recs, dt, where=f" on {device}"))
      written += 1
  finally:
    with cond:
      if written < len(todo) and not errors:
        errors.append(PeatError("playback stopped"))
    for t in threads:
      t.join()
  return _LocalRun(player.site_names, steady)


def _finish(sync: _Sync, path: str, shard_dir: str, steps: Sequence[int],
            todo: Sequence[int], kut_spec: str, campaign_dir: str,
            backward: str = "golden") -> str | None:
  """Process 0 after the barrier: merges shards, checks every step is done.

  Complete steps are merged even when a process failed, so a rerun resumes.

  Returns:
    None, or why the playback is incomplete.
  """
  try:
    if sync.n > 1:
      merge_shards(path, shard_dir, steps)
    failed = [f"process {p}: {m}" for p in range(sync.n)
              if (m := sync.fetch(f"status/{p}")) is not None]
    if failed:
      return ("playback failed in " + "; ".join(failed) + ". Its finished "
              "steps are recorded; fix the cause and rerun to resume")
    done = {k[2] for k in _complete_groups(read_records(path))
            if k[:2] == (kut_spec, backward)}
    missing = [s for s in todo if s not in done]
    if missing:
      return (f"after merging, steps {missing} have no records in {path}: "
              "the other processes wrote their shards where process 0 "
              f"cannot read them. campaign_dir ({campaign_dir}) must be one "
              "directory shared by every host (e.g. NFS), at the same path")
  except Exception as e:  # pylint: disable=broad-except
    return f"process 0 could not merge the shards: {type(e).__name__}: {e}"
  return None


def sharded_playback(task: TrainTask, golden_dir: str | os.PathLike,
                     kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec", *,
                     devices: int | Sequence[Any] | None = None,
                     campaign_dir: str | os.PathLike | None = None,
                     steps: Sequence[int] | None = None,
                     select: str | Sequence[str] | None = None,
                     progress: Callable[[str], None] | None = None,
                     barrier_timeout_s: float = 7 * 24 * 3600.0,
                     backward: str = "golden") -> PlaybackResult:
  """Playback FI with checkpoints spread over local devices and processes.

  In one process, the checkpoints go to worker threads, one per device in
  ``devices``; the records (``playback.msgpack``) are the same, in the same
  order, as those of sequential :func:`peat_jax.playback` on the same
  machine. Under :func:`jax.distributed.initialize` with several processes
  (:func:`init_distributed`), every process calls this with the same
  arguments: process 0 plans (resume: finished steps are skipped, partial
  ones dropped, leftover shards of a killed run merged) and shares the plan
  through the coordination service; each process plays every
  ``process_count``-th planned step on its own devices into
  ``<campaign_dir>/playback_shards/process-<i>.msgpack``; after a barrier,
  process 0 merges the shards into ``playback.msgpack`` (step order, no
  duplicates). ``golden_dir`` and ``campaign_dir`` must be the same shared
  directories on every host.

  Args:
    task: the golden run's task.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: a spec of :func:`peat_jax.kernels.kut.resolve_kut`.
    devices: this process's devices: None (all local), a count, or devices.
    campaign_dir: where ``playback.msgpack`` goes (default: ``golden_dir``'s
      parent).
    steps: checkpoint steps (default: all saved but the last).
    select: narrow the spec's sites: an ``fnmatch`` pattern or site names.
    progress: called with one line per step this process plays.
    barrier_timeout_s: how long a process waits at a barrier for the others
      (the slowest process's share of the work must fit in it).
    backward: as for :func:`peat_jax.playback`.

  Returns:
    A :class:`peat_jax.PlaybackResult`; ``seconds_per_step`` is the mean
    wall time of one checkpoint on one device, each device's first
    (compiling) checkpoint excluded.

  Raises:
    PeatError: unknown spec, no selected site, a step that is not saved, a
      bad device choice, a campaign directory not shared between hosts,
      another process failed (every process raises; the steps finished
      before are merged, so a rerun resumes).
    CheckpointError: a checkpoint that cannot be restored.
  """
  say = progress or (lambda s: None)
  devices = local_devices(devices)
  sync = _Sync(barrier_timeout_s)
  kut = _kut.checked(kut_spec, backward)  # parsed and checked here, once
  kut_spec = kut.name  # the records' key
  golden_dir, ckpt, campaign_dir = _files.campaign_dirs(golden_dir,
                                                         campaign_dir)
  path = os.path.join(campaign_dir, PLAYBACK_FILE)
  shard_dir = os.path.join(campaign_dir, SHARD_DIR)
  if sync.me == 0:
    try:
      os.makedirs(campaign_dir, exist_ok=True)
      merge_shards(path, shard_dir, steps or ())
      plan = plan_playback(ckpt, path, kut_spec, steps, backward)
    except BaseException as e:
      sync.publish("plan", {"error": f"{type(e).__name__}: {e}"})
      raise
    sync.publish("plan", {"steps": plan[0], "todo": plan[1]})
  else:
    got = sync.fetch("plan")
    if "error" in got:
      raise PeatError(f"process 0 could not plan the playback: "
                      f"{got['error']}")
    plan = (got["steps"], got["todo"])
  steps, todo = plan
  mine = process_share(todo, sync.me, sync.n)
  if sync.n > 1:
    os.makedirs(shard_dir, exist_ok=True)
    out = os.path.join(shard_dir, f"process-{sync.me}.msgpack")
  else:
    out = path
  error = None
  try:
    run = _play_local(task, ckpt, kut, select, devices, mine, out, say)
  except Exception as e:  # pylint: disable=broad-except
    error, run = e, _LocalRun(None, [])  # told to all, raised below
  sync.publish(f"status/{sync.me}",
               None if error is None else f"{type(error).__name__}: {error}")
  sync.barrier("played")
  if sync.me == 0:
    sync.publish("outcome", _finish(sync, path, shard_dir, steps, todo,
                                    kut_spec, campaign_dir, backward))
  sync.barrier("finished")
  if error is not None:
    raise error
  outcome = sync.fetch("outcome")
  if outcome:
    raise PeatError(outcome)
  for s in steps:
    if s not in todo:
      say(f"playback step {s}: done before, skipped")
  timings = [math.nan] + run.timings  # playback_result skips the first
  return playback_result(path, steps, kut_spec, run.site_order, timings,
                         backward)
