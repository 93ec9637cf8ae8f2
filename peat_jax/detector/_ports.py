"""The Detector's port-mismatch rules: another constant, another closed form.

A cross-framework port often computes a slightly different function:

* ``parameter``: a constant of the computation differs (a normalization
  epsilon, the unbiased variance, a softmax temperature, a missing or
  doubled ``1/sqrt(d)``, a mask fill value). For a normalizing kernel such
  a constant scales each row by its own factor: ``t - r = delta_row * r``
  with a per-row fit whose residual is far below the error it explains;
* ``approximation``: another closed form of the same function (GELU's tanh
  form for erf, a polynomial exponential, an approximate reciprocal or
  rsqrt): the error is a function of the value alone (the share of the
  error's variance between bins of ``r``, ``value_r2``, is high), not the
  value-independent noise of rounding.

Both need the error to be systematically beyond rounding: the KUT's RMS
distance to the float64 reference is well above the golden kernel's
(``noise_ratio``). When the site's inputs were available, a *port probe*
(``context["port"]``, peat.analyzer.port_probe) evaluated the kernel's
known variants in float64 and names the constant or the form exactly; it
is preferred when it explains the output.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from peat_jax.detector._facts import (
    Candidate, NOISE_FLOOR_MULTIPLIER, UNIT_ROUNDOFF, _Facts,
    within_long_sum)

#: A per-row scale explains the error when the median row's residual is at
#: most this share of the row's error (0.3: 91% of its energy).
ROW_FIT_SHARE = 0.3
#: The error is a function of the value from this share of its variance.
VALUE_R2 = 0.6
#: A row factor follows the row statistic (a constant's effect) from this
#: absolute rank correlation; below it, an approximate reciprocal or rsqrt.
ROW_ORDER = 0.95
#: An approximation's error stays below this RMS share of the scale (a fast
#: exp or reciprocal: 1e-4 to 1e-2); beyond it, no closed form of the same
#: function.
APPROXIMATION_BOUND = 2.0 ** -4
#: The error must exceed the golden kernel's by this factor (RMS).
BEYOND_NOISE = 2 * NOISE_FLOOR_MULTIPLIER


def _probe(f: _Facts) -> list[Candidate]:
  port: Mapping[str, Any] | None = f.context.get("port")
  if not port or not port.get("explains"):
    return []
  model = port["model"]
  return [Candidate(model, 0.96, port["evidence"],
                    {k: v for k, v in port.items() if k not in (
                        "evidence", "model", "explains", "signature")})]


def _rule_port(f: _Facts) -> list[Candidate]:
  """``parameter`` / ``approximation`` of a dense error beyond rounding."""
  if not f.dec or not f.has_ref or within_long_sum(f):
    return []  # within a long working-precision sum: another order
  out = _probe(f)
  if out:
    return out
  if not f.noise_ratio > BEYOND_NOISE:
    return []
  s = f.s
  if float(np.max(s["repr_test"])) >= 0.99:
    return []  # outputs in a narrower format: precision, not a port's form
  err = np.asarray(s["row_err"], np.float64)
  res = np.asarray(s["row_resid"], np.float64)
  delta = np.asarray(s["row_delta"], np.float64)
  rows = err > 0
  level = f.rel_med
  port = f.context.get("port") or {}
  probed = bool(port) and not port.get("explains")
  if rows.sum() >= 2:
    share = float(np.median(res[rows] / err[rows]))
    d = delta[rows]
    same_sign = bool(np.all(d > 0) or np.all(d < 0))
    spread = float(np.std(d) / max(np.mean(np.abs(d)), 1e-300))
    if share <= ROW_FIT_SHARE and (spread > 0.05 or rows.sum() < 4):
      lo, hi = float(np.min(d)), float(np.max(d))
      side = ("one-sided " + ("shrink" if hi < 0 else "growth")
              if same_sign else "two-sided")
      seen = (f"t - r = delta_row * r: a per-row scale explains the error "
              f"(median residual {share:.2g} of it), {side}, delta_row in "
              f"[{lo:.3g}, {hi:.3g}] ({abs(np.median(d)) / f.u:.3g} "
              f"u({f.work})), {f.noise_ratio:.3g}x the golden noise floor")
      params = {"delta_min": lo, "delta_max": hi, "row_fit": share}
      order = port.get("row_order") if probed else None
      if order is not None and abs(order) >= ROW_ORDER:
        # A constant's effect on a normalization is a monotone function of
        # the row statistic it meets (eps / var, eps / std): the row factor
        # follows that statistic almost exactly.
        return [Candidate(
            "parameter", 0.86,
            f"{seen}, following the row statistic the kernel divides by "
            f"(rank correlation {order:+.2f}): a constant of the "
            "computation differs that the probe does not know (e.g. an "
            "epsilon added elsewhere)", {**params, "row_order": order})]
      if probed:
        shown = f"{order:+.2f}" if order is not None else "n/a"
        return [Candidate(
            "approximation", 0.86,
            f"{seen}; the row factor does not follow the row statistic the "
            f"kernel divides by as a constant's effect would (rank "
            f"correlation {shown}), and no constant the probe fitted "
            f"explains it ({port.get('name')}: ratio "
            f"{port.get('ratio', math.nan):.2g}): an approximate "
            "reciprocal or rsqrt", {**params, "row_order": order})]
      return [Candidate(
          "parameter", 0.84,
          f"{seen}: a constant of the computation differs (e.g. a "
          "normalization epsilon; without the site's inputs an approximate "
          "reciprocal is not ruled out)", params)]
  r2 = float(s["value_r2"])
  if math.isfinite(r2) and r2 >= VALUE_R2:
    return [Candidate(
        "approximation", 0.85,
        f"the error is a function of the value ({r2:.0%} of its variance "
        f"between bins of r), median relative error {level:.3g} "
        f"({level / f.u:.3g} u({f.work})), {f.noise_ratio:.3g}x the golden "
        "noise floor: another closed form of the same function",
        {"value_r2": r2})]
  # An error at the rounding level of bf16 or fp16 is a computation in
  # that format (a kernel that computes in bf16 and casts back), which the
  # level rules name; a closed form's error is not tied to a format's u.
  narrow = any(0.25 * UNIT_ROUNDOFF[k] <= level <= 2.0 * UNIT_ROUNDOFF[k]
               for k in ("bf16", "fp16"))
  if probed and not narrow and float(s["in_rel_rms"]) <= APPROXIMATION_BOUND:
    return [Candidate(
        "approximation", 0.75,
        f"a dense, bounded error beyond rounding (RMS {float(s['in_rel_rms']):.3g} "
        f"of the scale, {f.noise_ratio:.3g}x the golden noise floor) that "
        "neither a constant nor an input precision the probe tried "
        f"explains ({', '.join(port.get('tried', []))}; best "
        f"{port.get('name')}, ratio {port.get('ratio', math.nan):.2g}): "
        "another closed form of the same function",
        {"tried": list(port.get("tried", []))})]
  return []


def port_verdict(f: _Facts) -> str:
  """``warn`` within bf16's unit roundoff of the reference (RMS, relative
  to the row's scale), else ``fail``."""
  level = float(f.s["in_rel_rms"]) if f.dec else f.rel_rms
  return "warn" if level <= UNIT_ROUNDOFF["bf16"] else "fail"
