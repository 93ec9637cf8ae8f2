"""The exact median of a large array: on the host in a few vectorized
passes, or traced (:func:`medians_kept`).

``np.median`` partitions a copy of the whole array (introselect, ~10 ns an
element here). The port probe takes the median of a ratio over every
element of a record, a few times per site and checkpoint, and stores it:
it must be exactly ``np.median``'s value. :func:`median` first brackets the
middle order statistics with a strided sample, counts the elements below
the bracket and partitions only those inside it (a few thousand); where
the bracket misses (an adversarial order of the values), it falls back to
``np.median``. Either way the value is ``np.median``'s, bit for bit: the
same order statistics, averaged the same way.

:func:`medians_kept` is the same value traced, of many arrays at once, so
that playback's device tries bring home a scalar instead of a ratio
array: on CPU the native kernel (``peat_jax.kernels.median_kept``:
counts by the values' top bits, then a partition of the middle bins),
elsewhere a sort.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

#: Arrays up to this size go to np.median directly.
_SMALL = 1 << 14
#: Elements of the strided sample that brackets the median.
_SAMPLE = 4096
#: Half-width of the bracket, in standard deviations of the sample rank.
_SIGMAS = 8.0


def median(x: np.ndarray) -> float:
  """``float(np.median(x))`` of a 1-D NaN-free float array, exactly.

  Args:
    x: 1-D floating array without NaN (infinities allowed), not modified.

  Returns:
    The median: the middle order statistic, or the mean of the two middle
    ones for an even size, as ``np.median`` computes it (NaN when empty,
    as ``np.median`` with its warning silenced).

  Raises:
    ValueError: ``x`` is not 1-D.
  """
  if x.ndim != 1:
    raise ValueError(f"median of a {x.ndim}-D array; expected 1-D. Fix: "
                     "pass x.reshape(-1).")
  n = x.size
  if n <= _SMALL:
    if n == 0:
      return math.nan
    return float(np.median(x))
  ks = (n // 2 - 1, n // 2) if n % 2 == 0 else (n // 2,)
  s = np.sort(x[::max(n // _SAMPLE, 1)])
  m = s.size
  at = ks[0] / n * m
  margin = _SIGMAS * 0.5 * math.sqrt(m) + 2
  lo = s[max(int(at - margin), 0)]
  hi = s[min(int(at + margin) + 1, m - 1)]
  below = int(np.count_nonzero(x < lo))
  inside = x[(x >= lo) & (x <= hi)]
  if not (below <= ks[0] and ks[-1] < below + inside.size):
    return float(np.median(x))
  kth = [k - below for k in ks]
  vals = np.partition(inside, kth)[kth]
  return float(np.mean(vals))


def medians_kept(xs) -> jax.Array:
  """Medians of many float64 arrays' kept elements, traced (x64).

  ``np.median(x[~np.isnan(x)])`` of each array bit for bit (the mean of
  the two middle elements for an even count), +inf where nothing is kept.
  On CPU the native kernel, on other platforms a sort of each array (fast
  there; XLA:CPU's sort is not): where JAX runs on CPU alone the kernel
  is traced directly, otherwise `lax.platform_dependent` chooses when
  lowering.

  Args:
    xs: float64 arrays, NaN where an element is not kept; the kept ones
      non-negative (+inf allowed): ratios.

  Returns:
    float64[len(xs)], in order.
  """
  from peat_jax import kernels as _kernels  # pylint: disable=g-import-not-at-top
  from peat_jax.analyzer.signature._native import cpu_only  # pylint: disable=g-import-not-at-top

  xs = [x.reshape(-1) for x in xs]
  if cpu_only():
    return _kernels.median_kept(*xs)
  return lax.platform_dependent(
      *xs, cpu=lambda *a: _kernels.median_kept(*a),
      default=lambda *a: jnp.stack([_sorted_median(x) for x in a]))


def _sorted_median(x: jax.Array) -> jax.Array:
  """The median of a flat array's non-NaN elements by a sort (NaN sort
  last), as ``np.median`` averages the middle pair; +inf when none."""
  s = jnp.sort(x)
  m = jnp.sum(~jnp.isnan(x)).astype(jnp.int32)
  lo = s[jnp.maximum((m - 1) // 2, 0)]
  hi = s[jnp.maximum(m // 2, 0)]
  med = jnp.where(m % 2 == 1, hi, (lo + hi) / 2)
  return jnp.where(m == 0, jnp.inf, med)
