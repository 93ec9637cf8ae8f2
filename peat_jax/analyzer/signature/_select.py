"""The exact median of a large host array, in a few vectorized passes.

``np.median`` partitions a copy of the whole array (introselect, ~10 ns an
element here). The port probe takes the median of a ratio over every
element of a record, a few times per site and checkpoint, and stores it:
it must be exactly ``np.median``'s value. :func:`median` first brackets the
middle order statistics with a strided sample, counts the elements below
the bracket and partitions only those inside it (a few thousand); where
the bracket misses (an adversarial order of the values), it falls back to
``np.median``. Either way the value is ``np.median``'s, bit for bit: the
same order statistics, averaged the same way.
"""

from __future__ import annotations

import math

import numpy as np

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
