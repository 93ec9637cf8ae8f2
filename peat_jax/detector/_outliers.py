"""The Detector's rules on the noise-aware decomposition: faults over noise.

A real port's own rounding moves most elements, so these rules never read
"the elements that differ": they read the *outliers*, the elements beyond
the rounding envelope of the signature's decomposition (calibrated on the
golden kernel's own error and on the KUT's own dense error;
``analyzer.signature._decompose``), and, for faults that move every element, the
dense statistics that predict them in magnitude:

* ``scale``: ``t - r = delta * r`` with one delta for every row, the fit's
  residual far below ``|delta|``;
* ``indexing``: the elements beyond the golden envelope hold, within it,
  golden values of other places (a shift, a transpose), or the outliers'
  values are their own references permuted, or they fill a trailing band of
  columns or rows (the last partial tile of a tiled kernel);
* ``zero``, ``lane`` (one lane of 32, whole aligned tiles), ``stuck_at``
  (one bit, one polarity, many elements), ``bitflip`` (few elements, each
  back inside the envelope after one or two bit flips), ``saturation``
  (clipped at a format's maximum), ``random_value`` (few outliers that no
  bit flip explains), ``ftz`` (every golden value below a format's smallest
  normal returned as zero), ``nan``.

Each rule returns Candidates; ``params["covers"]`` is how many elements
the cause explains.
"""

from __future__ import annotations

import math

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.signature._decompose import (
    MATCH_OUTLIERS, MULTI_FLIP_MIN_BITS)
from peat_jax.detector._facts import (
    Candidate, FORMAT_MAX, MIN_PATTERN, NARROW_FORMATS, PERMUTED_ERROR,
    _Facts, _pct, outliers_within_long_sum, working_sum_bound)

#: The ftz threshold of each narrow format: its smallest normal.
_MIN_NORMAL = {k: _core.FORMATS[k].min_normal for k in NARROW_FORMATS}
#: A sparse fault touches at most this share of the elements.
SPARSE_SHARE = 0.01
#: A shift / transpose / permutation needs this share of matches.
MATCH_SHARE = 0.9


def _covers(c: Candidate, n: int) -> Candidate:
  return c._replace(params={**c.params, "covers": int(n)})


def _rule_dense_faults(f: _Facts) -> list[Candidate]:
  """Faults that move every element: scale, shift, transpose, permutation."""
  s = f.s
  out = []
  delta, resid = float(s["fit_delta"]), float(s["fit_resid"])
  rows = np.asarray(s["row_delta"], np.float64)
  rerr = np.asarray(s["row_err"], np.float64)
  used = rows[rerr > 0] if np.any(rerr > 0) else rows
  spread = float(np.std(used)) if used.size else math.inf
  # In a 16-bit format the envelope (64 u: 0.25 relative in bf16) holds the
  # small elements in even under a halving; |delta| > 64 u is then itself
  # beyond any constant of the computation, and a scale need only push the
  # large elements out.
  beyond = 0.05 if f.u >= 2.0 ** -11 else 0.5
  # A normalizing sum of K terms in the working format may itself be off
  # by the working-sum level (one row of 2^20 softmax terms: 4e-5).
  if (math.isfinite(delta) and abs(delta) > max(64 * f.u,
                                                working_sum_bound(f))
      and resid <= 0.05 * abs(delta) and spread <= 0.05 * abs(delta)
      and f.beyond_share >= beyond):
    factor = 1.0 + delta
    kernel = str(f.context.get("kernel", ""))
    red = f.context.get("reduction")
    if kernel.split(":")[0] == "layer_norm" and red:
      for name, c in (("unbiased", math.sqrt((red - 1) / red)),
                      ("biased", math.sqrt(red / (red - 1)))):
        if abs(factor - c) <= 0.05 * abs(c - 1.0):
          out.append(_covers(Candidate(
              "parameter", 0.93,
              f"t = {factor:.6g} r (residual {resid:.2g}, per-row spread "
              f"{spread:.2g}): sqrt(({red} - 1) / {red})"
              f"{'' if name == 'unbiased' else '^-1'}, the "
              f"{name} variance where the model uses the other",
              {"constant": "variance", "factor": factor}), f.n))
          return out
    out.append(_covers(Candidate(
        "scale", 0.97,
        f"t - r = {delta:+.6g} r in every row (t = {factor:.6g} r; residual "
        f"{resid:.2g} and per-row spread {spread:.2g} far below "
        f"|{delta:.3g}|)", {"factor": factor}), f.n))
    return out
  n_cmp = int(s["out_shift_n"])
  if n_cmp >= MIN_PATTERN and f.beyond_share >= 0.05:
    tshare = float(s["out_transpose"])
    if tshare >= MATCH_SHARE:
      out.append(_covers(Candidate(
          "indexing", min(0.99, tshare),
          f"{_pct(tshare)} of the sampled elements beyond the rounding "
          f"envelope equal, within it, golden transposed (t[i, j] ~ "
          f"g[j, i]): a transposed layout", {"kind": "transpose"}),
          f.n_beyond))
    for axis in ("col", "row"):
      shares = np.asarray(s[f"out_shift_{axis}"], np.float64)
      mid = len(shares) // 2
      shares[mid] = 0.0
      k = int(np.argmax(shares))
      if shares[k] >= MATCH_SHARE:
        shift = k - mid
        out.append(_covers(Candidate(
            "indexing", min(0.99, float(shares[k])),
            f"{_pct(shares[k])} of the sampled elements beyond the rounding "
            f"envelope equal, within it, golden shifted by {shift} "
            f"{axis}s ({_pct(f.beyond_share)} of elements beyond it)",
            {"kind": "shift", "axis": "columns" if axis == "col" else "rows",
             "shift": shift}), f.n_beyond))
  matched, moved = int(s["n_out_matched"]), int(s["n_out_moved"])
  # Values moved to other places err by about the spread of the values
  # (a sizeable share of the RMS); an error a small fraction of the RMS
  # whose sorted values happen to line up among densely packed outputs is
  # not a permutation.
  far = float(s["out_abs_max"]) >= PERMUTED_ERROR * float(s["golden_rms"])
  if (2 <= matched == f.n_out and moved >= MATCH_SHARE * matched
      and int(s["n_out_zero"]) < 0.5 * f.n_out and far):
    out.append(_covers(Candidate(
        "indexing", 0.9,
        f"the {f.n_out} outliers hold each other's golden values (sorted, "
        f"{moved} of them equal their references within the envelope): "
        "values permuted among those places", {"kind": "permutation",
                                               "moved": f.n_out}), f.n_out))
  return out


