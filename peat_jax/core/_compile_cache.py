"""A persistent cache of compiled executables, shared by processes.

A playback compiles dozens of executables before its first record: the
tapped and substituted steps, the float64 references, the screens, the
port probe's hypotheses and tries, a decomposition per flagged shape. A
fresh process (a campaign run again, a worker that takes over after a
crash, a site replayed alone, a CI job of a kernel repository) compiled
them all again. JAX's persistent compilation cache keeps each executable
on disk under a key of its program, compile options and backend; a later
process that traces the same program loads it instead of compiling it
(tracing and lowering still run). peat_jax's executables are many and
each is quick to compile (a fraction of a second to a few seconds), so
every one is kept, not only those over JAX's default of one second.

Executables with host callbacks (the PyTorch bridge's KUTs) are not kept
(JAX does not serialize them); a native KUT's custom call is looked up by
its target name when the executable is loaded, so a rebuilt library is
the one that runs.
"""

from __future__ import annotations

import os

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

from peat_jax.core._errors import PeatError

#: The environment variables JAX reads at start-up: a worker process
#: (isolation, scale-out) inherits the parent's cache through them.
_ENV_DIR = "JAX_COMPILATION_CACHE_DIR"
_ENV_MIN_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
#: The tools' default cache when ``--compilation_cache`` is not given.
ENV_DEFAULT = "PEAT_JAX_COMPILATION_CACHE"


def default_compilation_cache() -> str:
  """The tools' default cache directory: ``$PEAT_JAX_COMPILATION_CACHE``
  when set (empty: none), else ``$XDG_CACHE_HOME/peat_jax/xla`` (or
  ``~/.cache/peat_jax/xla``).

  Returns:
    The directory, or ``""`` for no cache.
  """
  if ENV_DEFAULT in os.environ:
    return os.environ[ENV_DEFAULT]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "peat_jax", "xla")


#: Whether this process chose its cache (use_compilation_cache called):
#: ensure_compilation_cache then leaves the choice alone, "off" included.
_CHOSEN: list[bool] = [False]


def ensure_compilation_cache() -> str | None:
  """The cache a library call compiles into: the one this process chose
  (:func:`use_compilation_cache`, or JAX's own ``jax_compilation_cache_dir``),
  else the tools' default (:func:`default_compilation_cache`), so that
  ``peat.playback``, ``peat.runtime`` and ``peat.fuzz`` called from a
  user's own script, a second call in one process and its isolated
  workers load what was compiled before instead of compiling it again.
  ``$PEAT_JAX_COMPILATION_CACHE=""`` (or ``use_compilation_cache(None)``)
  keeps every call off the disk.

  Returns:
    The directory in use, or None (no cache).

  Raises:
    PeatError: the default directory exists and is not a directory, or
      cannot be created or written (set ``$PEAT_JAX_COMPILATION_CACHE``
      to a writable directory, or to "" for none).
  """
  current = jax.config.jax_compilation_cache_dir
  if current or _CHOSEN[0]:
    return current or None
  default = default_compilation_cache()
  if not default:
    _CHOSEN[0] = True
    return None
  return use_compilation_cache(default)


def use_compilation_cache(path: str | os.PathLike | None) -> str | None:
  """Keeps this process's compiled executables in ``path`` and loads them
  from there; ``None`` or ``""`` turns the cache off.

  Worker processes started afterwards (isolated playback and runtime FI,
  scale-out) use the same directory. Call it before the work whose
  compilations should be kept; executables already compiled in this
  process are not written back.

  Args:
    path: a directory (created when missing), or None / ``""``.

  Returns:
    The absolute directory in use, or None.

  Raises:
    PeatError: ``path`` exists and is not a directory, or cannot be
      created or written.
  """
  _CHOSEN[0] = True
  if path is None or str(path) == "":
    _jax_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", None)
    os.environ.pop(_ENV_DIR, None)
    return None
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise PeatError(f"compilation cache {path}: exists and is not a "
                    "directory. Fix: name a directory, or pass "
                    "--compilation_cache= (empty) for no cache.")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise PeatError(f"compilation cache {path}: cannot be created ({e}). "
                    "Fix: name a writable directory, or pass "
                    "--compilation_cache= (empty) for no cache.") from e
  if not os.access(path, os.W_OK | os.X_OK):
    raise PeatError(f"compilation cache {path}: not writable. Fix: name a "
                    "writable directory, or pass --compilation_cache= "
                    "(empty) for no cache.")
  # A cache JAX already opened (or found off) keeps its state until reset.
  _jax_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  os.environ[_ENV_DIR] = path
  os.environ[_ENV_MIN_TIME] = "0"
  return path
