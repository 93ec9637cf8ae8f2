"""Wall time of the phases of one checkpoint's playback (for benchmarks).

A :class:`Laps` given to ``Player.play(..., timings=laps)`` adds the
seconds of each phase under its name; with it, every phase waits for its
device work, so that the time is charged where it is spent (without it,
nothing waits and nothing is timed).
"""

from __future__ import annotations

import time
from typing import Any

import jax


class Laps:
  """Accumulates seconds per phase name (``.seconds``)."""

  def __init__(self):
    self.seconds: dict[str, float] = {}
    self._t = time.perf_counter()

  def start(self) -> None:
    """Starts the next lap now."""
    self._t = time.perf_counter()

  def lap(self, name: str, wait: Any = None) -> None:
    """Ends a lap: waits for ``wait`` (arrays), adds the time to ``name``."""
    if wait is not None:
      jax.block_until_ready(wait)
    now = time.perf_counter()
    self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
    self._t = now


class NoLaps:
  """The default: no waiting, no timing."""

  def start(self) -> None:
    pass

  def lap(self, name: str, wait: Any = None) -> None:
    del name, wait


NO_LAPS = NoLaps()