def _band(v: np.ndarray) -> tuple[int, int] | None:
  """(first, width) of a trailing band holding every nonzero entry."""
  nz = np.nonzero(v)[0]
  size = v.shape[0]
  if not nz.size or size < 4:
    return None
  first = int(nz[0])
  if 0 < first and size - first <= size // 2:
    return first, size - first
  return None


def _rule_outliers(f: _Facts) -> list[Candidate]:
  """Faults confined to the outliers (sparse or structured)."""
  s = f.s
  n_out = f.n_out
  out = []
  zeros = int(s["n_out_zero"])
  flip1, flip2 = int(s["n_out_flip1"]), int(s["n_out_flip2"])
  newnf = int(s["n_nonfinite_new"])
  sparse = n_out <= max(MIN_PATTERN, SPARSE_SHARE * f.n)
  # Flushes first (mostly inside the envelope: flushed values are tiny):
  # every golden value below a format's smallest normal is zero in t, and
  # no other value is.
  tiny = np.asarray(s["n_tiny"], np.int64)
  tiny_z = np.asarray(s["n_tiny_zeroed"], np.int64)
  zeroed = int(s["n_zeroed"])
  for i in np.argsort([-_MIN_NORMAL[k] for k in NARROW_FORMATS],
                      kind="stable"):
    fmt = NARROW_FORMATS[i]
    # A zero fault at random positions lands on tiny values only with
    # probability (tiny / n) ** zeroed: below 2**-7 (as MIN_PATTERN's 8
    # coin flips) one flushed value among few tiny ones is a pattern.
    chance = (tiny[i] / max(f.n, 1)) ** max(int(tiny_z[i]), 1)
    if (tiny[i] >= 1 and chance <= 2.0 ** -7 and tiny_z[i] >= 0.95 * tiny[i]
        and zeroed <= tiny_z[i] and (not n_out or zeros >= 0.9 * n_out)):
      out.append(_covers(Candidate(
          "ftz", 0.95 if tiny[i] >= MIN_PATTERN else 0.85,
          f"{int(tiny_z[i])} of the {int(tiny[i])} golden values below "
          f"{_MIN_NORMAL[fmt]:.3g} (the smallest normal of {fmt}) are zero in "
          f"t; the other elements are within rounding: subnormals flushed "
          f"in {fmt}", {"format": fmt, "flushed": int(tiny_z[i])}),
          int(tiny_z[i])))
      return out
  # A long sum's other order (docs/detector.md, "Verdict") can put a few
  # outputs beyond the golden envelope (those whose terms cancel) yet no
  # further from golden, at the output's scale, than its working-sum level:
  # no fault is confined to them.
  if outliers_within_long_sum(f):
    return out
  if not n_out:
    return []
  if newnf and newnf >= 0.9 * n_out:
    gmax = float(s["golden_absmax"])
    over = [k for k, m in FORMAT_MAX.items() if gmax > m and k != "bf16"]
    new_inf = max(int(s["n_inf_test"]) - int(s["n_inf_golden"]), 0)
    if new_inf == newnf and over and int(s["n_overflow"]) >= new_inf:
      fmt = min(over, key=lambda k: FORMAT_MAX[k])
      return [_covers(Candidate(
          "saturation", 0.9,
          f"{new_inf} elements became +-Inf where |golden| exceeds the "
          f"{fmt} maximum {FORMAT_MAX[fmt]:g}: a conversion overflowed",
          {"format": fmt, "to": "inf", "count": new_inf}), new_inf)]
    if sparse and flip1 + flip2 >= 0.9 * n_out:
      bits = _flipped_bits(f)
      out.append(_covers(Candidate(
          "bitflip", 0.97,
          f"{newnf} elements became NaN/Inf, each back within rounding "
          f"after flipping {_how_many_bits(f, flip2)}"
          f" (bits {bits[:8]}: {_fields(f, bits)})",
          {"count": n_out, "bits": bits}), n_out))
    out.append(_covers(Candidate(
        "nan", 0.96,
        f"{newnf} elements are NaN/Inf where golden is finite "
        f"({_pct(newnf / f.n)} of elements)", {"count": newnf}), newnf))
    return out
  for fmt, field in (("fp16", "n_saturated_fp16"),
                     ("fp8_e4m3", "n_saturated_fp8_e4m3")):
    count = int(s.get(field, 0))
    if count and count >= 0.5 * n_out:
      out.append(_covers(Candidate(
          "saturation", 0.95,
          f"{count} of {n_out} outliers are clipped at the {fmt} maximum "
          f"{FORMAT_MAX[fmt]:g} where |golden| is larger",
          {"format": fmt, "to": "max", "count": count}), count))
  cols = int(np.asarray(s["out_cols"]).shape[0])
  lanes = np.asarray(s["out_lane"], np.int64)
  lane = int(np.argmax(lanes))
  if n_out >= MIN_PATTERN and cols >= 64 and lanes[lane] >= 0.95 * n_out:
    what = "zeroed" if zeros >= 0.9 * n_out else "corrupted"
    out.append(_covers(Candidate(
        "lane", 0.95,
        f"{int(lanes[lane])} of {n_out} outliers sit in lane {lane} of 32 "
        f"(column index mod 32), the rest is within rounding; values there "
        f"are {what}", {"stride": 32, "lane": lane, "what": what}),
        int(lanes[lane])))
    return out
  full = np.asarray(s["out_tiles_all"], np.int64)
  anyt = np.asarray(s["out_tiles_any"], np.int64)
  if zeros >= 0.9 * n_out and _rounded_to_zero(s) is not None:
    return out  # outputs in a narrow format whose rounding made the zeros
  if zeros >= 0.9 * n_out:
    where = f"{zeros} elements"
    rows = np.asarray(s["out_rows"], np.int64)
    full_rows = int(np.sum(rows == cols))
    params = {"count": zeros}
    if full_rows and full_rows * cols >= 0.9 * zeros:
      where, params["rows"] = f"{full_rows} whole rows", full_rows
    else:
      for i, ts in enumerate((8, 16, 32)):
        if full[i] and full[i] * ts * ts >= 0.9 * zeros:
          where = f"{int(full[i])} whole {ts}x{ts} tiles"
          params.update(tiles=int(full[i]), tile=ts)
    out.append(_covers(Candidate(
        "zero", 0.95,
        f"{zeros} of {n_out} outliers are 0 where golden is not ({where}); "
        f"every other element is within rounding: missed writes", params),
        zeros))
    return out
  for i, ts in enumerate((8, 16, 32)):
    if (n_out >= MIN_PATTERN and full[i] and full[i] == anyt[i]
        and full[i] * ts * ts >= 0.9 * n_out):
      out.append(_covers(Candidate(
          "lane", 0.9,
          f"the {n_out} outliers fill {int(full[i])} aligned {ts}x{ts} "
          "tiles, every element of each: tile corruption",
          {"tile": ts, "tiles": int(full[i])}), n_out))
      return out
  band = _band(np.asarray(s["out_cols"])) or None
  if n_out >= MIN_PATTERN and band is not None:
    first, width = band
    out.append(_covers(Candidate(
        "indexing", 0.9,
        f"every outlier lies in the last {width} columns ({first}..{cols - 1}"
        f" of {cols}), far beyond rounding there: the last partial tile is "
        "indexed wrongly", {"kind": "tile_edge", "axis": "columns",
                           "first": first, "band": width}), n_out))
    return out
  flips = np.asarray(s["out_flip_bits"], np.int64)
  ups = np.asarray(s["out_flip_up"], np.int64)
  k = int(np.argmax(flips))
  if (n_out >= MIN_PATTERN and flip1 >= 0.9 * n_out and flips[k] >= 0.95 *
      flips.sum()):
    polarity = 1 if ups[k] >= 0.95 * flips[k] else (
        0 if ups[k] <= 0.05 * flips[k] else None)
    if polarity is not None:
      out.append(_covers(Candidate(
          "stuck_at", 0.95,
          f"{flip1} of {n_out} outliers are back within rounding after "
          f"flipping bit {k} ({f.field_of_bit(k)}), which is {polarity} in "
          f"every one of them: a stuck-at-{polarity} bit",
          {"bit": k, "polarity": polarity, "count": n_out}), n_out))
      return out
  if sparse and flip1 + flip2 >= 0.9 * n_out:
    bits = _flipped_bits(f)
    out.append(_covers(Candidate(
        "bitflip", 0.93,
        f"{n_out} outliers ({_pct(n_out / f.n)}), each back within rounding "
        f"after flipping {_how_many_bits(f, flip2)} "
        f"(bits {bits[:8]}: {_fields(f, bits)}); every other element is "
        "within rounding", {"count": n_out, "bits": bits}), n_out))
    return out
  if sparse:
    out.append(_covers(Candidate(
        "random_value", 0.88,
        f"{n_out} outliers ({_pct(n_out / f.n)}) hold values no flip of "
        f"{_max_flips(f)} or fewer bits explains (max error "
        f"{float(s['out_abs_max']):.3g}, "
        f"{float(s['out_abs_max']) / max(float(s['golden_rms']), 1e-300):.3g}"
        " x RMS golden); every other element is within rounding",
        {"count": n_out}), n_out))
  return out


