"""Reading golden checkpoints in one process of a multi-process run.

Orbax's default ``CheckpointManager`` waits at a barrier of all processes
when it opens and on every restore: processes of a
:func:`jax.distributed.initialize` run that restore different steps would
deadlock. It also restores arrays onto the device recorded at save time,
which another process cannot address. These readers sync with no other
process and restore into a sharding the caller gives (its own device, or
replicated over a mesh); the checks are those of
:func:`peat_jax.restore_state` (task, format version, SHA-256 fingerprint).
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from peat_jax.profiler.golden import _checkpoint
from peat_jax.profiler.golden import _golden
from peat_jax.core import CheckpointError
from peat_jax.profiler.golden._train_state import TrainState
from peat_jax.profiler.golden._train_state import TrainTask


def reader(directory: str) -> ocp.CheckpointManager:
  """An Orbax manager for reading ``directory`` that syncs with no process.

  Args:
    directory: a checkpoint directory.

  Returns:
    The manager; close it after use.

  Raises:
    CheckpointError: the directory does not exist.
  """
  if not os.path.isdir(directory):
    raise CheckpointError(
        f"checkpoint directory {directory} does not exist; pass the "
        "'checkpoints' folder of a golden run (or its workdir), visible at "
        "the same path on every host")
  me = jax.process_index()
  options = ocp.CheckpointManagerOptions(
      create=False, enable_async_checkpointing=False,
      multiprocessing_options=ocp.options.MultiprocessingOptions(
          primary_host=me, active_processes={me},
          barrier_sync_key_prefix=f"peat_reader_{me}"))
  return ocp.CheckpointManager(directory, options=options,
                               item_names=("state", "meta"))


def saved_steps_local(directory: str) -> list[int]:
  """Complete checkpoint steps of ``directory``, read by this process alone.

  Raises:
    CheckpointError: missing directory or no complete step.
  """
  manager = reader(directory)
  try:
    steps = sorted(manager.all_steps())
  finally:
    manager.close()
  if not steps:
    raise CheckpointError(f"checkpoint directory {directory} holds no "
                          "complete checkpoint step")
  return steps


def restore_on(directory: str, task: TrainTask, step: int,
               sharding: jax.sharding.Sharding, *,
               manager: ocp.CheckpointManager | None = None) -> TrainState:
  """Restores one golden step straight into ``sharding`` (this process only).

  The same checks as :func:`peat_jax.restore_state` (task, format version,
  SHA-256 fingerprint); the arrays are read onto the sharding's devices
  (one device, or replicated over a mesh) instead of the default device.

  Args:
    directory: a golden run's checkpoint directory.
    task: the golden run's task.
    step: a saved step.
    sharding: where the restored arrays live.
    manager: a reader of ``directory`` from :func:`reader` to reuse (one
      per thread); default: a new one, closed after the restore.

  Returns:
    The restored state.

  Raises:
    CheckpointError: an unrestorable, corrupt or foreign step.
  """
  abstract = _golden.abstract_state(task)
  target = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
      abstract)
  own = manager is None
  manager = reader(directory) if own else manager
  try:
    state, meta = _checkpoint.restore(directory, target, step,
                                      manager=manager)
  finally:
    if own:
      manager.close()
  if meta.get("task") != task.name:
    raise CheckpointError(
        f"checkpoint {directory} step {step} belongs to task "
        f"{meta.get('task')!r}, not {task.name!r}; pass the matching task")
  return state
