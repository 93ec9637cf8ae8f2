"""Degenerate statistics: figures that cannot clear a record.

A record whose derived figures are NaN, infinite or 0/0 (a zero scale,
outputs so small that ``u * scale`` underflows, golden values far below the
output's scale flushed to zero) has not been measured against rounding:
whatever model its other statistics name, it never passes. These rules
say what was degenerate, in numbers.
"""

from __future__ import annotations

import math

import numpy as np

from peat_jax import core as _core
from peat_jax.detector._facts import Candidate, Diagnosis, _Facts

#: A zero where golden holds a value below this many units of roundoff of
#: the output's RMS, squared (u^2 x RMS), is a flushed tiny output: the
#: residue a cancelling sum leaves is a multiple of its terms' last place,
#: at least u times their scale, so no other order of the sum zeroes a
#: value u times smaller than that (float32: 3.6e-15 of the RMS).
TINY_FLUSH_POWER = 2


def tiny_flush_bound(f: _Facts) -> float:
  """The golden magnitude below which a zeroed output is a flush
  (``u ** TINY_FLUSH_POWER x`` the golden RMS)."""
  return f.u ** TINY_FLUSH_POWER * float(f.s["golden_rms"])


def _rule_tiny_flush(f: _Facts) -> list[Candidate]:
  """Outputs far below the output's scale returned as zero (``ftz``):
  every zeroed golden value is below :func:`tiny_flush_bound`, a zero no
  rounding of the data's scale gives (rows of ~1e-37 in a float32
  output of RMS ~1, or an output whose whole scale underflows)."""
  s = f.s
  zeroed = int(s["n_zeroed"])
  zmax = float(s.get("zeroed_golden_absmax", math.inf))
  bound = tiny_flush_bound(f)
  if not zeroed or not (0.0 < zmax < bound) or zeroed < 0.5 * f.ndiff:
    return []
  return [Candidate(
      "ftz", 0.9,
      f"{zeroed} of {f.ndiff} differing elements are zero where golden holds "
      f"values up to {zmax:.3g}, below u({f.work})^{TINY_FLUSH_POWER} x the "
      f"golden RMS = {bound:.3g} (no rounding of the output's scale zeroes "
      f"them): tiny outputs flushed to zero",
      {"format": "tiny", "flushed": zeroed, "largest": zmax,
       "covers": zeroed})]


def degenerate(f: _Facts) -> list[str]:
  """The derived figures of a differing record that are degenerate, each
  as ``name (why)``; empty when every figure is measured."""
  s = f.s
  if not f.ndiff:
    return []
  out = []
  grms = float(s["golden_rms"])
  tiny = _core.FORMATS[f.work].min_normal
  if not math.isfinite(grms) or grms == 0.0:
    out.append(f"golden RMS {grms:.3g} (a zero or non-finite scale)")
  elif grms * f.u < tiny:
    out.append(f"golden RMS {grms:.3g} below tiny / u({f.work}) = "
               f"{tiny / f.u:.3g} (u x scale underflows: errors there are "
               "below the smallest normal number)")
  figures = {"median relative error": f.rel_med}
  if f.has_ref:
    figures["noise ratio"] = f.noise_ratio
  if f.dec:
    figures.update({"envelope theta": f.theta,
                    "golden envelope": f.theta_g,
                    "median z of the KUT": f.zmed_t})
  out += [f"{name} {value}" for name, value in figures.items()
          if not np.isfinite(value)]
  return out


def never_benign(diag: Diagnosis, f: _Facts) -> Diagnosis:
  """A passing diagnosis of a record with degenerate figures warns, its
  evidence naming them."""
  if diag.verdict != "pass" or diag.model == "exact":
    return diag
  found = degenerate(f)
  if not found:
    return diag
  return diag._replace(
      verdict="warn",
      evidence=f"{diag.evidence}; degenerate statistics, not measured "
      f"against rounding: {'; '.join(found)} (a record that cannot be "
      "judged never passes)")
