"""Golden training: a seeded run with golden kernels, checkpoints and a log.

A golden run is the baseline every later campaign compares against. Its
working directory holds::

  <workdir>/run.json          what was run (task, config, seed, budget)
  <workdir>/checkpoints/      Orbax CheckpointManager, one step every k
  <workdir>/log.msgpack       per-step records (see :func:`read_log`)
  <workdir>/eval.json         held-out metrics of the final state

Resuming from the latest checkpoint continues the run bitwise (same machine,
same number of visible cores): the state holds the step, optimizer state, RNG
and data position, and batches are pure functions of the data position.
"""

import json
import math
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from peat_jax.profiler import files as _files
from peat_jax.profiler.golden import _checkpoint
from peat_jax.profiler.golden import _golden_step
from peat_jax.profiler.golden._golden_log import (
    LOG_FIELDS, _append_log, _truncate_log, read_log)
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.profiler.golden._train_state import TrainState, TrainTask



class GoldenResult(NamedTuple):
  """What a golden run produced.

  Attributes:
    workdir: absolute path of the run directory.
    checkpoint_dir: ``<workdir>/checkpoints``.
    log_path: ``<workdir>/log.msgpack``.
    state: the final TrainState.
    steps: saved checkpoint steps.
    log: per-step records (as :func:`read_log` returns them).
    evaluation: held-out metrics of the final state.
    seconds_per_step: mean wall time of a train step after the first
      (compilation excluded).
    resumed_from: the step the run resumed from, or None.
  """

  workdir: str
  checkpoint_dir: str
  log_path: str
  state: TrainState
  steps: list[int]
  log: dict[str, np.ndarray]
  evaluation: dict[str, float]
  seconds_per_step: float
  resumed_from: int | None


def _run_record(task: TrainTask, seed: int, steps: int,
                checkpoint_every: int) -> dict[str, Any]:
  return {"task": task.name, "config": dict(task.config), "seed": seed,
          "steps": steps, "checkpoint_every": checkpoint_every,
          "jax": jax.__version__, "devices": jax.device_count(),
          "cpu_count": os.cpu_count()}


def _check_same_run(path: str, record: dict[str, Any]) -> None:
  with open(path) as f:
    old = json.load(f)
  for key in ("task", "config", "seed", "checkpoint_every"):
    if old.get(key) != record[key]:
      raise PeatError(
          f"{path} records a run with {key}={old.get(key)!r}, this call has "
          f"{key}={record[key]!r}; resuming would mix two runs. Use another "
          "workdir, or the same settings to resume")


def abstract_state(task: TrainTask) -> TrainState:
  """Shapes and dtypes of the task's TrainState, computed without FLOPs."""
  return jax.eval_shape(lambda: task.init_state(0))


def committed(state):
  """``state`` with its arrays committed to the default device, as a
  restored checkpoint's are: a freshly initialised state's arrays are not,
  and the two lower to programs that differ in their sharding annotations
  only, so the golden run's step and the replayed or runtime steps would
  be compiled twice (and miss each other in the persistent cache). Arrays
  already committed (a sharded state) are left as they are."""
  leaves = jax.tree.leaves(state)
  if not leaves or any(not isinstance(x, jax.Array) or x.committed
                       for x in leaves):
    return state
  return jax.device_put(state, jax.sharding.SingleDeviceSharding(
      jax.devices()[0]))


def restore_state(checkpoint_dir: str | os.PathLike, task: TrainTask,
                  step: int | None = None) -> TrainState:
  """Restores a TrainState of ``task`` from a golden run's checkpoints.

  Args:
    checkpoint_dir: ``<workdir>/checkpoints`` of a golden run (or the workdir).
    task: the task whose state structure to restore into.
    step: which step; the latest complete one when None.

  Returns:
    The restored state.

  Raises:
    CheckpointError: see :func:`peat_jax.profiler.golden._checkpoint.restore`.
    PeatError: the checkpoint belongs to another task.
  """
  with StateReader(checkpoint_dir, task) as r:
    return r.restore(step)