def _rounded_to_zero(s) -> str | None:
  """The narrow format the outputs are in (``repr_test`` >= 0.99) whose
  rounding sends every zeroed golden value to zero (each at most its
  smallest subnormal), or None: such zeros are that precision's, not
  missed writes."""
  zmax = float(s["zeroed_golden_absmax"])
  rep = np.asarray(s["repr_test"], np.float64)
  for i, fmt in enumerate(NARROW_FORMATS):
    fm = _core.FORMATS[fmt]
    if rep[i] >= 0.99 and zmax <= fm.min_normal * 2.0 ** -fm.mantissa_bits:
      return fmt
  return None


def _max_flips(f: _Facts) -> int:
  """The most bit flips the decomposition tried on each outlier."""
  return 3 if f.nbits >= MULTI_FLIP_MIN_BITS else 2


def _how_many_bits(f: _Facts, flip2: int) -> str:
  if not flip2:
    return "one bit"
  return "one to three bits" if _max_flips(f) == 3 else "one or two bits"


def _flipped_bits(f: _Facts) -> list[int]:
  """The bit positions of the flips: each one-flip outlier's bit, and the
  bits that at least half the gathered outliers differ in above the
  outlier envelope (``2**k`` ulps beyond ``env_theta`` units: rounding
  noise of the base moves only the bits below it), which a multi-bit
  upset's outliers share."""
  s = f.s
  one = {int(k) for k in np.nonzero(np.asarray(s["out_flip_bits"]))[0]}
  xor = np.asarray(s["out_bits_xor"], np.int64)
  counted = max(min(f.n_out, MATCH_OUTLIERS), 1)
  floor = math.log2(max(float(s["env_theta"]), 1.0))
  high = {k for k in range(xor.shape[0])
          if xor[k] >= 0.5 * counted and (k >= f.mant or k > floor)}
  return sorted(one | high)


def _fields(f: _Facts, bits) -> str:
  return ", ".join(sorted({f.field_of_bit(k) for k in bits})) or "none"
