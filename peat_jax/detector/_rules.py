"""The Detector's structural rules: faults that leave exact traces.

Each rule returns a Candidate when its sufficient condition holds: single
bit positions, one polarity, periodic positions, golden values found in
other places, a constant ratio, non-finite values, clipping, zeros."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from peat_jax.analyzer.signature._decompose import MULTI_FLIP_MIN_BITS
from peat_jax.detector._facts import (
    BENIGN_NOISE_RATIO, Candidate, FORMAT_MAX, MIN_NORMAL, MIN_PATTERN,
    PERMUTED_ERROR, _Facts, _pct, long_sum_bound)

#: A lowest-bit difference on fewer than this share of the elements, within
#: the golden kernel's envelope, is another rounding of the last bit, not a
#: stuck bit (which changes about half the elements it touches).
STUCK_LOW_BIT_SHARE = 0.25


# ---------------------------------------------------------------------------
# Rules. Each returns a Candidate when its sufficient condition holds.
# ---------------------------------------------------------------------------


def _rule_nonfinite(f: _Facts) -> list[Candidate]:
  s = f.s
  new = int(s["n_nonfinite_new"])
  if not new:
    return []
  new_nan = max(int(s["n_nan_test"]) - int(s["n_nan_golden"]), 0)
  new_inf = max(int(s["n_inf_test"]) - int(s["n_inf_golden"]), 0)
  gmax = float(s["golden_absmax"])
  # Overflow to Inf: only Infs appear, and the golden output holds values
  # beyond a narrow format's maximum, so a conversion into it overflowed.
  over = [k for k, m in FORMAT_MAX.items() if gmax > m and k != "bf16"]
  if new_nan == 0 and new_inf > 0 and over and "n_overflow" in s and int(
      s["n_overflow"]) >= new_inf:
    fmt = min(over, key=lambda k: FORMAT_MAX[k])
    return [Candidate(
        "saturation", 0.9,
        f"{new_inf} elements became +-Inf where |golden| exceeds the "
        f"{fmt} maximum {FORMAT_MAX[fmt]:g} (max |golden| {gmax:.4g}): a "
        "conversion overflowed", {"format": fmt, "to": "inf",
                                  "count": new_inf})]
  out = []
  # A flip of one or two bits per differing element; of up to three
  # (32/64-bit records, MULTI_FLIP_MIN_BITS) where every differing element
  # became NaN/Inf (over a noisy base the average counts its bits too).
  flips = (3.0 if f.nbits >= MULTI_FLIP_MIN_BITS and f.ndiff == new
           else 2.0)
  if f.ndiff <= 0.25 * f.n and f.bits_per_diff <= flips:
    bits = [int(k) for k in np.nonzero(f.xor)[0]]
    out.append(Candidate(
        "bitflip", 0.98,
        f"{new} of {f.ndiff} differing elements became NaN/Inf by flipping "
        f"{f.bits_per_diff:.2g} bits each, at bit positions {bits[:8]} "
        f"({', '.join(sorted({f.field_of_bit(k) for k in bits}))})",
        {"count": f.ndiff, "bits": bits}))
  return out + [Candidate(
      "nan", 0.97,
      f"{new} elements are NaN/Inf where golden is finite ({new_nan} NaN, "
      f"{new_inf} Inf, {_pct(new / f.n)} of elements)",
      {"count": new, "nan": new_nan, "inf": new_inf})]


def _rule_saturation_clip(f: _Facts) -> list[Candidate]:
  s = f.s
  out = []
  for fmt, field in (("fp16", "n_saturated_fp16"),
                     ("fp8_e4m3", "n_saturated_fp8_e4m3")):
    count = int(s.get(field, 0))
    if count and count >= 0.5 * f.ndiff:
      out.append(Candidate(
          "saturation", 0.95,
          f"{count} of {f.ndiff} differing elements are clipped at the {fmt} "
          f"maximum {FORMAT_MAX[fmt]:g} where |golden| is larger",
          {"format": fmt, "to": "max", "count": count}))
  return out


def _rule_indexing(f: _Facts) -> list[Candidate]:
  s = f.s
  out = []
  tshare = float(s["transpose_share"])
  if tshare >= 0.9:
    out.append(Candidate(
        "indexing", min(0.99, tshare),
        f"t[i, j] == g[j, i] bitwise at {_pct(tshare)} of the sampled "
        f"nonzero elements that differ ({_pct(f.share)} of elements differ): "
        "a transposed layout",
        {"kind": "transpose"}))
  for axis in ("col", "row"):
    shares = s[f"shift_{axis}_share"]
    best = int(s[f"best_shift_{axis}"])
    if best and shares[best + (len(shares) // 2)] >= 0.9:
      sh = float(shares[best + len(shares) // 2])
      out.append(Candidate(
          "indexing", min(0.99, sh),
          f"t equals g shifted by {best} {axis}s bitwise at {_pct(sh)} of "
          f"the sampled nonzero elements that differ ({_pct(f.share)} of "
          "elements differ)",
          {"kind": "shift", "axis": "columns" if axis == "col" else "rows",
           "shift": best}))
  # Golden's multiset of bit patterns in other places is a permutation
  # only when the values moved far (about the values' spread); outputs
  # quantized to a 16-bit format hold many equal values, and a few of
  # them exchanging neighbouring values is rounding.
  far = float(s["abs_max"]) >= PERMUTED_ERROR * float(s["golden_rms"])
  if bool(s["is_permutation"]) and not out and far:
    out.append(Candidate(
        "indexing", 0.9,
        f"t holds exactly the multiset of golden bit patterns, in other "
        f"places ({_pct(f.share)} of elements moved)",
        {"kind": "permutation", "moved": f.ndiff}))
  return out


def _hot(v: np.ndarray) -> np.ndarray:
  """Indices whose value stands far above the typical one (>= 64x median)."""
  v = np.asarray(v, np.float64)
  base = float(np.median(v))
  if base > 0:
    return np.nonzero(v >= 64.0 * base)[0]
  return np.nonzero(v > 0)[0]


def _rule_edge(f: _Facts) -> list[Candidate]:
  """Errors confined to trailing rows/columns: a tile-edge index bug.

  Uses the per-column (per-row) mean |error|, so rounding noise elsewhere
  (a KUT with another summation order) does not hide the band: the band is
  the set of columns whose error is >= 64x the median column's.
  """
  s = f.s
  if f.ndiff < MIN_PATTERN:
    return []
  out = []
  for axis, field in (("columns", "col_abs_mean"), ("rows", "row_abs_mean")):
    v = s[field]
    size = v.shape[0]
    hit = _hot(v)
    if size < 4 or not len(hit) or len(hit) == size:
      continue
    first = int(hit[0])
    contiguous = len(hit) == size - first
    if contiguous and hit[-1] == size - 1 and 0 < first and (
        size - first <= size // 2):
      band = size - first
      mass = float(np.sum(v[hit]) / max(np.sum(v), 1e-300))
      out.append(Candidate(
          "indexing", 0.9,
          f"{_pct(mass)} of the error sits in the last {band} {axis} "
          f"({first}..{size - 1} of {size}), each >= 64x the median "
          f"{axis[:-1]}'s mean error: the last partial tile is indexed "
          "wrongly", {"kind": "tile_edge", "axis": axis, "first": first,
                      "band": band}))
  return out


def _rule_scale(f: _Facts) -> list[Candidate]:
  s = f.s
  scale = float(s["scale"])
  spread = float(s["scale_spread"])
  if f.share < 0.5 or not math.isfinite(scale):
    return []
  # t = c * g rounded: t/g varies by at most ~2u around c.
  if spread <= 8 * f.u and abs(scale - 1.0) > 8 * f.u:
    return [Candidate(
        "scale", 0.97,
        f"t / g is constant: {scale:.6g} (spread {spread:.2g} <= 8 u = "
        f"{8 * f.u:.2g}) over {_pct(f.share)} differing elements",
        {"factor": scale})]
  return []


def _rule_ftz(f: _Facts) -> list[Candidate]:
  s = f.s
  flushed = int(s["n_flushed"])
  if flushed and f.ndiff - flushed <= 0.05 * f.ndiff:
    return [Candidate(
        "ftz", 0.95,
        f"{flushed} of {f.ndiff} differing elements are golden subnormals "
        f"returned as zero ({int(s['n_golden_subnormal'])} golden "
        "subnormals in all)", {"flushed": flushed, "format": f.work})]
  zeroed = int(s["n_zeroed"])
  gmax = float(s.get("zeroed_golden_absmax", math.inf))
  if zeroed and zeroed >= 0.95 * f.ndiff:
    # Every zeroed value lies below a narrow format's smallest normal: a
    # flush of values that are subnormal in that format, not missed writes.
    fits = [k for k, m in MIN_NORMAL.items() if gmax < m]
    if fits:
      fmt = min(fits, key=lambda k: MIN_NORMAL[k])
      return [Candidate(
          "ftz", 0.96,
          f"{zeroed} of {f.ndiff} differing elements became 0 and all of "
          f"them are below {MIN_NORMAL[fmt]:.3g}, the smallest normal of "
          f"{fmt} (largest zeroed |golden| {gmax:.3g}): subnormals flushed "
          f"in {fmt}", {"flushed": zeroed, "format": fmt})]
  return []


def _rule_zero(f: _Facts) -> list[Candidate]:
  s = f.s
  zeroed = int(s["n_zeroed"])
  if not zeroed or zeroed < 0.9 * f.ndiff:
    return []
  params: dict[str, Any] = {"count": zeroed}
  rows = s["row_ndiff"]
  cols = s["col_ndiff"].shape[0]
  full_rows = int(np.sum(rows == cols))
  where = f"{zeroed} elements"
  if full_rows and full_rows * cols >= 0.9 * zeroed:
    params["rows"] = full_rows
    where = f"{full_rows} whole rows"
  else:
    tiles_all = s["tiles_all"]
    for i, ts in enumerate((8, 16, 32)):
      if tiles_all[i] and tiles_all[i] * ts * ts >= 0.9 * zeroed:
        params["tiles"] = int(tiles_all[i])
        params["tile"] = ts
        where = f"{int(tiles_all[i])} whole {ts}x{ts} tiles"
  return [Candidate(
      "zero", 0.95,
      f"{zeroed} of {f.ndiff} differing elements are 0 where golden is "
      f"nonzero ({where}): missed writes", params)]


def _rule_lane(f: _Facts) -> list[Candidate]:
  """Errors confined to one lane (column index mod 32).

  By count of differing elements, or, when rounding noise makes every
  element differ, by the share of the summed per-column mean |error|.
  """
  s = f.s
  cols = s["col_ndiff"].shape[0]
  if f.ndiff < MIN_PATTERN or cols < 64:
    return []
  lanes = s["lane_ndiff"].astype(np.int64)
  col_err = np.asarray(s["col_abs_mean"], np.float64)
  mass = np.bincount(np.arange(cols) % 32, weights=col_err, minlength=32)
  lane = int(np.argmax(lanes))
  in_lane = int(lanes[lane])
  if in_lane >= 0.95 * f.ndiff:
    how = (f"{in_lane} of {f.ndiff} differing elements sit in lane {lane} of "
           f"32 (column index mod 32); a uniform spread would put "
           f"{f.ndiff / 32:.3g} there")
  elif mass.sum() > 0 and mass.max() >= 0.95 * mass.sum():
    lane = int(np.argmax(mass))
    how = (f"{_pct(mass[lane] / mass.sum())} of the error mass sits in lane "
           f"{lane} of 32 (column index mod 32), the rest is rounding noise")
  else:
    return []
  what = ("zeroed" if int(s["n_zeroed"]) >= 0.9 * in_lane and in_lane else
          "non-finite" if int(s["n_nonfinite_new"]) >= 0.9 * in_lane and
          in_lane else "corrupted")
  return [Candidate("lane", 0.95, f"{how}; values there are {what}",
                    {"stride": 32, "lane": lane, "what": what})]


def _rule_tile(f: _Facts) -> list[Candidate]:
  s = f.s
  if f.ndiff < MIN_PATTERN:
    return []
  for i, ts in enumerate((8, 16, 32)):
    full = int(s["tiles_all"][i])
    anyd = int(s["tiles_any"][i])
    total = int(s["tiles_total"][i])
    if full and full == anyd and full * ts * ts >= 0.9 * f.ndiff and (
        full < total):
      return [Candidate(
          "lane", 0.9,
          f"every differing element lies in {full} of {total} aligned "
          f"{ts}x{ts} tiles, each wrong in every element: tile corruption",
          {"tile": ts, "tiles": full})]
  return []


def _rule_stuck(f: _Facts) -> list[Candidate]:
  s = f.s
  if f.ndiff < MIN_PATTERN:
    return []
  out = []
  for polarity, field in ((1, "bits_up"), (0, "bits_down")):
    v = s[field].astype(np.int64)
    k = int(np.argmax(v))
    others = f.xor.sum() - f.xor[k]
    if v[k] >= 0.95 * f.ndiff and f.xor[k] == v[k] and (
        others <= 0.05 * f.ndiff):
      if k == f.nbits - 1 and _tiny_at_scale(f):
        continue  # signs of values near zero: another formula's rounding
      if (k == 0 and f.has_ref and f.noise_ratio <= BENIGN_NOISE_RATIO
          and f.ndiff < STUCK_LOW_BIT_SHARE * f.n):
        continue  # the last bit rounded the other way, within the envelope
      out.append(Candidate(
          "stuck_at", 0.95,
          f"all {f.ndiff} differing elements differ only in bit {k} "
          f"({f.field_of_bit(k)}), always {1 - polarity}->{polarity}: a "
          f"stuck-at-{polarity} bit", {"bit": k, "polarity": polarity,
                                       "count": f.ndiff}))
  return out


#: Above this share of differing elements, errors no larger than
#: ROUNDING_ABS_ULPS units of roundoff of the golden RMS are rounding noise
#: (e.g. a 9-term convolution whose outputs near zero cancel), not flips.
SPARSE_MAX_SHARE_AT_ROUNDING = 0.01
ROUNDING_ABS_ULPS = 1024.0
#: Below this many units of roundoff of the golden RMS, no moved element is
#: a fault whatever its own ULP distance: a value near zero moved by many
#: of its own ULPs is still rounding at the output's scale (a float32
#: accumulator rounded to bf16 lands a few such values on the other side
#: of a rounding boundary; relative errors are taken against a floor).
SPARSE_MIN_SCALE_UNITS = 2.0


def _tiny_at_scale(f: _Facts) -> bool:
  """Every moved element moved by at most SPARSE_MIN_SCALE_UNITS units of
  roundoff of the golden RMS (and none became NaN/Inf)."""
  grms = float(f.s["golden_rms"]) or 1.0
  return (not int(f.s["n_nonfinite_new"])
          and float(f.s["abs_max"]) <= SPARSE_MIN_SCALE_UNITS * f.u * grms)


def _rule_sparse(f: _Facts, beyond_reordering: bool = False
                 ) -> list[Candidate]:
  """Few elements with errors far above rounding: bit flips or wild values.

  ``beyond_reordering``: the record's error is beyond what another
  summation order gives (noise ratio above REORDERING_ENVELOPE), so the
  cancellation-noise exemption below does not apply.
  """
  s = f.s
  if not f.ndiff or f.share > 0.25:
    return []
  # Rounding noise at working precision stays within a few ulps relative to
  # the output scale; a fault is far outside it.
  grms = float(s["golden_rms"]) or 1.0
  outlier = float(s["abs_max"]) / grms
  # Largest ULP distance: the top nonempty bucket k of ulp_hist holds
  # distances in [2**(k-1), 2**k). Rounding noise moves values by a few
  # ULPs; a flip of mantissa bit b moves one by exactly 2**b ULPs.
  hist = np.asarray(s["ulp_hist"])
  top = int(np.nonzero(hist)[0][-1]) if hist.any() else 0
  max_ulp = 2.0 ** (top - 1) if top else 0.0
  nonfinite = int(s["n_nonfinite_new"]) > 0
  if max_ulp < 8 and not nonfinite:
    return []  # within a few ULPs: rounding-sized, left to the level rules
  if not beyond_reordering and _tiny_at_scale(f):
    return []  # far from golden in its own ULPs only: rounding at scale
  bound = long_sum_bound(f)
  if not nonfinite and bound > 0 and outlier <= bound:
    return []  # within a long sum's level at the output's scale
  if (not nonfinite and not beyond_reordering
      and f.share > SPARSE_MAX_SHARE_AT_ROUNDING
      and outlier <= ROUNDING_ABS_ULPS * f.u):
    # Many elements differ, none by more than rounding of the output's
    # scale: a short reduction's cancellation noise (outputs near zero are
    # many of their own ULPs off), not faults; left to the level rules.
    return []
  bits = [int(k) for k in np.nonzero(f.xor)[0]]
  if f.bits_per_diff <= 3.0:
    fields = sorted({f.field_of_bit(k) for k in bits})
    return [Candidate(
        "bitflip", 0.9,
        f"{f.ndiff} elements ({_pct(f.share)}) differ in "
        f"{f.bits_per_diff:.2g} bits each on average, at bit positions "
        f"{bits[:8]} ({', '.join(fields)}); up to {max_ulp:.3g}+ ULPs, max "
        f"error {outlier:.3g} x RMS golden", {"count": f.ndiff, "bits": bits})]
  return [Candidate(
      "random_value", 0.85,
      f"{f.ndiff} elements ({_pct(f.share)}) hold unrelated values: "
      f"{f.bits_per_diff:.3g} of {f.nbits} bits differ per element, max "
      f"error {outlier:.3g} x RMS golden", {"count": f.ndiff})]
