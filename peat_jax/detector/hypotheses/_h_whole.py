"""Hypotheses read on the whole record: exact traces that hold on any noise,
and the faults of a record without a decomposition (no reference).

NaN/Inf where golden is finite, golden's bit patterns in other places (a
transpose, a shift, a permutation), a constant ratio (a scale), zeros of
flushed tiny values or of missed writes, one lane, whole tiles, a
trailing band, one bit forced one way, a few elements a few bits off.
Each function tests one hypothesis and returns its
:class:`~peat_jax.detector.facts.Found` (or nothing).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from peat_jax.detector.facts import (
    Flips, Flushed, Form, Found, Lane, Moved, NonFinite, Replaced, Saturated,
    Scaled, Stuck, Zeroed)
from peat_jax.detector.facts import (
    FORMAT_MAX, MIN_NORMAL, UNIT_ROUNDOFF, Facts, long_sum_bound, pct,
    working_sum_bound)

#: Tile edges of the Analyzer's tile counts.
TILES = (8, 16, 32)


def _i(x) -> int:
  return int(np.asarray(x))


def _f(x) -> float:
  return float(np.asarray(x))


def _bits(f: Facts) -> list[int]:
  return [int(k) for k in np.nonzero(f.xor)[0]]


#: An evidence sentence lists at most this many line indices (a range
#: beyond: a display length, not a threshold).
LISTED_LINES = 4


def _span(idx: np.ndarray) -> str:
  """Line indices as a short list, or a range when they are many."""
  idx = [int(i) for i in idx]
  if len(idx) <= LISTED_LINES:
    return str(idx)
  return f"{idx[0]}..{idx[-1]} ({len(idx)} of them)"


def nonfinite_where(f: Facts) -> str:
  """Where the new NaN/Inf are: their rows and columns where the record
  tells them apart (every outlier non-finite; without a decomposition,
  every differing element), else the outliers' rows and columns they lie
  among; and whether they sit in the last partial 8x8 tile (rows or
  columns beyond the last multiple of 8)."""
  s = f.sig
  if f.dec and f.n_out:
    rows, cols = np.asarray(s.out_rows), np.asarray(s.out_cols)
    among = "" if f.new_nonfinite >= f.n_out else "among the outliers, "
  elif not f.dec and f.ndiff == f.new_nonfinite:
    rows, cols = np.asarray(s.row_ndiff), np.asarray(s.col_ndiff)
    among = ""
  else:
    return ""
  r, c = np.nonzero(rows)[0], np.nonzero(cols)[0]
  if not (r.size and c.size):
    return ""
  nr, nc = rows.shape[0], cols.shape[0]
  tail = [name for name, lines, size in (("rows", r, nr), ("columns", c, nc))
          if size % TILES[0] and lines[0] >= size - size % TILES[0]]
  edge = (f", in the last partial {TILES[0]}x{TILES[0]} tile's "
          f"{' and '.join(tail)}" if tail else "")
  return f" {among}in rows {_span(r)}, columns {_span(c)}{edge}"


def nonfinite_note(f: Facts) -> str:
  """The sentence every fault's evidence carries where the KUT holds
  NaN/Inf that golden does not: how many, of which kind, and where
  (:func:`nonfinite_where`); empty otherwise."""
  new = f.new_nonfinite
  if not new:
    return ""
  s = f.sig
  new_nan = max(_i(s.n_nan_test) - _i(s.n_nan_golden), 0)
  return (f"; {new} elements are NaN/Inf where golden is finite "
          f"({new_nan} NaN, {new - new_nan} Inf){nonfinite_where(f)}")


def says_nonfinite(test: Callable[[Facts], list[Found]]
                   ) -> Callable[[Facts], list[Found]]:
  """A fault hypothesis whose evidence says the record's new NaN/Inf (its
  count and where, :func:`nonfinite_note`), whatever it names: a NaN
  inside a moved tile or a flipped element is a NaN all the same."""
  @functools.wraps(test)
  def said(f: Facts) -> list[Found]:
    found = test(f)
    note = nonfinite_note(f)
    if not note:
      return found
    return [x if "NaN/Inf where golden is finite" in x.sentence
            else x._replace(sentence=x.sentence + note) for x in found]
  return said


@says_nonfinite
def nonfinite(f: Facts) -> list[Found]:
  """NaN/Inf where golden is finite: ``saturation`` when only Infs are
  new where golden overflows a narrow format; ``bitflip`` when each
  differing element is one or two flips away (three in a 32/64-bit
  record where every differing element became NaN/Inf); ``nan``."""
  s, cfg = f.sig, f.cfg
  new = f.new_nonfinite
  if not new:
    return []
  new_nan = max(_i(s.n_nan_test) - _i(s.n_nan_golden), 0)
  new_inf = max(_i(s.n_inf_test) - _i(s.n_inf_golden), 0)
  gmax = _f(s.golden_absmax)
  over = [k for k, m in FORMAT_MAX.items() if gmax > m and k != "bf16"]
  if (new_nan == 0 and new_inf > 0 and over
      and _i(s.n_overflow) >= new_inf):
    fmt = min(over, key=lambda k: FORMAT_MAX[k])
    return [Found("saturation", Saturated(fmt, "inf", new_inf, new_inf),
                  f"{new_inf} elements became +-Inf where |golden| exceeds "
                  f"the {fmt} maximum {FORMAT_MAX[fmt]:g} (max |golden| "
                  f"{gmax:.4g}): a conversion overflowed", 1.0)]
  out = [Found("nan", NonFinite(new, new_nan, new_inf, new),
               f"{new} elements are NaN/Inf where golden is finite "
               f"({new_nan} NaN, {new_inf} Inf, {pct(new / f.n)} of "
               f"elements){nonfinite_where(f)}", new / max(f.ndiff, 1))]
  flips = (cfg.flip_bits_whole if f.wide and f.ndiff == new
           else cfg.flip_bits_whole - 1)
  if f.ndiff <= cfg.sparse_whole_share * f.n and f.bits_per_diff <= flips:
    bits = _bits(f)
    out.append(Found("bitflip",
                     Flips(f.ndiff, tuple(bits), int(math.ceil(
                         f.bits_per_diff)), math.nan, f.ndiff),
                     f"{new} of {f.ndiff} differing elements became NaN/Inf "
                     f"by flipping {f.bits_per_diff:.2g} bits each, at bit "
                     f"positions {bits[:8]} ({f.fields_of(bits)})", 1.0))
  return out


def clipped_at_max(f: Facts, among: int, what: str) -> list[Found]:
  """``saturation``: at least saturation_share of ``among`` elements (the
  ``what``) clipped at fp16's or fp8_e4m3's maximum where |golden| is
  larger."""
  s = f.sig
  out = []
  for fmt, count in (("fp16", _i(s.n_saturated_fp16)),
                     ("fp8_e4m3", _i(s.n_saturated_fp8_e4m3))):
    if count and count >= f.cfg.saturation_share * among:
      out.append(Found("saturation", Saturated(fmt, "max", count, count),
                       f"{count} of {among} {what} are clipped at the {fmt} "
                       f"maximum {FORMAT_MAX[fmt]:g} where |golden| is larger",
                       min(1.0, count / max(among, 1))))
  return out


@says_nonfinite
def clipped(f: Facts) -> list[Found]:
  """``saturation``: differing elements clipped at fp16's or fp8_e4m3's
  maximum where |golden| is larger."""
  return clipped_at_max(f, f.ndiff, "differing elements")


@says_nonfinite
def transposed(f: Facts) -> list[Found]:
  """``indexing``: ``t[i, j] == g[j, i]`` bitwise at match_share of the
  sampled nonzero elements that differ."""
  share = _f(f.sig.transpose_share)
  if share < f.cfg.match_share:
    return []
  return [Found("indexing",
                Moved("transpose", "", 0, share, 0, 0, f.ndiff),
                f"t[i, j] == g[j, i] bitwise at {pct(share)} of the sampled "
                f"nonzero elements that differ ({pct(f.share)} of elements "
                "differ): a transposed layout", share)]


@says_nonfinite
def shifted(f: Facts) -> list[Found]:
  """``indexing``: t equals g shifted by some rows or columns bitwise at
  match_share of the sampled nonzero elements that differ."""
  out = []
  for axis in ("col", "row"):
    shares = np.asarray(getattr(f.sig, f"shift_{axis}_share"))
    best = _i(getattr(f.sig, f"best_shift_{axis}"))
    share = float(shares[best + len(shares) // 2]) if best else 0.0
    if best and share >= f.cfg.match_share:
      name = "columns" if axis == "col" else "rows"
      out.append(Found("indexing",
                       Moved("shift", name, best, share, 0, 0, f.ndiff),
                       f"t equals g shifted by {best} {axis}s bitwise at "
                       f"{pct(share)} of the sampled nonzero elements that "
                       f"differ ({pct(f.share)} of elements differ)", share))
  return out


@says_nonfinite
def permuted(f: Facts) -> list[Found]:
  """``indexing``: t holds exactly golden's multiset of bit patterns in
  other places, and the values moved far (at least permuted_error of the
  golden RMS: quantized outputs exchanging neighbours is rounding)."""
  s = f.sig
  far = _f(s.abs_max) >= f.cfg.permuted_error * f.golden_rms
  if not (bool(np.asarray(s.is_permutation)) and far):
    return []
  if transposed(f) or shifted(f):
    return []
  return [Found("indexing",
                Moved("permutation", "", 0, 1.0, 0, 0, f.ndiff),
                f"t holds exactly the multiset of golden bit patterns, in "
                f"other places ({pct(f.share)} of elements moved)", 1.0)]


def _hot(v: np.ndarray, factor: float) -> np.ndarray:
  """Indices whose value stands ``factor`` times above the median one."""
  v = np.asarray(v, np.float64)
  base = float(np.median(v))
  if base > 0:
    return np.nonzero(v >= factor * base)[0]
  return np.nonzero(v > 0)[0]


@says_nonfinite
def edge(f: Facts) -> list[Found]:
  """``indexing`` (tile edge): the error sits in trailing rows or columns,
  each hot_factor x the median one's mean error: the last partial tile
  is indexed wrongly (rounding noise elsewhere does not hide the band)."""
  if f.ndiff < f.cfg.min_pattern:
    return []
  out = []
  for axis, v in (("columns", f.sig.col_abs_mean),
                  ("rows", f.sig.row_abs_mean)):
    v = np.asarray(v, np.float64)
    size = v.shape[0]
    hit = _hot(v, f.cfg.hot_factor)
    if size < f.cfg.band_min_lines or not len(hit) or len(hit) == size:
      continue
    first = int(hit[0])
    if (len(hit) == size - first and hit[-1] == size - 1 and 0 < first
        and size - first <= f.cfg.half * size):
      band = size - first
      mass = float(np.sum(v[hit]) / max(np.sum(v), 1e-300))
      out.append(Found("indexing",
                       Moved("tile_edge", axis, 0, mass, first, band,
                             f.ndiff),
                       f"{pct(mass)} of the error sits in the last {band} "
                       f"{axis} ({first}..{size - 1} of {size}), each >= "
                       f"{f.cfg.hot_factor:g}x the median {axis[:-1]}'s mean "
                       "error: the last partial tile is indexed wrongly",
                       mass))
  return out


@says_nonfinite
def scale(f: Facts) -> list[Found]:
  """``scale``: t / g is constant (spread within scale_spread_u u) and
  differs from 1 by more than that, over at least half of the
  elements."""
  s, cfg = f.sig, f.cfg
  factor, spread = _f(s.scale), _f(s.scale_spread)
  if f.share < cfg.half or not math.isfinite(factor):
    return []
  if not (spread <= cfg.scale_spread_u * f.u
          and abs(factor - 1.0) > cfg.scale_spread_u * f.u):
    return []
  return [Found("scale", Scaled(factor, math.nan, spread, f.n),
                f"t / g is constant: {factor:.6g} (spread {spread:.2g} <= "
                f"{cfg.scale_spread_u:g} u = {cfg.scale_spread_u * f.u:.2g}) "
                f"over {pct(f.share)} differing elements", 1.0)]


@says_nonfinite
def flushed(f: Facts) -> list[Found]:
  """``ftz``: the differing elements are golden subnormals (or values
  below a narrow format's smallest normal) returned as zero."""
  s, cfg = f.sig, f.cfg
  n_flushed = _i(s.n_flushed)
  if n_flushed and f.ndiff - n_flushed <= cfg.flush_other_share * f.ndiff:
    return [Found("ftz", Flushed(f.work, n_flushed, MIN_NORMAL.get(
        f.work, math.nan), n_flushed),
                  f"{n_flushed} of {f.ndiff} differing elements are golden "
                  f"subnormals returned as zero ({_i(s.n_golden_subnormal)} "
                  "golden subnormals in all)", n_flushed / f.ndiff)]
  zeroed = _i(s.n_zeroed)
  gmax = _f(s.zeroed_golden_absmax)
  if not zeroed or zeroed < (1 - cfg.flush_other_share) * f.ndiff:
    return []
  fits = [k for k, m in MIN_NORMAL.items() if gmax < m]
  if not fits:
    return []
  fmt = min(fits, key=lambda k: MIN_NORMAL[k])
  return [Found("ftz", Flushed(fmt, zeroed, gmax, zeroed),
                f"{zeroed} of {f.ndiff} differing elements became 0 and all "
                f"of them are below {MIN_NORMAL[fmt]:.3g}, the smallest "
                f"normal of {fmt} (largest zeroed |golden| {gmax:.3g}): "
                f"subnormals flushed in {fmt}", zeroed / f.ndiff)]


def tiny_flush_bound(f: Facts) -> float:
  """The golden magnitude below which a zeroed output is a flush: the
  smallest normal of the record's format over u (tiny / u: below it
  u x |g| underflows, no rounding of it is measured, and no cancelling
  sum of normal-sized terms leaves a residue that small), and at most
  ``u ** tiny_flush_power x`` the golden RMS; u the finer of the
  record's own and float32's (a 16-bit kernel sums in float32 and
  rounds once: its residues are float32's)."""
  u = min(f.u, UNIT_ROUNDOFF["fp32"])
  return min(MIN_NORMAL.get(f.work, f.cfg.tiny_figure) / u,
             u ** f.cfg.tiny_flush_power * f.golden_rms)


@says_nonfinite
def tiny_flush(f: Facts) -> list[Found]:
  """``ftz``: outputs far below the output's scale returned as zero:
  every zeroed golden value below :func:`tiny_flush_bound` (rows of
  ~1e-37 in an output of RMS ~1), which no rounding of the data's scale
  zeroes, however few they are among the differing elements (where u x
  scale underflows, the envelope cannot see them)."""
  s = f.sig
  zeroed = _i(s.n_zeroed)
  zmax = _f(s.zeroed_golden_absmax)
  bound = tiny_flush_bound(f)
  if not zeroed or not 0.0 < zmax < bound:
    return []
  return [Found("ftz", Flushed("tiny", zeroed, zmax, zeroed),
                f"{zeroed} of {f.ndiff} differing elements are zero where "
                f"golden holds values up to {zmax:.3g}, below {bound:.3g} "
                f"(the smallest normal over u({f.work}): no rounding of the "
                "output's scale zeroes them): tiny outputs flushed to zero",
                zeroed / f.ndiff)]


@says_nonfinite
def zero(f: Facts) -> list[Found]:
  """``zero``: the differing elements are 0 where golden is nonzero
  (missed writes), as whole rows or tiles where they are."""
  s, cfg = f.sig, f.cfg
  zeroed = _i(s.n_zeroed)
  if not zeroed or zeroed < cfg.zero_share * f.ndiff:
    return []
  rows = np.asarray(s.row_ndiff)
  cols = np.asarray(s.col_ndiff).shape[0]
  full_rows = int(np.sum(rows == cols))
  full_cols = int(np.sum(np.asarray(s.col_ndiff) == rows.shape[0]))
  where, nrows, ntiles, tile = f"{zeroed} elements", 0, 0, 0
  if full_rows and full_rows * cols >= cfg.zero_share * zeroed:
    where, nrows = f"{full_rows} whole rows", full_rows
  elif full_cols and full_cols * rows.shape[0] >= cfg.zero_share * zeroed:
    where = f"{full_cols} whole columns"
  else:
    tiles_all = np.asarray(s.tiles_all)
    for i, ts in enumerate(TILES):
      if tiles_all[i] and tiles_all[i] * ts * ts >= cfg.zero_share * zeroed:
        where, ntiles, tile = (f"{int(tiles_all[i])} whole {ts}x{ts} tiles",
                               int(tiles_all[i]), ts)
  return [Found("zero", Zeroed(zeroed, nrows, ntiles, tile, zeroed),
                f"{zeroed} of {f.ndiff} differing elements are 0 where "
                f"golden is nonzero ({where}): missed writes",
                zeroed / f.ndiff)]


def lane_columns(per_col: np.ndarray, k: int, share: float) -> int:
  """How many columns of lane ``k`` (column index mod 32) hold at least
  ``share`` of the largest such column's count or error mass: a lane is
  periodic, one column of it is a line."""
  v = np.asarray(per_col, np.float64)[k::32]
  top = float(np.max(v)) if v.size else 0.0
  return int(np.sum(v >= share * top)) if top > 0 else 0


@says_nonfinite
def lane(f: Facts) -> list[Found]:
  """``lane``: the differing elements (or, when rounding noise makes every
  element differ, the per-column error mass) sit in one lane of 32, in
  at least lane_min_lines of its columns."""
  s, cfg = f.sig, f.cfg
  cols = np.asarray(s.col_ndiff).shape[0]
  if f.ndiff < cfg.min_pattern or cols < cfg.lane_min_cols:
    return []
  lanes = np.asarray(s.lane_ndiff, np.int64)
  mass = np.bincount(np.arange(cols) % 32,
                     weights=np.asarray(s.col_abs_mean, np.float64),
                     minlength=32)
  k = int(np.argmax(lanes))
  in_lane = int(lanes[k])
  if in_lane >= cfg.majority * f.ndiff:
    per_col = np.asarray(s.col_ndiff)
    how = (f"{in_lane} of {f.ndiff} differing elements sit in lane {k} of "
           f"32 (column index mod 32); a uniform spread would put "
           f"{f.ndiff / 32:.3g} there")
  elif mass.sum() > 0 and mass.max() >= cfg.majority * mass.sum():
    k = int(np.argmax(mass))
    per_col = np.asarray(s.col_abs_mean)
    how = (f"{pct(mass[k] / mass.sum())} of the error mass sits in lane {k} "
           f"of 32 (column index mod 32), the rest is rounding noise")
  else:
    return []
  if lane_columns(per_col, k, cfg.half) < cfg.lane_min_lines:
    return []  # one column of the lane: a line (the zero rule's)
  what = ("zeroed" if in_lane and _i(s.n_zeroed) >= cfg.zero_share * in_lane
          else "non-finite" if in_lane and f.new_nonfinite >=
          cfg.zero_share * in_lane else "corrupted")
  return [Found("lane", Lane("stride", 32, k, 0, 0, what, in_lane or f.ndiff),
                f"{how}; values there are {what}", 1.0)]


@says_nonfinite
def tiles(f: Facts) -> list[Found]:
  """``lane`` (tiles): every differing element lies in whole aligned
  tiles, each wrong in every element."""
  s, cfg = f.sig, f.cfg
  if f.ndiff < cfg.min_pattern:
    return []
  for i, ts in enumerate(TILES):
    full, anyd = _i(s.tiles_all[i]), _i(s.tiles_any[i])
    total = _i(s.tiles_total[i])
    if (full and full == anyd and full * ts * ts >= cfg.match_share * f.ndiff
        and full < total):
      return [Found("lane", Lane("tile", 0, 0, ts, full, "corrupted", f.ndiff),
                    f"every differing element lies in {full} of {total} "
                    f"aligned {ts}x{ts} tiles, each wrong in every element: "
                    "tile corruption", 1.0)]
  return []


def tiny_at_scale(f: Facts) -> bool:
  """Every moved element moved by at most sparse_min_scale_units u of the
  golden RMS (and none became NaN/Inf)."""
  grms = f.golden_rms or 1.0
  return (not f.new_nonfinite and _f(f.sig.abs_max)
          <= f.cfg.sparse_min_scale_units * f.u * grms)


def within_reduction_at_scale(f: Facts, outlier: float) -> bool:
  """Whether the moved elements, more than sparse_exact_share of the
  record (no exact rest to set them apart), are within a K-term
  reduction's rounding at the output's scale: another order of the sum
  moves an output by about sqrt(K) u of the sum of its terms' magnitudes,
  about sqrt(K) x the output's RMS for terms of either sign, so K u of
  the golden RMS (a conv of 129 input channels that lands 1 of its 9
  outputs 84 u of the RMS away is rounding; an element of a record this
  small sets no noise floor of its own)."""
  k = f.ctx.reduction
  return bool(k and f.share > f.cfg.sparse_exact_share
              and outlier <= float(k) * f.u)


@says_nonfinite
def stuck(f: Facts) -> list[Found]:
  """``stuck_at``: every differing element differs only in one bit, always
  the same way (not a sign of values near zero, nor a last bit rounded
  the other way within the envelope)."""
  s, cfg = f.sig, f.cfg
  if f.ndiff < cfg.min_pattern:
    return []
  out = []
  for polarity, v in ((1, s.bits_up), (0, s.bits_down)):
    v = np.asarray(v, np.int64)
    k = int(np.argmax(v))
    others = f.xor.sum() - f.xor[k]
    if not (v[k] >= cfg.majority * f.ndiff and f.xor[k] == v[k]
            and others <= (1 - cfg.majority) * f.ndiff):
      continue
    if k == f.nbits - 1 and tiny_at_scale(f):
      continue  # signs of values near zero: another formula's rounding
    if (k == 0 and f.has_ref
        and f.noise_ratio <= cfg.benign_noise_ratio
        and f.ndiff < cfg.stuck_low_bit_share * f.n):
      continue  # the last bit rounded the other way, within the envelope
    out.append(Found("stuck_at", Stuck(k, polarity, f.ndiff, f.ndiff),
                     f"all {f.ndiff} differing elements differ only in bit "
                     f"{k} ({f.field_of_bit(k)}), always {1 - polarity}->"
                     f"{polarity}: a stuck-at-{polarity} bit",
                     v[k] / f.ndiff))
  return out


def sign_mirrored(f: Facts, forced: int) -> bool:
  """Whether ``forced`` sign changes are a stuck sign bit's: at least
  majority of them between two nonzero values (a zero, or a signed zero
  beside a subnormal, changes sign in any rounding of a value near zero),
  every magnitude golden's (the geometric mean of |t| / |g| within
  sign_magnitude_tol of 1: a formula that crosses zero changes them too)
  and the record not tiny at its scale (:func:`tiny_at_scale`)."""
  keeps = abs(abs(_f(f.sig.scale)) - 1.0) <= f.cfg.sign_magnitude_tol
  return (_i(f.sig.n_sign_flip) >= f.cfg.majority * forced
          and keeps and not tiny_at_scale(f))


def _spike(f: Facts, k: int) -> bool:
  """Whether bit ``k`` changes in stuck_spike times as many elements as
  each neighbouring bit: a dense base's rounding moves a run of low bits,
  each higher bit about half as often as the one below (a carry), and
  never one bit on its own."""
  x = f.xor
  near = [x[j] for j in (k - 1, k + 1) if 0 <= j < f.nbits]
  return all(x[k] >= f.cfg.stuck_spike * n for n in near)


@says_nonfinite
def stuck_dense(f: Facts) -> list[Found]:
  """``stuck_at`` (over a dense base): more elements than a sparse fault
  touches, and than the residual holds outliers (the forced elements set
  its median), have one bit forced one way (at most 1 - majority of its
  changes the other way, and of them zeros, whose set bits all clear), a
  spike of stuck_spike over its neighbouring bits: one bit forced across
  the output, above the base's rounding, which moves a run of low bits
  both ways."""
  s, cfg = f.sig, f.cfg
  if f.ndiff <= f.sparse_limit:
    return []
  out = []
  for polarity, v, w in ((1, s.bits_up, s.bits_down),
                         (0, s.bits_down, s.bits_up)):
    v, w = np.asarray(v, np.int64), np.asarray(w, np.int64)
    k = int(np.argmax(v - w))
    if not (v[k] > max(f.sparse_limit, f.n_out)
            and w[k] <= (1 - cfg.majority) * v[k] and _spike(f, k)
            and _i(s.n_zeroed) <= (1 - cfg.majority) * v[k]):
      continue  # (fewer than the outliers: the residual's; zeros: theirs)
    if k == f.nbits - 1 and not sign_mirrored(f, int(v[k])):
      continue  # signs of values at or near zero: a base's rounding
    below = int(f.xor[k - 1]) if k else 0
    out.append(Found("stuck_at", Stuck(k, polarity, int(v[k]), int(v[k])),
                     f"{int(v[k])} elements ({pct(v[k] / f.n)}) have bit {k} "
                     f"({f.field_of_bit(k)}) forced {1 - polarity}->"
                     f"{polarity} ({int(w[k])} the other way; {below} "
                     f"change the bit below): a stuck-at-{polarity} bit "
                     "over the dense base", v[k] / f.ndiff))
  return out


def _max_ulps(f: Facts) -> float:
  """The largest ULP distance: the top nonempty bucket k of ulp_hist holds
  distances in [2**(k-1), 2**k)."""
  hist = np.asarray(f.sig.ulp_hist)
  top = int(np.nonzero(hist)[0][-1]) if hist.any() else 0
  return 2.0 ** (top - 1) if top else 0.0


def _min_ulps(f: Facts) -> float:
  """The smallest ULP distance of a differing element (the lowest
  nonempty bucket k >= 1 of ulp_hist holds distances from 2**(k-1))."""
  hist = np.asarray(f.sig.ulp_hist)[1:]
  nz = np.nonzero(hist)[0]
  return 2.0 ** int(nz[0]) if nz.size else 0.0


def _beyond_reordering(f: Facts) -> bool:
  return f.has_ref and f.noise_ratio > f.cfg.reordering_envelope


def _sparse_gate(f: Facts) -> bool:
  """Few elements far beyond rounding, not mostly zeros (the zero and
  flush hypotheses'): no decomposition; a decomposed
  record with no outlier whose error is beyond reordering; or one whose
  few differing elements (every other element bitwise golden: each of
  them a fault's, outlier or not) are a bit or two off, or each at least
  flip_min_ulps of its own ulps off (no rounding of a correct kernel
  moves only a few elements, each that far)."""
  cfg = f.cfg
  if not f.ndiff or f.share > cfg.sparse_whole_share:
    return False
  if _i(f.sig.n_zeroed) >= cfg.zero_share * f.ndiff:
    return False  # zeros: the zero and flush hypotheses'
  if f.dec:
    exact_rest = (f.share <= cfg.sparse_exact_share
                  and (f.bits_per_diff <= cfg.sparse_exact_bits
                       or _min_ulps(f) >= cfg.flip_min_ulps))
    if not (exact_rest or (not f.n_out and _beyond_reordering(f))):
      return False
    if f.n_beyond and _i(f.sig.n_rounded) >= f.n_beyond:
      return False  # every element beyond is a coarser format's rounding
  return True


@says_nonfinite
def sparse(f: Facts) -> list[Found]:
  """``bitflip`` (at most flip_bits_whole bits per differing element) or
  ``random_value``: few elements (at most sparse_whole_share) moved far
  beyond rounding (flip_min_ulps of their own ulps, beyond rounding of
  the output's scale and of a long sum, and, with no exact rest, beyond a
  K-term reduction's rounding at the output's scale)."""
  cfg = f.cfg
  if not _sparse_gate(f):
    return []
  max_ulp = _max_ulps(f)
  nonfinite = f.new_nonfinite > 0
  beyond = _beyond_reordering(f)
  outlier = _f(f.sig.abs_max) / (f.golden_rms or 1.0)
  bound = long_sum_bound(f)
  if not nonfinite and (
      max_ulp < cfg.flip_min_ulps
      or (not beyond and tiny_at_scale(f))
      or within_reduction_at_scale(f, outlier)
      or (bound > 0 and outlier <= bound)
      or (not beyond and f.share > cfg.sparse_share
          and outlier <= cfg.rounding_abs_ulps * f.u)):
    return []
  bits = _bits(f)
  if f.bits_per_diff <= cfg.flip_bits_whole:
    return [Found("bitflip",
                  Flips(f.ndiff, tuple(bits), int(math.ceil(
                      f.bits_per_diff)), math.nan, f.ndiff),
                  f"{f.ndiff} elements ({pct(f.share)}) differ in "
                  f"{f.bits_per_diff:.2g} bits each on average, at bit "
                  f"positions {bits[:8]} ({f.fields_of(bits)}); up to "
                  f"{max_ulp:.3g}+ ULPs, max error {outlier:.3g} x RMS "
                  "golden", 1.0)]
  return [Found("random_value", Replaced(f.ndiff, outlier, f.ndiff),
                f"{f.ndiff} elements ({pct(f.share)}) hold unrelated values: "
                f"{f.bits_per_diff:.3g} of {f.nbits} bits differ per "
                f"element, max error {outlier:.3g} x RMS golden", 1.0)]


# ------------------------------------- dense faults of a decomposed record


def biased_sum_bound(f: Facts) -> float:
  """The relative shift of a K-term working-precision sum that loses its
  small terms in order (a normalizer a few ulps off in every row):
  biased_sum_level sqrt(K) u, level_octaves above; 0 without K."""
  k, cfg = f.ctx.reduction, f.cfg
  if not k or not f.wide:
    return 0.0
  return (cfg.biased_sum_level * math.sqrt(float(k)) * f.u
          * 2.0 ** cfg.level_octaves)


@says_nonfinite
def scale_fit(f: Facts) -> list[Found]:
  """``scale`` (or ``parameter``, a layer norm's other variance): ``t - r
  = delta r`` in every row, with the fit's residual and per-row spread
  within fit_share of |delta|, |delta| beyond scale_min_u u and a long
  sum's levels (random and biased), moving at least min_pattern
  elements beyond the envelope."""
  s, cfg = f.sig, f.cfg
  if not f.dec:
    return []
  delta, resid = _f(s.fit_delta), _f(s.fit_resid)
  rows = np.asarray(s.row_delta, np.float64)
  rerr = np.asarray(s.row_err, np.float64)
  used = rows[rerr > 0] if np.any(rerr > 0) else rows
  spread = float(np.std(used)) if used.size else math.inf
  if not (math.isfinite(delta)
          and abs(delta) > max(cfg.scale_min_u * f.u, working_sum_bound(f),
                               biased_sum_bound(f))
          and resid <= cfg.fit_share * abs(delta)
          and spread <= cfg.fit_share * abs(delta)
          and f.n_beyond >= cfg.min_pattern):
    return []
  factor = 1.0 + delta
  red = f.ctx.reduction
  if f.ctx.kernel == "layer_norm" and red and red > 1:
    for name, c in (("unbiased", math.sqrt((red - 1) / red)),
                    ("biased", math.sqrt(red / (red - 1)))):
      if abs(factor - c) <= cfg.fit_share * abs(c - 1.0):
        return [Found("parameter",
                      Form("variance", factor, abs(delta), f.noise_ratio,
                           name, f.n),
                      f"t = {factor:.6g} r (residual {resid:.2g}, per-row "
                      f"spread {spread:.2g}): sqrt(({red} - 1) / {red})"
                      f"{'' if name == 'unbiased' else '^-1'}, the {name} "
                      "variance where the model uses the other", 1.0)]
  return [Found("scale", Scaled(factor, resid, spread, f.n),
                f"t - r = {delta:+.6g} r in every row (t = {factor:.6g} r; "
                f"residual {resid:.2g} and per-row spread {spread:.2g} far "
                f"below |{delta:.3g}|)", 1.0)]


def _swap(shares: np.ndarray, cfg) -> tuple[int, float] | None:
  """``(s, share)`` where the sampled elements equal golden shifted by
  ``+s`` lines and by ``-s`` lines, together at least match_share and
  each at least 1 - match_share of them: two lines ``s`` apart swapped
  (each holds the other's values); None otherwise."""
  mid = len(shares) // 2
  best = None
  for k in range(1, mid + 1):
    up, down = float(shares[mid + k]), float(shares[mid - k])
    if (min(up, down) >= 1 - cfg.match_share
        and up + down >= cfg.match_share
        and (best is None or up + down > best[1])):
      best = (k, up + down)
  return best


@says_nonfinite
def moved_beyond(f: Facts) -> list[Found]:
  """``indexing``: the sampled elements beyond the rounding envelope
  equal, within it, golden transposed or shifted by some rows or
  columns (all by one shift; or two lines swapped: half by ``+s``, half
  by ``-s``, the outliers each other's values, sorting shrinking their
  error by permutation_gain)."""
  s, cfg = f.sig, f.cfg
  if not (f.dec and _i(s.out_shift_n) >= cfg.min_pattern
          and f.beyond_share >= cfg.fit_share):
    return []
  out = []
  tshare = _f(s.out_transpose)
  if tshare >= cfg.match_share:
    out.append(Found("indexing",
                     Moved("transpose", "", 0, tshare, 0, 0, f.n_beyond),
                     f"{pct(tshare)} of the sampled elements beyond the "
                     f"rounding envelope equal, within it, golden transposed "
                     f"(t[i, j] ~ g[j, i]): a transposed layout", tshare))
  for axis in ("col", "row"):
    shares = np.asarray(getattr(s, f"out_shift_{axis}"), np.float64).copy()
    mid = len(shares) // 2
    shares[mid] = 0.0
    k = int(np.argmax(shares))
    if shares[k] >= cfg.match_share:
      name = "columns" if axis == "col" else "rows"
      out.append(Found("indexing",
                       Moved("shift", name, k - mid, float(shares[k]), 0, 0,
                             f.n_beyond),
                       f"{pct(shares[k])} of the sampled elements beyond the "
                       f"rounding envelope equal, within it, golden shifted "
                       f"by {k - mid} {axis}s ({pct(f.beyond_share)} of "
                       "elements beyond it)", float(shares[k])))
    elif (_swap(shares, cfg) is not None
          and sorted_gain(f) >= cfg.permutation_gain):
      k, share = _swap(shares, cfg)
      name = "columns" if axis == "col" else "rows"
      out.append(Found("indexing",
                       Moved("swap", name, k, share, 0, 0, f.n_beyond),
                       f"{pct(share)} of the sampled elements beyond the "
                       f"rounding envelope equal, within it, golden shifted "
                       f"by +{k} or by -{k} {axis}s: two {name} {k} apart "
                       f"swapped ({pct(f.beyond_share)} of elements beyond "
                       "the envelope)", share))
  return out


def sorted_gain(f: Facts) -> float:
  """How many times the outliers' error shrinks when their values and
  their references are both sorted (``inf`` where the sorted error is
  0); 0 unless every outlier was gathered (at least two), most of them
  meet their sorted references within the envelope, they are not mostly
  zeros and moved far (at least permuted_error of the golden RMS)."""
  s, cfg = f.sig, f.cfg
  matched, moved = _i(s.n_out_matched), _i(s.n_out_moved)
  far = _f(s.out_abs_max) >= cfg.permuted_error * f.golden_rms
  if not (f.dec and 2 <= matched == f.n_out
          and moved >= cfg.match_share * matched
          and _i(s.n_out_zero) < cfg.half * f.n_out and far):
    return 0.0
  return _f(s.out_err_sum) / max(_f(s.out_sorted_err), 1e-300)


@says_nonfinite
def permuted_outliers(f: Facts) -> list[Found]:
  """``indexing``: the outliers hold each other's golden values (sorted,
  at least match_share of them equal their sorted references, the
  sorting shrinking their error by permutation_gain and beyond
  permutation_sample_factor sqrt(n)), not mostly zeros, and moved
  far."""
  s, cfg = f.sig, f.cfg
  matched, moved = _i(s.n_out_matched), _i(s.n_out_moved)
  need = max(cfg.permutation_gain,
             cfg.permutation_sample_factor * math.sqrt(max(matched, 1)))
  if sorted_gain(f) < need:
    return []
  return [Found("indexing",
                Moved("permutation", "", 0, moved / matched, 0, 0, f.n_out),
                f"the {f.n_out} outliers hold each other's golden values "
                f"(sorted, {moved} of them equal their references within "
                "the envelope): values permuted among those places",
                moved / matched)]
