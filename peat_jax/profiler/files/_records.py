"""Campaign record files: append-only streams of small, checksummed records.

Records hold small numbers only (signature scalars, the ULP and bit-position
histograms, the diagnosis), never arrays of activations. A record file is an
append-only stream of msgpack objects, fsync'ed after each append. Each
record is framed as one msgpack ext object (type 0x50, ext32 header) whose
data is the CRC-32 of the record's msgpack bytes followed by those bytes, so
any msgpack reader still parses the file and a flipped byte is detected.
An unframed object is damage too (or a file of an older peat_jax).

What a reader does with damage (docs/reliability.md):

* a record cut short at the end of the file (a crash mid-append) is dropped;
  the next append truncates it away first, so nothing is appended after
  garbage;
* anything else (a bad checksum, bytes that are no record, a frame that
  claims more bytes than follow while intact records come after it) raises
  :class:`RecordFileError` naming the file, the byte offset and how many
  good records precede it; the file is left as it is
  (:func:`repair_records` keeps the good records when the user asks);
* a failed append (ENOSPC, EIO, ...) truncates the file back to its previous
  end, so every earlier record stays readable, and raises
  :class:`RecordFileError` naming the file and the fix.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import threading
import zlib
from typing import Any, Sequence

import msgpack
import numpy as np

from peat_jax.profiler.files import _layout
from peat_jax import detector as _detector
from peat_jax.core import PeatError

PLAYBACK_FILE = _layout.PLAYBACK_FILE
RUNTIME_FILE = _layout.RUNTIME_FILE

#: msgpack ext type of a framed record: data = crc32 (4 bytes) + packb(record).
EXT_TYPE = 0x50
_EXT32 = 0xC9
_HEADER = 6  # 0xc9, uint32 length, int8 type


class RecordFileError(PeatError):
  """A record file is corrupt, or an append to it failed."""


def pack_record(record: dict) -> bytes:
  """One record's bytes in the file: an ext32 frame with a CRC-32.

  Args:
    record: a msgpack-ready mapping.

  Returns:
    ``0xc9 | len (uint32) | 0x50 | crc32(payload) | payload``.
  """
  payload = msgpack.packb(record, use_bin_type=True)
  data = struct.pack(">I", zlib.crc32(payload)) + payload
  return struct.pack(">BIB", _EXT32, len(data), EXT_TYPE) + data


def _unframe(data: bytes) -> dict | None:
  """The record of a frame's data, or None when its checksum is wrong."""
  if len(data) < 4:
    return None
  crc, payload = struct.unpack(">I", data[:4])[0], data[4:]
  if zlib.crc32(payload) != crc:
    return None
  rec = msgpack.unpackb(payload, raw=False, strict_map_key=False)
  return rec if isinstance(rec, dict) else None


def _intact_frame_after(buf: bytes, start: int) -> int | None:
  """Offset of the first intact framed record at or after ``start``."""
  pos = buf.find(bytes([_EXT32]), start)
  while pos >= 0 and pos + _HEADER <= len(buf):
    n, typ = struct.unpack(">IB", buf[pos + 1:pos + _HEADER])
    if typ == EXT_TYPE and pos + _HEADER + n <= len(buf):
      try:
        if _unframe(buf[pos + _HEADER:pos + _HEADER + n]) is not None:
          return pos
      except (ValueError, msgpack.exceptions.UnpackException):
        pass
    pos = buf.find(bytes([_EXT32]), pos + 1)
  return None


