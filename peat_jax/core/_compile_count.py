"""Counting XLA compilations: what a campaign compiles, and what it loads.

JAX records one ``/jax/core/compile/backend_compile_duration`` event per
executable it obtains from the backend, whether compiled or loaded from
the persistent cache (which also records ``cache_hits``): the difference
is what was compiled. :class:`count_compilations` counts both while it is
open, so a test can hold a campaign to "no new compilation after its
first checkpoint" and a benchmark can say what the compilations cost.
"""

from __future__ import annotations

import threading

from jax import monitoring

#: JAX's event per executable obtained (compiled or loaded from disk).
_BACKEND_EVENT = "/jax/core/compile/backend_compile_duration"
#: JAX's event per executable loaded from the persistent cache.
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class count_compilations:  # noqa: N801 (a context manager, used as a call)
  """Counts the XLA compilations of the code it encloses.

  Example::

    with peat.core.count_compilations() as c:
      peat.playback(task, golden_dir, kut)
    c.compiled, c.loaded, c.seconds

  Attributes:
    compiled: executables compiled (not found in the persistent cache).
    loaded: executables loaded from the persistent cache.
    seconds: wall seconds of both (compiling, or reading the cache).
  """

  def __init__(self):
    self.obtained = 0
    self.loaded = 0
    self.seconds = 0.0
    self._lock = threading.Lock()

  @property
  def compiled(self) -> int:
    return self.obtained - self.loaded

  def _duration(self, event: str, secs: float, **_) -> None:
    if event == _BACKEND_EVENT:
      with self._lock:
        self.obtained += 1
        self.seconds += float(secs)

  def _event(self, event: str, **_) -> None:
    if event == _HIT_EVENT:
      with self._lock:
        self.loaded += 1

  def __enter__(self) -> "count_compilations":
    monitoring.register_event_duration_secs_listener(self._duration)
    monitoring.register_event_listener(self._event)
    return self

  def __exit__(self, *exc) -> None:
    monitoring.unregister_event_duration_listener(self._duration)
    monitoring.unregister_event_listener(self._event)
