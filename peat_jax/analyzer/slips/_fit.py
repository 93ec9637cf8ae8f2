"""Fitting one constant of a kernel to the KUT's output.

A constant slip (another epsilon, a temperature, a rotary base, label
smoothing) is found by refitting the constant: the value whose family
output is closest to the KUT's (:func:`distance`), by a scan over its
range refined by a golden-section search (one evaluation per step).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

#: Points of the first scan, and golden-section steps after it (the
#: bracket shrinks by 0.618 a step: 28 steps cut a scan interval of two
#: steps by 7e5, a constant to ~1e-5 of itself on a log scan of 11
#: points over 25 decades).
SCAN_POINTS = 11
REFINE_STEPS = 28
#: A port writes its constants as round numbers (1e-5, 0.1, 5e5): a fit
#: takes its value rounded to this many significant digits where that
#: value is as close to the KUT (within ROUND_LOSS of the fit's loss).
ROUND_DIGITS = 2
ROUND_LOSS = 1.01
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


#: The share of the largest differences a fit leaves out: a sparse fault
#: on top of the port (a few random values, flipped exponents) would
#: otherwise outweigh the constant's effect on every other element.
TRIM = 0.02


def distance(h: np.ndarray, t: np.ndarray, fin: np.ndarray) -> float:
  """Mean ``|h - t|`` over the finite elements but the largest TRIM share
  (inf where ``h`` is not finite there): a sparse fault on top does not
  move the fit, and a slip that moves a few percent of the elements
  still moves the mean (a median would not see it)."""
  with np.errstate(invalid="ignore", over="ignore"):
    d = np.abs(np.asarray(h, np.float64) - t)[fin]
  if not d.size or not np.all(np.isfinite(d)):
    return math.inf
  keep = d.size - int(TRIM * d.size)
  if keep < d.size:
    d = np.partition(d, keep - 1)[:keep]
  return float(np.mean(d))


def fit_scalar(loss: Callable[[float], float], lo: float, hi: float, *,
               log: bool) -> tuple[float, float]:
  """The value in ``[lo, hi]`` that minimizes ``loss`` (a scan, then a
  golden-section search around its best point), on a log scale where
  ``log``.

  Returns:
    ``(value, loss at it)``.
  """
  to = (lambda v: math.log(v)) if log else (lambda v: v)
  back = math.exp if log else (lambda u: u)
  a, b = to(lo), to(hi)
  grid = np.linspace(a, b, SCAN_POINTS)
  seen = {}

  def f(u: float) -> float:
    if u not in seen:
      try:
        seen[u] = loss(back(u))
      except (FloatingPointError, ValueError, ZeroDivisionError):
        seen[u] = math.inf
      if not math.isfinite(seen[u]):
        seen[u] = math.inf
    return seen[u]

  errs = [f(float(u)) for u in grid]
  i = int(np.argmin(errs))
  lo_u, hi_u = grid[max(i - 1, 0)], grid[min(i + 1, SCAN_POINTS - 1)]
  c, d = hi_u - _PHI * (hi_u - lo_u), lo_u + _PHI * (hi_u - lo_u)
  fc, fd = f(c), f(d)
  for _ in range(REFINE_STEPS):
    if fc < fd:
      hi_u, d, fd = d, c, fc
      c = hi_u - _PHI * (hi_u - lo_u)
      fc = f(c)
    else:
      lo_u, c, fc = c, d, fd
      d = lo_u + _PHI * (hi_u - lo_u)
      fd = f(d)
  best = min(seen, key=seen.get)
  value, err = back(best), seen[best]
  rounded = float(f"{value:.{ROUND_DIGITS - 1}e}")
  if rounded != value and math.isfinite(err):
    try:
      r_err = loss(rounded)
    except (FloatingPointError, ValueError, ZeroDivisionError):
      r_err = math.inf
    if r_err <= ROUND_LOSS * err:
      return rounded, r_err
  return value, err
