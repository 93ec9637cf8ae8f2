"""This process's memory mappings against the kernel's limit.

Every XLA:CPU executable maps its JIT-compiled code in about six regions
and keeps them while a jit cache holds it. Linux allows
``vm.max_map_count`` mappings per process (65,530 by default); at the
limit the next compilation's mmap fails inside LLVM and the process dies
with SIGSEGV or SIGABRT, with nothing to catch and nothing written. Loops
that compile without bound (a calibration over thousands of shapes, a
test suite in one process) call `release_compiled` between their units of
work; what the caches held is compiled again when next used, to the same
code.
"""

from __future__ import annotations

import gc

import jax

from peat_jax.core._errors import PeatError

_MAPS = "/proc/self/maps"
_LIMIT = "/proc/sys/vm/max_map_count"


def mapping_use() -> tuple[int, int]:
  """The memory mappings of this process and the kernel's limit on them.

  Returns:
    ``(mappings, limit)``; ``(0, 0)`` where ``/proc`` does not tell (not
    Linux).
  """
  try:
    with open(_MAPS, "rb") as f:
      n = sum(1 for _ in f)
    with open(_LIMIT, encoding="ascii") as f:
      return n, int(f.read())
  except (OSError, ValueError):
    return 0, 0


def release_compiled(fraction: float = 0.5) -> bool:
  """Clears JAX's caches once this process uses ``fraction`` of its limit.

  Args:
    fraction: share of ``vm.max_map_count`` above which the caches are
      cleared, in (0, 1].

  Returns:
    Whether the caches were cleared (never where ``/proc`` does not tell).

  Raises:
    PeatError: ``fraction`` outside (0, 1].
  """
  if not 0.0 < fraction <= 1.0:
    raise PeatError(f"fraction={fraction!r}: expected a share of the "
                    "mapping limit in (0, 1], e.g. 0.5")
  n, limit = mapping_use()
  if not limit or n <= fraction * limit:
    return False
  jax.clear_caches()
  gc.collect()
  return True
