"""``campaign_lock``: one writer per campaign directory (fcntl.flock)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator

from peat_jax.core import PeatError
from peat_jax.profiler.files._layout import LOCK_FILE


@contextlib.contextmanager
def campaign_lock(directory: str) -> Iterator[None]:
  """Holds ``<directory>/.lock`` (fcntl.flock), or raises PeatError.

  Raises:
    PeatError: another campaign holds the lock.
  """
  os.makedirs(directory, exist_ok=True)
  f = open(os.path.join(directory, LOCK_FILE), "a+")
  try:
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
      raise PeatError(
          f"campaign directory {directory} is locked by another campaign "
          f"(expected no other writer; got a held {LOCK_FILE}). Fix: wait "
          "for it to finish or use another --campaign_dir.") from err
    yield
  finally:
    f.close()