def _scan(path: str, buf: bytes) -> tuple[list[dict], int]:
  """Decodes a record file's bytes.

  Returns:
    ``(records, end)``: the good records and the byte offset where they end
    (``len(buf)`` unless a torn last record follows).

  Raises:
    RecordFileError: corruption anywhere but a torn last record.
  """
  # max_buffer_size=0: no size limit (2**32 - 1), so that a frame whose
  # length runs past the end reads as torn, not as an oversized object.
  unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                              max_buffer_size=0)
  unpacker.feed(buf)
  out: list[dict] = []
  end = 0

  def corrupt(why: str) -> RecordFileError:
    return RecordFileError(
        f"record file {path} is corrupt at byte {end} of {len(buf)} (after "
        f"{len(out)} good records): {why}. Nothing was changed. Fix: restore "
        "the file from a copy, or keep the good records with "
        f"`python -c \"from peat_jax.profiler.files._records import repair_records; "
        f"repair_records('{path}')\"` (the original is kept as "
        f"{os.path.basename(path)}.corrupt) and run the campaign again to "
        "redo what it held.")

  while True:
    try:
      obj = unpacker.unpack()
    except msgpack.OutOfData:
      break
    except (ValueError, msgpack.exceptions.UnpackException) as err:
      raise corrupt(f"undecodable bytes ({type(err).__name__}: {err})") from err
    if isinstance(obj, msgpack.ExtType):
      if obj.code != EXT_TYPE:
        raise corrupt(f"ext type {obj.code:#x}, expected {EXT_TYPE:#x}")
      try:
        rec = _unframe(obj.data)
      except (ValueError, msgpack.exceptions.UnpackException):
        rec = None
      if rec is None:
        raise corrupt("checksum mismatch")
      obj = rec
    else:
      raise corrupt(f"an unframed msgpack {type(obj).__name__} where a "
                    "framed record was expected (damage, or a file written "
                    "by an older peat_jax)")
    out.append(obj)
    end = unpacker.tell()
  if end < len(buf):
    # Bytes left that do not complete an object: a record torn by a crash
    # mid-append, unless intact records follow (then a length was damaged).
    after = _intact_frame_after(buf, end + 1)
    if after is not None:
      raise corrupt(f"a record whose length runs past an intact record at "
                    f"byte {after}")
  return out, end


def _read_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


# Good end offset of files this process appended to, keyed by path: the
# next append skips the scan for a torn tail when the file is unchanged.
_KNOWN_END: dict[str, tuple[int, int, int]] = {}
# One writer per file across threads too: a campaign's playback and runtime
# drivers run side by side (``campaigns._campaign``) and may both append to
# the findings file.
_APPEND_LOCK = threading.Lock()


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
  return (st.st_ino, st.st_size, st.st_mtime_ns)


def _io_error(path: str, what: str, err: OSError, kept: str) -> RecordFileError:
  name = errno.errorcode.get(err.errno or 0, "OSError")
  fix = ("free disk space (or move the campaign directory to a disk with "
         "room)" if err.errno in (errno.ENOSPC, errno.EDQUOT)
         else "fix the cause named above")
  return RecordFileError(
      f"cannot {what} record file {path}: {err.strerror or err} ({name}). "
      f"{kept} Fix: {fix}, then run the same command again: the campaign "
      "resumes where it stopped.")


def append_records(path: str, records: Sequence[dict]) -> None:
  """Appends records to ``path`` and fsyncs (one record file writer only).

  A torn record at the end of the file (a crash mid-append) is truncated
  away first. A failed write truncates the file back to where it ended.

  Raises:
    RecordFileError: the file is corrupt (nothing is appended), or the
      append failed (ENOSPC, ...); the file keeps its earlier records.
  """
  with _APPEND_LOCK:
    _append_records(os.fspath(path), records)


def _append_records(path: str, records: Sequence[dict]) -> None:
  data = b"".join(pack_record(r) for r in records)
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  try:
    st = os.fstat(fd)
    size = st.st_size
    key = os.path.abspath(path)
    if size and _KNOWN_END.get(key) != _stamp(st):
      _, good = _scan(path, _read_bytes(path))
      if good < size:
        os.ftruncate(fd, good)
        size = good
    try:
      view = memoryview(data)
      while view:
        view = view[os.write(fd, view):]
      os.fsync(fd)
    except OSError as err:
      try:
        os.ftruncate(fd, size)
      except OSError:
        pass
      _KNOWN_END.pop(key, None)
      raise _io_error(path, f"append {len(records)} records to", err,
                      "The file was truncated back to its earlier records, "
                      "which are intact.") from err
    _KNOWN_END[key] = _stamp(os.fstat(fd))
  finally:
    os.close(fd)


