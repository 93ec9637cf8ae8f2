"""``.npz`` files of named arrays whose dtypes, shapes and bytes are checked.

Arrays are stored uncompressed (``np.savez``). Dtypes numpy cannot store
(``bfloat16``, the fp8 formats) are stored as unsigned integers of the same
width; the caller keeps each array's real dtype, shape and SHA-256 (the
``meta`` :func:`arrays_bytes` returns, in an index or a sidecar file), and
:func:`load_arrays` checks all three. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from peat_jax.core import PeatError


def storable(a: np.ndarray) -> np.ndarray:
  """``a``, or its bits as unsigned ints when numpy cannot save its dtype."""
  if a.dtype.type.__module__ == "numpy" and a.dtype.kind != "V":
    return a
  return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def sha256(a: np.ndarray) -> str:
  """SHA-256 (hex) of an array's C-order bytes."""
  return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def arrays_bytes(arrays: Mapping[str, Any]) -> tuple[bytes, dict]:
  """Serializes named arrays to ``.npz`` bytes.

  Args:
    arrays: ``{name: array}`` (host or device arrays).

  Returns:
    ``(file bytes, {name: {"dtype", "shape", "sha256"}})``.
  """
  # order="C", not np.ascontiguousarray: that one makes a 0-d array 1-d.
  host = {k: np.asarray(v, order="C") for k, v in arrays.items()}
  meta = {k: {"dtype": str(v.dtype), "shape": list(v.shape),
              "sha256": sha256(v)} for k, v in host.items()}
  buf = io.BytesIO()
  np.savez(buf, **{k: storable(v) for k, v in host.items()})
  return buf.getvalue(), meta


def write_file(path: str, data: bytes) -> None:
  """Writes ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def load_arrays(path: str, meta: Mapping[str, Mapping[str, Any]], *,
                size: int | None, label: str, what: str,
                fix: str) -> dict[str, np.ndarray]:
  """Loads the arrays of a file :func:`arrays_bytes` wrote, checked.

  Args:
    path: the file.
    meta: ``{name: {"dtype", "shape", "sha256"}}`` as written.
    size: the file's size in bytes as written (None: not checked).
    label: what kind of file it is, before its path in messages
      (``"capture file"``).
    what: what it holds, for messages (``"the record of site ..."``).
    fix: the sentence that says how to repair it.

  Returns:
    ``{name: array}`` with the stored dtypes and shapes.

  Raises:
    PeatError: missing, truncated or corrupt file, or an array whose dtype,
      shape or SHA-256 differs from ``meta``; the message names the file.
  """
  if not os.path.exists(path):
    raise PeatError(f"{label} {path} is missing; expected {what}. {fix}")
  got = os.path.getsize(path)
  if size is not None and got != size:
    raise PeatError(f"{label} {path} has {got} bytes; expected {size}: truncated or "
                    f"replaced. {fix}")
  out = {}
  try:
    with np.load(path, allow_pickle=False) as z:
      for name, m in meta.items():
        raw = z[name]
        dtype = jnp.dtype(m["dtype"])
        a = raw if raw.dtype == dtype else raw.view(dtype)
        if list(a.shape) != list(m["shape"]):
          raise PeatError(f"array {name!r} has shape {list(a.shape)}, "
                          f"expected {m['shape']}")
        if sha256(a) != m["sha256"]:
          raise PeatError(f"array {name!r} has another SHA-256 than the "
                          "index records")
        out[name] = a
  except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError,
          PeatError) as e:
    raise PeatError(f"{label} {path} is corrupt ({e}); expected {what}. {fix}"
                    ) from e
  return out
