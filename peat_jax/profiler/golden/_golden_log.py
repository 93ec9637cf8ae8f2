"""A golden run's per-step log (``log.msgpack``): one msgpack record per
optimizer step, written together with each checkpoint."""

from __future__ import annotations

import math
import os
from typing import Any

import msgpack
import numpy as np

from peat_jax.core import PeatError
from peat_jax.profiler import files as _files

LOG_FIELDS = ("step", "loss", "grad_norm", "update_norm")


def _append_log(path: str, records: list[dict[str, float]]) -> None:
  with open(path, "ab") as f:
    for record in records:
      f.write(msgpack.packb(record))
    f.flush()
    os.fsync(f.fileno())


def _read_records(path: str) -> list[dict[str, Any]]:
  records = []
  with open(path, "rb") as f:
    unpacker = msgpack.Unpacker(f, raw=False)
    try:
      for record in unpacker:
        records.append(record)
    except (msgpack.ExtraData, msgpack.FormatError, ValueError) as e:
      raise PeatError(f"log {path} is corrupt after record {len(records)}: "
                      f"{e}; delete it and re-run golden training") from e
  return records


def _truncate_log(path: str, last_step: int) -> None:
  """Keeps the records of steps <= ``last_step`` (atomic rewrite)."""
  if not os.path.exists(path):
    return
  # A record torn by a kill is at the end: keep what decodes.
  records = []
  with open(path, "rb") as f:
    unpacker = msgpack.Unpacker(f, raw=False)
    try:
      records.extend(unpacker)
    except Exception:  # pylint: disable=broad-except
      pass
  kept = [r for r in records if isinstance(r, dict) and
          r.get("step", math.inf) <= last_step]
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    for r in kept:
      f.write(msgpack.packb(r))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_log(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Reads a golden run's per-step log.

  Args:
    path: ``<workdir>/log.msgpack`` or the workdir itself.

  Returns:
    ``{"step": int64[n], "loss": float32[n], "grad_norm": float32[n],
    "update_norm": float32[n]}``, one entry per optimizer step; ``step`` is
    the step count *after* the update.

  Raises:
    PeatError: missing or corrupt log.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    path = os.path.join(path, _files.LOG_FILE)
  if not os.path.exists(path):
    raise PeatError(f"no golden log at {path}; run golden training first")
  records = _read_records(path)
  out = {}
  for field in LOG_FIELDS:
    dtype = np.int64 if field == "step" else np.float32
    out[field] = np.asarray([r[field] for r in records], dtype=dtype)
  return out
