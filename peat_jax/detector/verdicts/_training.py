"""Training-level rules: a noise ratio rising over training, and weights
moved beyond the bf16 proxy.

Both read records of a whole campaign rather than one signature:

* :func:`noise_trend`: errors that depend on the training state (FP8 with
  growing outliers, a kernel whose error grows with the magnitude of the
  weights) show as a site's noise ratio rising from checkpoint to
  checkpoint. "Rises" is a test of magnitude over all checkpoints, not of
  one noisy step: with at least :data:`TREND_MIN_STEPS` checkpoint steps,
  the Theil-Sen line of ``log10(noise ratio)`` against the step (the median
  of the slopes of every pair of steps) grows by at least
  :data:`TREND_FACTOR` from the first to the last checkpoint, and still
  does with any single step left out.
* :func:`weights_verdict`: runtime FI moves the weights, measured in units
  of a bf16-proxy run (``vs_bf16``, :mod:`peat_jax.profiler.runtime_fi._significance`);
  beyond :data:`BF16_PROXY_LIMIT` the KUT changes training more than
  training one format below the model's own precision does, which warns.
  The other way round, :func:`benign_far_below`: a warn that only benign
  records decided (``exact``/``reordering`` beyond the golden kernel's
  noise envelope: another correct order of the same arithmetic) passes
  when the KUT moves the weights at most :data:`BENIGN_TRAINING_LIMIT` of
  the proxy; the report states the ratio.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: A site's noise ratio "rises" when its fitted growth over the checkpoints
#: is at least this factor ...
TREND_FACTOR = 2.0
#: ... measured on at least this many checkpoint steps.
TREND_MIN_STEPS = 4
#: ``vs_bf16`` above this (the KUT moves the weights more than the bf16
#: proxy) warns.
BF16_PROXY_LIMIT = 1.0
#: A warn decided only by benign records passes when every runtime run
#: moves the weights at most this fraction of the precision proxy (ten
#: times below the line where a precision change starts to count).
BENIGN_TRAINING_LIMIT = 0.1


def _theil_sen_growth(x: np.ndarray, y: np.ndarray, span: float) -> float:
  """The Theil-Sen slope of (x, y) times ``span``."""
  i, j = np.triu_indices(len(x), 1)
  return float(np.median((y[j] - y[i]) / (x[j] - x[i])) * span)


def noise_trend(steps: Sequence[int], ratios: Sequence[float | None]
                ) -> dict:
  """Whether a site's noise ratio rises over the checkpoint steps.

  Args:
    steps: checkpoint steps.
    ratios: the site's noise ratio at each step (None, NaN, Inf and values
      <= 0 are left out: exact records have no ratio to grow).

  Returns:
    ``{"rises": bool, "factor": float | None, "factor_loo": float | None,
    "from_step": int | None, "to_step": int | None, "points": int}``:
    ``factor`` the fitted growth from the first to the last usable step,
    ``factor_loo`` the smallest growth with one step left out.
  """
  pts = sorted((int(s), float(r)) for s, r in zip(steps, ratios)
               if r is not None and math.isfinite(float(r)) and float(r) > 0)
  out = {"rises": False, "factor": None, "factor_loo": None,
         "from_step": pts[0][0] if pts else None,
         "to_step": pts[-1][0] if pts else None, "points": len(pts)}
  if len(pts) < 2 or pts[0][0] == pts[-1][0]:
    return out
  x = np.array([p[0] for p in pts], np.float64)
  y = np.log10([p[1] for p in pts])
  span = x[-1] - x[0]
  out["factor"] = 10 ** _theil_sen_growth(x, y, span)
  if len(pts) < TREND_MIN_STEPS:
    return out
  keep = np.ones(len(x), bool)
  loo = []
  for k in range(len(x)):
    keep[k] = False
    loo.append(_theil_sen_growth(x[keep], y[keep], span))
    keep[k] = True
  out["factor_loo"] = 10 ** min(loo)
  out["rises"] = bool(out["factor"] >= TREND_FACTOR
                      and out["factor_loo"] >= TREND_FACTOR)
  return out


def weights_verdict(vs_bf16: float | None) -> str:
  """``"warn"`` when the KUT moves the weights beyond the precision proxy
  (or the ratio is NaN: a NaN never passes), else ``"pass"`` (also without
  a measurement)."""
  if vs_bf16 is None:
    return "pass"
  if math.isnan(float(vs_bf16)) or float(vs_bf16) > BF16_PROXY_LIMIT:
    return "warn"
  return "pass"


def benign_far_below(vs_proxy: Sequence[float | None]) -> bool:
  """Whether benign records' training effect is far below the yardstick.

  Args:
    vs_proxy: every runtime run's weight distance in units of the
      precision proxy (``vs_bf16``).

  Returns:
    True when there is at least one measurement and every one is finite
    and at most :data:`BENIGN_TRAINING_LIMIT` (a missing or NaN ratio
    never passes).
  """
  vals = list(vs_proxy)
  if not vals:
    return False
  for v in vals:
    if v is None or not math.isfinite(float(v)):
      return False
    if float(v) > BENIGN_TRAINING_LIMIT:
      return False
  return True
