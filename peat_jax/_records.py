"""Campaign record files: append-only msgpack streams of small records.

Records hold small numbers only (signature scalars, the ULP and bit-position
histograms, the diagnosis), never arrays of activations. A record file is an
append-only stream of msgpack maps, fsync'ed after each append; a reader
drops a truncated last record (a crash mid-write).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import msgpack
import numpy as np

from peat_jax import _detector

PLAYBACK_FILE = "playback.msgpack"
RUNTIME_FILE = "runtime.msgpack"


def append_records(path: str, records: Sequence[dict]) -> None:
  """Appends records to ``path`` and fsyncs (one record file writer only)."""
  with open(path, "ab") as f:
    for r in records:
      f.write(msgpack.packb(r, use_bin_type=True))
    f.flush()
    os.fsync(f.fileno())


def read_records(path: str | os.PathLike) -> list[dict]:
  """Reads an append-only msgpack record file (missing file: no records).

  A truncated last record (a crash mid-write) is dropped.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    return []
  out = []
  with open(path, "rb") as f:
    unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
    try:
      for r in unpacker:
        out.append(r)
    except (msgpack.exceptions.ExtraData, ValueError,
            msgpack.exceptions.UnpackException):
      pass
  return out


def rewrite_records(path: str, records: Sequence[dict]) -> None:
  """Atomically replaces ``path`` with exactly ``records``."""
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    for r in records:
      f.write(msgpack.packb(r, use_bin_type=True))
  os.replace(tmp, path)


def _num(x) -> Any:
  a = np.asarray(x)
  if a.dtype == bool:
    return bool(a)
  if np.issubdtype(a.dtype, np.integer):
    return int(a)
  return float(a)


def signature_record(sig) -> dict:
  """The scalar fields of a Signature plus ulp_hist, bits_xor, rel_pct."""
  s = jax.device_get(sig)
  rec = {}
  for k, v in zip(s._fields, s):
    if np.ndim(v) == 0:
      rec[k] = _num(v)
  for k in ("ulp_hist", "bits_xor", "rel_pct", "abs_pct"):
    rec[k] = np.asarray(getattr(s, k)).tolist()
  return rec


def diagnosis_of(rec: dict) -> _detector.Diagnosis:
  """Rebuilds a Diagnosis (without candidates) from a stored record."""
  d = rec["diagnosis"]
  return _detector.Diagnosis(d["model"], d["confidence"], d["evidence"], {},
                             (), d["verdict"])
