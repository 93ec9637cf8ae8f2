"""Relative errors against a floor: the tensor's scale.

An element's relative error ``|t - g| / |g|`` is absurd where golden is
near zero (a value of 1e-38 off by 1e-7 is "1e+31 relative"), and such
elements decide a maximum or an RMS. Reported relative errors take each
element's error relative to ``max(|g|, RMS of golden)``: below the
tensor's scale an error counts against the scale. From the signature's
fields this is bounded by ``min(relative, absolute / RMS of golden)`` for
the maximum and for the RMS alike (each element's floored ratio is at
most both), which is what :func:`relative_to_scale` returns.
"""

from __future__ import annotations

import math
from typing import Any, Mapping


def relative_to_scale(s: Mapping[str, Any]) -> dict[str, float]:
  """The maximum and RMS relative error with the tensor's scale as floor.

  Args:
    s: a signature's scalar fields (``Signature._asdict()`` or a record's
      ``signature``): ``rel_max``, ``rel_rms``, ``abs_max``, ``abs_rms``,
      ``golden_rms``.

  Returns:
    ``{"rel_max": ..., "rel_rms": ...}``: each the smaller of the plain
    relative figure and the absolute one over golden's RMS; NaN where a
    figure is NaN (never a smaller number in its place), and the plain
    relative figure where golden's RMS is zero or not finite.
  """
  scale = float(s["golden_rms"])
  out = {}
  for k in ("max", "rms"):
    rel, ab = float(s[f"rel_{k}"]), float(s[f"abs_{k}"])
    if math.isnan(rel) or math.isnan(ab):
      out[f"rel_{k}"] = math.nan
    elif scale > 0 and math.isfinite(scale):
      out[f"rel_{k}"] = min(rel, ab / scale)
    else:
      out[f"rel_{k}"] = rel
  return out