def read_records(path: str | os.PathLike) -> list[dict]:
  """Reads an append-only record file (missing file: no records).

  A truncated last record (a crash mid-write) is dropped.

  Raises:
    RecordFileError: the file is corrupt anywhere else (naming the file,
      the byte offset and the fix); nothing is dropped silently.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    return []
  return _scan(path, _read_bytes(path))[0]


def rewrite_records(path: str, records: Sequence[dict]) -> None:
  """Atomically replaces ``path`` with exactly ``records``.

  Raises:
    RecordFileError: the new file could not be written (ENOSPC, ...); the
      old file is unchanged.
  """
  path = os.fspath(path)
  tmp = path + ".tmp"
  try:
    with open(tmp, "wb") as f:
      f.write(b"".join(pack_record(r) for r in records))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as err:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise _io_error(path, "rewrite", err,
                    "The file was not changed.") from err
  _KNOWN_END.pop(os.path.abspath(path), None)


def repair_records(path: str | os.PathLike) -> int:
  """Keeps the good records before the first damage; drops the rest.

  The original file is copied to ``<path>.corrupt`` (for inspection), and
  ``path`` keeps the records before the first damaged byte. Use it when :func:`read_records` reports corruption and redoing the
  lost records is acceptable (a campaign redoes them when run again).

  Args:
    path: the record file.

  Returns:
    How many records were kept.
  """
  path = os.fspath(path)
  buf = _read_bytes(path)
  good: list[dict] = []
  unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                              max_buffer_size=0)
  unpacker.feed(buf)
  while True:
    try:
      obj = unpacker.unpack()
      obj = (_unframe(obj.data) if isinstance(obj, msgpack.ExtType)
             and obj.code == EXT_TYPE else None)
    except (msgpack.OutOfData, ValueError,
            msgpack.exceptions.UnpackException):
      break
    if not isinstance(obj, dict):
      break
    good.append(obj)
  if len(good) == 0 and not buf:
    return 0
  shutil.copyfile(path, path + ".corrupt")
  rewrite_records(path, good)
  return len(good)


def _num(x) -> Any:
  a = np.asarray(x)
  if a.dtype == bool:
    return bool(a)
  if np.issubdtype(a.dtype, np.integer):
    return int(a)
  return float(a)


def signature_record(sig) -> dict:
  """The scalar fields of a Signature plus ulp_hist, bits_xor, rel_pct."""
  s = _detector.host_signature(sig)
  rec = {}
  for k, v in zip(s._fields, s):
    if np.ndim(v) == 0:
      rec[k] = _num(v)
  for k in ("ulp_hist", "bits_xor", "rel_pct", "abs_pct"):
    rec[k] = np.asarray(getattr(s, k)).tolist()
  return rec


def record_backward(record: dict) -> str:
  """A record's ``backward`` setting: ``"golden"`` when it has none.

  Records of ``backward="kut"`` campaigns hold ``"backward": "kut"``;
  forward-only records (and every record written before the setting
  existed) hold no field.
  """
  return record.get("backward", "golden")


def of_campaign(record: dict, kut_spec: str, backward: str) -> bool:
  """Whether a record belongs to the KUT ``kut_spec`` with ``backward``."""
  return (record.get("kut") == kut_spec
          and record_backward(record) == backward)


def tag_backward(record: dict, backward: str) -> dict:
  """``record`` with ``"backward"`` set when it is not ``"golden"``."""
  if backward != "golden":
    record["backward"] = backward
  return record