class StateReader:
  """Restores many steps of one golden run: one Orbax manager, one target.

  :func:`restore_state` opens a manager, traces the task's state shapes
  and lets Orbax read the saved sharding metadata on every call; a reader
  does that work once (playback restores every checkpoint of a run). Use it
  from one thread at a time.
  """

  def __init__(self, checkpoint_dir: str | os.PathLike, task: TrainTask):
    """Opens the run's checkpoints.

    Args:
      checkpoint_dir: ``<workdir>/checkpoints`` of a golden run (or the
        workdir).
      task: the task whose state structure to restore into.

    Raises:
      CheckpointError: a missing directory.
    """
    self._dir = _files.checkpoint_dir_of(checkpoint_dir)
    self._task = task
    self._abstract = abstract_state(task)
    self._target = _checkpoint.restore_target(self._abstract)
    self._manager = _checkpoint.open_manager(self._dir, create=False)

  def restore(self, step: int | None = None) -> TrainState:
    """Restores one step (the latest complete one when None).

    Raises:
      CheckpointError: see :func:`peat_jax.profiler.golden._checkpoint.restore`.
      PeatError: the checkpoint belongs to another task.
    """
    state, meta = _checkpoint.restore(self._dir, self._abstract, step,
                                      manager=self._manager,
                                      target=self._target)
    if meta.get("task") != self._task.name:
      raise PeatError(
          f"checkpoint {self._dir} step {int(state.step)} belongs to task "
          f"{meta.get('task')!r}, not {self._task.name!r}; pass the matching "
          "task")
    return state

  def close(self) -> None:
    """Closes the manager."""
    self._manager.close()

  def __enter__(self) -> "StateReader":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def golden_train(task: TrainTask, workdir: str | os.PathLike, *,
                 steps: int | None = None,
                 checkpoint_every: int | None = None,
                 seed: int = 0,
                 resume: bool = True,
                 evaluate: bool = True,
                 progress: Callable[[str], None] | None = None,
                 store_golden_step: bool = True,
                 ) -> GoldenResult:
  """Trains ``task`` with golden kernels, saving Orbax checkpoints.

  Step 0 (the initial state), every ``checkpoint_every``-th step and the last
  step are saved; log records are written together with each checkpoint, so
  the log and the checkpoints always agree after a crash.

  Args:
    task: the model, data and train step.
    workdir: run directory (created; made absolute).
    steps: total optimizer steps; the task's default when None.
    checkpoint_every: checkpoint interval; the task's default when None.
    seed: seeds parameters, RNG and data order.
    resume: continue from the latest checkpoint in ``workdir`` if there is
      one (it must be a run of the same task, config and seed). With False, a
      workdir that already holds checkpoints is an error.
    evaluate: compute held-out metrics of the final state.
    progress: called with one line of text per checkpoint (e.g. ``print``).
    store_golden_step: keep the parameters after each checkpoint's next
      step (``golden_step/``, one parameter set per checkpoint but the
      last), so that playback runs the KUT's step alone
      (:mod:`peat_jax.profiler.golden._golden_step`); False: playback
      replays the golden step beside the KUT's.

  Returns:
    A :class:`GoldenResult`.

  Raises:
    PeatError: bad arguments, a workdir of another run, or a non-finite loss.
    CheckpointError: an unreadable checkpoint when resuming.
  """
  _core.ensure_compilation_cache()  # compile once, reuse after
  steps = task.default_steps if steps is None else int(steps)
  every = (task.default_checkpoint_every if checkpoint_every is None
           else int(checkpoint_every))
  if steps < 1 or every < 1:
    raise PeatError(f"steps and checkpoint_every must be >= 1, got "
                    f"steps={steps}, checkpoint_every={every}")
  say = progress or (lambda _: None)
  workdir = os.path.abspath(os.fspath(workdir))
  ckpt_dir = os.path.join(workdir, _files.CHECKPOINT_DIR)
  log_path = os.path.join(workdir, _files.LOG_FILE)
  run_path = os.path.join(workdir, _files.RUN_FILE)
  os.makedirs(workdir, exist_ok=True)
  record = _run_record(task, seed, steps, every)

  manager = _checkpoint.open_manager(ckpt_dir, create=True)
  try:
    existing = sorted(manager.all_steps())
    resumed_from = None
    if existing:
      if not resume:
        raise PeatError(
            f"{ckpt_dir} already holds checkpoint steps {existing}; pass "
            "resume=True (--resume) to continue that run, or another workdir")
      if os.path.exists(run_path):
        _check_same_run(run_path, record)
      manager.close()
      state = restore_state(ckpt_dir, task, existing[-1])
      manager = _checkpoint.open_manager(ckpt_dir, create=True)
      resumed_from = int(state.step)
      _truncate_log(log_path, resumed_from)
      say(f"resumed from step {resumed_from} of {ckpt_dir}")
    else:
      state = committed(task.init_state(seed))
      if os.path.exists(log_path):
        os.remove(log_path)
    with open(run_path, "w") as f:
      json.dump(record, f, indent=1)

    meta = {"task": task.name, "seed": seed}
    if not existing:
      _checkpoint.save(manager, state, dict(meta, data_position=0))

    position = int(state.data_position)
    pending: list[dict[str, Any]] = []
    step_times = []
    start = int(state.step)
    for step in range(start + 1, steps + 1):
      t0 = time.perf_counter()
      state, metrics = task.train_step(state, task.batch_at(position))
      position += 1
      pending.append(metrics)
      if step > start + 1:
        jax.block_until_ready(metrics)
        step_times.append(time.perf_counter() - t0)
      if store_golden_step and (step - 1 == start or (step - 1) % every == 0):
        _golden_step.write_golden_step(workdir, step - 1, state.params)
      if step % every == 0 or step == steps:
        records = _to_records(pending, step)
        pending = []
        _append_log(log_path, records)
        bad = [r["step"] for r in records if not math.isfinite(r["loss"])]
        if bad:
          raise PeatError(
              f"golden training of {task.name!r} produced a non-finite loss "
              f"at step {bad[0]}; checkpoints up to step "
              f"{records[0]['step'] - 1} in {ckpt_dir} are kept. Lower the "
              "learning rate or check the data")
        _checkpoint.save(manager, state, dict(meta, data_position=position))
        say(f"step {step:5d}  loss {records[-1]['loss']:.4f}  "
            f"grad_norm {records[-1]['grad_norm']:.3g}  -> checkpoint")
  finally:
    _checkpoint.close(manager)

  evaluation = {}
  if evaluate:
    evaluation = {k: float(v) for k, v in task.evaluate(state).items()}
    with open(os.path.join(workdir, _files.EVAL_FILE), "w") as f:
      json.dump(evaluation, f, indent=1)
  return GoldenResult(
      workdir=workdir, checkpoint_dir=ckpt_dir, log_path=log_path,
      state=state, steps=_checkpoint.saved_steps(ckpt_dir),
      log=read_log(log_path), evaluation=evaluation,
      seconds_per_step=float(np.mean(step_times)) if step_times else math.nan,
      resumed_from=resumed_from)


def _to_records(metrics: list[dict[str, jax.Array]],
                last_step: int) -> list[dict[str, float]]:
  host = jax.device_get(metrics)
  first = last_step - len(host) + 1
  return [{"step": first + i,
           **{k: float(m[k]) for k in LOG_FIELDS if k != "step"}}
          for i, m in enumerate(host)]
