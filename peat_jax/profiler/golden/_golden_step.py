"""The golden run's step after each checkpoint, kept for playback.

Playback FI compares the KUT's training step from a checkpoint with the
golden one; the golden run took that step already. With
``store_golden_step`` (the default of :func:`golden_train`) it keeps, per
checkpoint ``s`` but the last, the parameters after step ``s + 1``::

  <golden>/golden_step/<s>.npz    the parameter leaves (``p00000``...)
  <golden>/golden_step/<s>.json   their tree paths, dtypes, shapes, SHA-256

The loss and gradient norm of step ``s + 1`` are in the run's log. So
playback runs the KUT's step alone, with the golden kernel tapped at the
selected sites on that step's own inputs, and reads the golden side here:
one parameter set per checkpoint on disk, one training step less per
checkpoint played (docs/campaign.md).
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax.core import PeatError
from peat_jax.profiler import files as _files
from peat_jax.profiler.golden._golden_log import read_log

#: Version of the sidecar files' layout.
FORMAT_VERSION = 1


class GoldenStep(NamedTuple):
  """The golden run's step after one checkpoint.

  Attributes:
    step: the checkpoint's step ``s``.
    params: the parameters after step ``s + 1`` (host arrays, the tree of
      the state's ``params``).
    loss: that step's loss (the log's).
    grad_norm: its gradient norm (the log's).
  """

  step: int
  params: Any
  loss: float
  grad_norm: float


def golden_step_dir(workdir: str | os.PathLike) -> str:
  """``<workdir>/golden_step`` of a golden run's workdir."""
  return os.path.join(os.fspath(workdir), _files.GOLDEN_STEP_DIR)


def _paths(params) -> list[str]:
  return [jax.tree_util.keystr(p)
          for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def write_golden_step(workdir: str | os.PathLike, step: int,
                      params) -> int:
  """Keeps the parameters after checkpoint ``step``'s next step.

  The arrays first, then the sidecar: a step without its sidecar (a crash
  in between) is not stored (:class:`GoldenSteps` skips it).

  Args:
    workdir: the golden run's workdir.
    step: the checkpoint's step.
    params: the state's parameters after step ``step + 1``.

  Returns:
    The bytes of the parameter file.
  """
  leaves = jax.tree.leaves(params)
  data, meta = _files.arrays_bytes(
      {f"p{i:05d}": x for i, x in enumerate(jax.device_get(leaves))})
  d = golden_step_dir(workdir)
  _files.write_file(os.path.join(d, f"{int(step)}.npz"), data)
  side = {"format": FORMAT_VERSION, "step": int(step), "bytes": len(data),
          "paths": _paths(params), "arrays": meta}
  _files.write_file(os.path.join(d, f"{int(step)}.json"),
                    json.dumps(side, indent=1).encode())
  return len(data)


class GoldenSteps:
  """The golden steps a golden run kept (:func:`write_golden_step`).

  Attributes:
    workdir: the golden run's workdir.
    steps: the checkpoint steps with a stored golden step, ascending.
  """

  def __init__(self, workdir: str | os.PathLike):
    """Lists the stored steps (reads no array).

    Args:
      workdir: the golden run's workdir.
    """
    self.workdir = os.fspath(workdir)
    d = golden_step_dir(workdir)
    names = set(os.listdir(d)) if os.path.isdir(d) else set()
    self.steps = sorted(int(n[:-5]) for n in names
                        if n.endswith(".json") and n[:-5].isdigit()
                        and f"{n[:-5]}.npz" in names)
    self._log = None

  def covers(self, steps: Sequence[int]) -> bool:
    """Whether every one of ``steps`` has a stored golden step whose
    loss the log holds (a run cut short before its next checkpoint has
    not logged it yet)."""
    have = set(self.steps)
    if not steps or not all(int(s) in have for s in steps):
      return False
    logged = set(self._read_log()["step"].tolist())
    return all(int(s) + 1 in logged for s in steps)

  def _read_log(self) -> dict:
    if self._log is None:
      self._log = read_log(self.workdir)
    return self._log

  def nbytes(self) -> dict[int, int]:
    """The parameter file's bytes per stored step."""
    d = golden_step_dir(self.workdir)
    return {s: os.path.getsize(os.path.join(d, f"{s}.npz"))
            for s in self.steps}

  def _metrics(self, step: int) -> tuple[float, float]:
    log = self._read_log()
    at = np.flatnonzero(log["step"] == int(step) + 1)
    if not at.size:
      raise PeatError(
          f"the golden log {self.workdir}/{_files.LOG_FILE} has no step "
          f"{int(step) + 1}, the step after checkpoint {step} whose "
          f"parameters {golden_step_dir(self.workdir)} keeps; the run was "
          "cut short. Fix: run the golden training again with resume "
          "(it completes the log), or delete that directory (playback "
          "then replays the golden step)")
    i = int(at[0])
    return float(log["loss"][i]), float(log["grad_norm"][i])

  def read(self, step: int, like) -> GoldenStep:
    """The stored golden step of checkpoint ``step``, checked.

    Args:
      step: a checkpoint step in :attr:`steps`.
      like: the parameters of the restored checkpoint (their tree, dtypes
        and shapes must be those stored).

    Returns:
      The :class:`GoldenStep`; its ``params`` have ``like``'s tree.

    Raises:
      PeatError: a missing, truncated or corrupt file, or parameters of
        another tree, dtype or shape than ``like`` (another task); the
        message names the file and the fix.
    """
    d = golden_step_dir(self.workdir)
    side_path = os.path.join(d, f"{int(step)}.json")
    fix = (f"Fix: delete {d} (playback then replays the golden step), or "
           "run the golden training again into a new directory.")
    try:
      with open(side_path, "rb") as f:
        side = json.loads(f.read())
      paths, meta, size = side["paths"], side["arrays"], int(side["bytes"])
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise PeatError(f"golden step file {side_path} is unreadable ({e}). "
                      f"{fix}") from e
    want = _paths(like)
    if paths != want:
      raise PeatError(
          f"golden step file {side_path} holds parameters {paths[:3]}... "
          f"({len(paths)} leaves), not those of the restored checkpoint "
          f"{want[:3]}... ({len(want)}): another task's golden run. {fix}")
    arrays = _files.load_arrays(
        os.path.join(d, f"{int(step)}.npz"), meta, size=size,
        label="golden step file",
        what=f"the parameters after checkpoint {step}'s next step", fix=fix)
    leaves, treedef = jax.tree.flatten(like)
    got = [arrays[f"p{i:05d}"] for i in range(len(leaves))]
    for p, x, y in zip(paths, got, leaves):
      if x.dtype != np.dtype(y.dtype) or x.shape != tuple(np.shape(y)):
        raise PeatError(
            f"golden step file {d}/{int(step)}.npz: {p} is {x.dtype}"
            f"{list(x.shape)}, the restored checkpoint's {np.dtype(y.dtype)}"
            f"{list(np.shape(y))}: another task's golden run. {fix}")
    loss, grad_norm = self._metrics(step)
    return GoldenStep(int(step), jax.tree.unflatten(treedef, got), loss,
                      grad_norm)


def stored_golden_steps(golden_dir: str | os.PathLike,
                        steps: Sequence[int]) -> GoldenSteps | None:
  """The golden run's stored steps where they cover every one of
  ``steps`` (playback then runs the KUT's step alone), else None (it
  replays the golden step at each).

  Args:
    golden_dir: the golden run's workdir or its checkpoint directory.
    steps: the checkpoint steps to play.
  """
  stored = GoldenSteps(os.path.dirname(_files.checkpoint_dir_of(golden_dir)))
  return stored if stored.covers(steps) else None
