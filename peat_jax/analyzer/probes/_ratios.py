"""The per-metric ratio view of a signature: the KUT's error against the
float64 reference over the golden kernel's, metric by metric.

This is the view kernel teams report beside the cause (docs/signature.md,
"The ratio view"): for each metric, how many times the golden kernel's own
error the KUT's is. A ratio near 1 is the golden kernel's rounding; the
Detector names the cause, these say how large it is.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

__all__ = ["RATIO_METRICS", "metric_ratios"]

#: metric -> what it is (the keys of :func:`metric_ratios`).
RATIO_METRICS = {
    "rmse": "RMS of |t - r| over RMS of |g - r|",
    "mean_rel": "mean relative error of t over g's",
    "max_rel": "max relative error of t over g's (|r| above the small-value "
               "threshold)",
    "small_err": "share of small values (|r| below 1e-6 for float32, 1e-3 "
                 "for 16-bit formats) with an absolute error above 1/16 of "
                 "the threshold, t over g",
    "bias": "error balance of t, sum(t - r) / sum|t - r| in [-1, 1]",
    "beyond_ulps": "share of elements of t more than 32 ulps (float32) or 1 "
                   "ulp (16-bit) from r",
    "nonfinite_mismatch": "elements where NaN/Inf of t and g differ (not 0: "
                          "a hard fail)",
}


def _ratio(a: float, b: float) -> float:
  """a / b, with 0 / 0 = 1 (equal errors) and x / 0 = inf."""
  if not (math.isfinite(a) and math.isfinite(b)):
    return math.nan
  if b == 0:
    return 1.0 if a == 0 else math.inf
  return a / b


def metric_ratios(signature: Mapping[str, Any]) -> dict[str, float]:
  """The ratio view of one record's signature.

  Args:
    signature: a single-record Signature as a mapping of host values (a
      site record's ``"signature"``, or ``sig._asdict()`` after
      ``jax.device_get``).

  Returns:
    ``{metric: value}`` over :data:`RATIO_METRICS`; the ratios are NaN
    without a float64 reference. ``bias`` and ``beyond_ulps`` are the KUT's
    own values, ``nonfinite_mismatch`` a count.
  """
  s = {k: np.asarray(v) for k, v in signature.items()
       if k in _FIELDS}
  get = lambda k: float(s[k]) if k in s else math.nan
  has_ref = "has_reference" in s and bool(s["has_reference"])
  n = get("n")
  out = dict.fromkeys(RATIO_METRICS, math.nan)
  out["nonfinite_mismatch"] = (int(get("n_nonfinite_mismatch"))
                               if "n_nonfinite_mismatch" in s else 0)
  if not has_ref:
    return out
  out["rmse"] = _ratio(get("ref_test_abs_rms"), get("ref_golden_abs_rms"))
  out["mean_rel"] = _ratio(get("ref_test_rel_mean"), get("ref_golden_rel_mean"))
  out["max_rel"] = _ratio(get("rel_max_test"), get("rel_max_golden"))
  out["small_err"] = _ratio(get("n_small_err_test"), get("n_small_err_golden"))
  out["bias"] = get("balance_test")
  out["beyond_ulps"] = get("n_ulps_test") / n if n > 0 else math.nan
  return out


_FIELDS = frozenset((
    "n", "has_reference", "ref_test_abs_rms", "ref_golden_abs_rms",
    "ref_test_rel_mean", "ref_golden_rel_mean", "rel_max_test",
    "rel_max_golden", "n_small_err_test", "n_small_err_golden",
    "balance_test", "n_ulps_test", "n_nonfinite_mismatch"))
