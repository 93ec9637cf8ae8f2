"""The worker process of :mod:`peat_jax.profiler.isolation._isolate` (``python -m`` entry point).

``python -m peat_jax.profiler.isolation._isolate_worker <job fd> <message fd> <parent pid>``
reads one pickled job ``{"module", "function", "kwargs"}`` from the job pipe,
calls the function, a generator, and sends each event it yields to the
parent as a length-prefixed pickle on the message pipe, then ``("end",)``.
Failures are messages too: ``("oom", text)`` for a MemoryError or an XLA
RESOURCE_EXHAUSTED error, ``("error", exception or text, traceback)`` for
anything else. A crash or hang needs no message: the parent sees the exit
status or its time limit.

The worker dies with its parent (``PR_SET_PDEATHSIG``), so a campaign killed
with SIGKILL leaves no worker behind. It never writes campaign files: the
parent is the only writer.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import pickle
import signal
import struct
import sys
import traceback

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
  try:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):
    pass  # not Linux: the parent's kill of the process group remains
  if os.getppid() != parent:  # the parent died before prctl took effect
    os._exit(1)  # pylint: disable=protected-access


def _read_all(fd: int) -> bytes:
  chunks = []
  while True:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      break
    chunks.append(chunk)
  os.close(fd)
  return b"".join(chunks)


def _is_oom(err: BaseException) -> bool:
  return isinstance(err, MemoryError) or "RESOURCE_EXHAUSTED" in str(err)


def main(argv: list[str]) -> int:
  job_fd, msg_fd, parent = (int(a) for a in argv[1:4])
  _die_with_parent(parent)
  faulthandler.enable(all_threads=False)
  out = os.fdopen(msg_fd, "wb", buffering=0)

  def send(*message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(struct.pack(">Q", len(data)) + data)

  job = pickle.loads(_read_all(job_fd))
  try:
    fn = getattr(importlib.import_module(job["module"]), job["function"])
    for event in fn(**job["kwargs"]):
      send(*event)
    send("end")
  except Exception as err:  # pylint: disable=broad-except
    tb = traceback.format_exc()
    if _is_oom(err):
      send("oom", f"{type(err).__name__}: {err}")
    else:
      try:
        pickle.loads(pickle.dumps(err))
        send("error", err, tb)
      except Exception:  # pylint: disable=broad-except
        send("error", f"{type(err).__name__}: {err}", tb)
  out.close()
  sys.stderr.flush()
  # Skip interpreter teardown (background threads of jax and Orbax): the
  # parent has everything it needs.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  sys.exit(main(sys.argv))
