"""Hypotheses of faults on the residual: what the fitted base leaves.

The Analyzer's decomposition fits the record's base (the golden kernel's
envelope and the KUT's own dense noise, or outputs rounded to a coarser
format, synthesized exactly) and gathers the *outliers*: the elements the
base does not explain. A sparse or structured fault is confined to them
and leaves exact traces there: zeros, one lane, whole tiles, a trailing
band, values back inside the base after one to three bit flips, one bit
forced one way. Each function below tests one such hypothesis and
returns its :class:`~peat_jax.detector.facts.Found` (or nothing);
``covers`` is how many outliers it explains.
"""

from __future__ import annotations

import math

import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import core as _core
from peat_jax.detector.facts import (
    Flips, Flushed, Found, Lane, Moved, NonFinite, Replaced, Saturated,
    Stuck, Unexplained, Zeroed)
from peat_jax.detector.facts import (
    FORMAT_MAX, NARROW_FORMATS, Facts, outliers_within_long_sum,
    outliers_within_narrow_sum, pct)
from peat_jax.detector.hypotheses._h_whole import (
    clipped_at_max, lane_columns, nonfinite_where, says_nonfinite,
    tiny_flush)

#: The ftz threshold of each narrow format: its smallest normal.
_MIN_NORMAL = {k: _core.FORMATS[k].min_normal for k in NARROW_FORMATS}
#: Tile edges of the Analyzer's tile counts.
TILES = (8, 16, 32)


def _i(x) -> int:
  return int(np.asarray(x))


def _f(x) -> float:
  return float(np.asarray(x))


def binomial_tail(n: int, k: int, p: float) -> float:
  """P(X >= k) for X ~ Binomial(n, p)."""
  if k <= 0:
    return 1.0
  if p <= 0.0:
    return 0.0
  if p >= 1.0:
    return 1.0
  lp, lq = math.log(p), math.log1p(-p)
  terms = [math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
           + j * lp + (n - j) * lq for j in range(k, n + 1)]
  top = max(terms)
  return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def residual_open(f: Facts) -> bool:
  """Whether the record has outliers a fault may explain: decomposed,
  some outliers, and not a long sum's other order (its outputs whose terms
  cancel sit beyond the envelope, no further than the working-sum
  level)."""
  return f.dec and f.n_out > 0 and not outliers_within_long_sum(f)


def _sparse(f: Facts) -> bool:
  return f.n_out <= f.sparse_limit


def _zeros(f: Facts) -> int:
  return _i(f.sig.n_out_zero)


@says_nonfinite
def flush_in_format(f: Facts) -> list[Found]:
  """``ftz``: every golden value below a narrow format's smallest normal
  is zero in t and no other value is (these zeros are tiny, mostly inside
  the envelope). A zero fault lands on tiny values only by chance
  (tiny / n) ** zeroed: below pattern_alpha one flushed value among few
  tiny ones is a pattern."""
  s, cfg = f.sig, f.cfg
  if not f.dec:
    return []
  tiny = np.asarray(s.n_tiny, np.int64)
  tiny_z = np.asarray(s.n_tiny_zeroed, np.int64)
  zeroed = _i(s.n_zeroed)
  if f.n_out and _zeros(f) < cfg.zero_share * f.n_out:
    return []
  if tiny_flush(f):
    return []  # far below every format's normals: tiny outputs flushed
  order = np.argsort([-_MIN_NORMAL[k] for k in NARROW_FORMATS], kind="stable")
  for i in order:
    chance = (tiny[i] / max(f.n, 1)) ** max(int(tiny_z[i]), 1)
    if (tiny[i] >= 1 and chance <= cfg.pattern_alpha
        and tiny_z[i] >= cfg.majority * tiny[i] and zeroed <= tiny_z[i]):
      fmt = NARROW_FORMATS[i]
      n = int(tiny_z[i])
      return [Found("ftz", Flushed(fmt, n, _MIN_NORMAL[fmt], n),
                    f"{n} of the {int(tiny[i])} golden values below "
                    f"{_MIN_NORMAL[fmt]:.3g} (the smallest normal of {fmt}) "
                    f"are zero in t; the other elements are within "
                    f"rounding: subnormals flushed in {fmt}",
                    min(1.0, n / max(int(tiny[i]), 1)))]
  return []


@says_nonfinite
def overflow(f: Facts) -> list[Found]:
  """``saturation`` (to Inf): only Infs are new, golden holds values
  beyond a narrow format's maximum, and as many overflowed: a conversion
  into that format overflowed."""
  s = f.sig
  if not residual_open(f) or f.new_nonfinite < f.cfg.match_share * f.n_out:
    return []
  new_inf = max(_i(s.n_inf_test) - _i(s.n_inf_golden), 0)
  gmax = _f(s.golden_absmax)
  over = [k for k, m in FORMAT_MAX.items() if gmax > m and k != "bf16"]
  if not (new_inf == f.new_nonfinite and over
          and _i(s.n_overflow) >= new_inf):
    return []
  fmt = min(over, key=lambda k: FORMAT_MAX[k])
  return [Found("saturation", Saturated(fmt, "inf", new_inf, new_inf),
                f"{new_inf} elements became +-Inf where |golden| exceeds the "
                f"{fmt} maximum {FORMAT_MAX[fmt]:g}: a conversion overflowed",
                1.0)]


@says_nonfinite
def nonfinite(f: Facts) -> list[Found]:
  """``nan``: the outliers are NaN/Inf where golden is finite."""
  s = f.sig
  newnf = f.new_nonfinite
  if not residual_open(f) or newnf < f.cfg.match_share * f.n_out:
    return []
  new_nan = max(_i(s.n_nan_test) - _i(s.n_nan_golden), 0)
  return [Found("nan", NonFinite(newnf, new_nan, newnf - new_nan, newnf),
                f"{newnf} elements are NaN/Inf where golden is finite "
                f"({new_nan} NaN, {newnf - new_nan} Inf, "
                f"{pct(newnf / max(f.n, 1))} of elements)"
                f"{nonfinite_where(f)}",
                newnf / max(f.n_out, 1))]


def flipped_bits(f: Facts) -> list[int]:
  """The bit positions of the flips: each one-flip outlier's bit, and the
  bits that at least half of the gathered outliers differ in above the
  base's envelope (rounding noise moves only the bits below it)."""
  s = f.sig
  one = {int(k) for k in np.nonzero(np.asarray(s.out_flip_bits))[0]}
  xor = np.asarray(s.out_bits_xor, np.int64)
  counted = max(min(f.n_out, _analyzer.MATCH_OUTLIERS), 1)
  floor = math.log2(max(f.theta, 1.0)) if math.isfinite(f.theta) else 0.0
  high = {k for k in range(xor.shape[0])
          if xor[k] >= f.cfg.half * counted and (k >= f.mant or k > floor)}
  return sorted(one | high)


def flip_test(f: Facts) -> tuple[int, int, float] | None:
  """``(flips, covered, tail)``: the fewest flips k (1-3) that bring at
  least match_share of the outliers back inside the base, how many they
  bring back, and the binomial tail of that many among the outliers by
  chance (the Analyzer's flip null: a value drawn like the data, back
  within k flips); None when no k covers them."""
  s = f.sig
  counts = np.cumsum([_i(s.n_out_flip1), _i(s.n_out_flip2),
                      _i(s.n_out_flip3)])
  null = np.asarray(s.null_flips, np.float64)
  for k in range(3):
    if counts[k] >= f.cfg.match_share * f.n_out:
      return (k + 1, int(counts[k]),
              binomial_tail(f.n_out, int(counts[k]), float(null[k])))
  return None


@says_nonfinite
def bitflip(f: Facts) -> list[Found]:
  """``bitflip``: few outliers, each back inside the base after flipping
  one to three of its highest differing bits, which values drawn like the
  data would not do as often (binomial tail at most flip_odds against the
  flip null, the outliers clear of the base), or half of which lie
  beyond the data's range (exponent flips: ``n_out_far``; a value drawn
  like the data never does). Outliers that are NaN/Inf are read by their
  exact bits instead (``_h_whole.nonfinite``): back inside the envelope
  says little of a NaN, one or two flips from many values."""
  s, cfg = f.sig, f.cfg
  if not residual_open(f) or not _sparse(f):
    return []
  if f.new_nonfinite >= cfg.match_share * f.n_out:
    return []  # NaN/Inf outliers: flips only by their exact bits (whole)
  found = flip_test(f)
  if found is None:
    return []
  k, covered, tail = found
  far = _i(s.n_out_far)
  exact = _i(s.n_out_exact_flips)
  if exact >= cfg.match_share * f.n_out:
    why = f"{exact} of them differ from golden in those bits alone"
  elif tail <= cfg.flip_odds and clear_of_base(f):
    why = f"binomial tail {tail:.2g} of as many by chance"
  elif far >= cfg.half * covered:
    why = f"{far} of them beyond the data's range of magnitudes"
  else:
    return []
  bits = flipped_bits(f)
  how = "one bit" if k == 1 else f"up to {k} bits"
  nan = (f"; {f.new_nonfinite} of them became NaN/Inf"
         if f.new_nonfinite else "")
  return [Found("bitflip", Flips(covered, tuple(bits), k, tail, covered),
                f"{covered} of {f.n_out} outliers ({pct(f.n_out / f.n)}) are "
                f"back within rounding after flipping {how} (bits "
                f"{bits[:8]}: {f.fields_of(bits)}; {why}){nan}; every other "
                "element is within rounding",
                covered / f.n_out)]


def clear_of_base(f: Facts) -> bool:
  """Whether the outliers stand apart from the base's own error: fewer
  elements in the shoulder below the outlier threshold than outliers (a
  tail decaying no faster than 1/x puts three times as many there), or
  half of the outliers clear of the base (the Analyzer's n_shoulder and
  n_out_clear: 4x beyond the largest element the base explains, in a
  16-bit record 4x beyond the threshold)."""
  s = f.sig
  return (_i(s.n_shoulder) < f.n_out
          or _i(s.n_out_clear) >= f.cfg.half * f.n_out)


@says_nonfinite
def random_values(f: Facts) -> list[Found]:
  """``random_value``: few outliers, clear of the base, holding values
  that no flip of up to three bits explains better than chance:
  unrelated values."""
  s = f.sig
  if not residual_open(f) or not _sparse(f) or not clear_of_base(f):
    return []
  if f.new_nonfinite >= f.cfg.match_share * f.n_out:
    return []  # NaN/Inf: the nan hypothesis's
  if _zeros(f) >= f.cfg.zero_share * f.n_out:
    return []  # zeros: the zero and flush hypotheses
  ratio = _f(s.out_abs_max) / max(f.golden_rms, 1e-300)
  return [Found("random_value", Replaced(f.n_out, ratio, f.n_out),
                f"{f.n_out} outliers ({pct(f.n_out / f.n)}) hold values no "
                f"flip of up to 3 bits explains better than chance (max "
                f"error {_f(s.out_abs_max):.3g}, {ratio:.3g} x RMS golden); "
                "every other element is within rounding", 1.0)]


@says_nonfinite
def clipped(f: Facts) -> list[Found]:
  """``saturation`` (at a maximum): the outliers are clipped at fp16's or
  fp8_e4m3's maximum where |golden| is larger."""
  if not residual_open(f):
    return []
  return clipped_at_max(f, f.n_out, "outliers")


def _columns(f: Facts) -> int:
  return int(np.asarray(f.sig.out_cols).shape[0])


@says_nonfinite
def lane(f: Facts) -> list[Found]:
  """``lane``: the outliers sit in one lane (column index mod 32), in at
  least lane_min_lines of its columns."""
  s, cfg = f.sig, f.cfg
  if not residual_open(f) or f.n_out < cfg.min_pattern:
    return []
  lanes = np.asarray(s.out_lane, np.int64)
  k = int(np.argmax(lanes))
  if _columns(f) < cfg.lane_min_cols or lanes[k] < cfg.majority * f.n_out:
    return []
  if lane_columns(np.asarray(s.out_cols), k, cfg.half) < cfg.lane_min_lines:
    return []  # one column of the lane: a line (the zero rule's)
  what = "zeroed" if _zeros(f) >= cfg.zero_share * f.n_out else "corrupted"
  return [Found("lane", Lane("stride", 32, k, 0, 0, what, int(lanes[k])),
                f"{int(lanes[k])} of {f.n_out} outliers sit in lane {k} of "
                f"32 (column index mod 32), the rest is within rounding; "
                f"values there are {what}", lanes[k] / f.n_out)]


def _rounded_to_zero(f: Facts) -> bool:
  """Whether the outputs are in a narrow format (``repr_test`` >= 0.99)
  whose rounding sends every zeroed golden value to zero (each at most
  half its smallest subnormal): such zeros are that precision's."""
  zmax = _f(f.sig.zeroed_golden_absmax)
  rep = np.asarray(f.sig.repr_test, np.float64)
  for i, fmt in enumerate(NARROW_FORMATS):
    fm = _core.FORMATS[fmt]
    if (rep[i] >= f.cfg.repr_share
        and zmax <= fm.min_normal * 2.0 ** -fm.mantissa_bits):
      return True
  return False


@says_nonfinite
def zero(f: Facts) -> list[Found]:
  """``zero``: the outliers are zero where golden is not (missed writes),
  as whole rows or aligned tiles where they are; not zeros that a flush
  of tiny values or a coarser format's rounding explains."""
  s, cfg = f.sig, f.cfg
  zeros = _zeros(f)
  if (not residual_open(f) or zeros < cfg.zero_share * f.n_out
      or _rounded_to_zero(f) or flush_in_format(f) or tiny_flush(f)):
    return []  # (zeros a flush or a coarser format explains: theirs)
  cols = _columns(f)
  rows = np.asarray(s.out_rows, np.int64)
  full_rows = int(np.sum(rows == cols))
  full_cols = int(np.sum(np.asarray(s.out_cols, np.int64) == rows.shape[0]))
  full = np.asarray(s.out_tiles_all, np.int64)
  where, nrows, ntiles, tile = f"{zeros} elements", 0, 0, 0
  if full_rows and full_rows * cols >= cfg.zero_share * zeros:
    where, nrows = f"{full_rows} whole rows", full_rows
  elif full_cols and full_cols * rows.shape[0] >= cfg.zero_share * zeros:
    where = f"{full_cols} whole columns"
  else:
    for i, ts in enumerate(TILES):
      if full[i] and full[i] * ts * ts >= cfg.zero_share * zeros:
        where, ntiles, tile = f"{int(full[i])} whole {ts}x{ts} tiles", int(
            full[i]), ts
  return [Found("zero", Zeroed(zeros, nrows, ntiles, tile, zeros),
                f"{zeros} of {f.n_out} outliers are 0 where golden is not "
                f"({where}); every other element is within rounding: missed "
                "writes", zeros / f.n_out)]


@says_nonfinite
def tiles(f: Facts) -> list[Found]:
  """``lane`` (tiles): the outliers fill whole aligned tiles."""
  s, cfg = f.sig, f.cfg
  if not residual_open(f) or f.n_out < cfg.min_pattern:
    return []
  full = np.asarray(s.out_tiles_all, np.int64)
  anyt = np.asarray(s.out_tiles_any, np.int64)
  for i, ts in enumerate(TILES):
    if (full[i] and full[i] == anyt[i]
        and full[i] * ts * ts >= cfg.match_share * f.n_out):
      n = min(int(full[i]) * ts * ts, f.n_out)
      tiled = Lane("tile", 0, 0, ts, int(full[i]), "corrupted", n)
      return [Found("lane", tiled,
                    f"the {f.n_out} outliers fill {int(full[i])} aligned "
                    f"{ts}x{ts} tiles, every element of each: tile "
                    "corruption", n / f.n_out)]
  return []


def _band(f: Facts, v: np.ndarray) -> tuple[int, int] | None:
  """(first, width) of a trailing band (at most half of the lines, of at
  least band_min_lines) holding every nonzero entry."""
  nz = np.nonzero(v)[0]
  size = v.shape[0]
  if not nz.size or size < f.cfg.band_min_lines:
    return None
  first = int(nz[0])
  if 0 < first and size - first <= f.cfg.half * size:
    return first, size - first
  return None


@says_nonfinite
def tile_edge(f: Facts) -> list[Found]:
  """``indexing`` (tile edge): every outlier lies in a trailing band of
  columns: the last partial tile is indexed wrongly."""
  if not residual_open(f) or f.n_out < f.cfg.min_pattern:
    return []
  cols = np.asarray(f.sig.out_cols)
  band = _band(f, cols)
  if band is None:
    return []
  first, width = band
  return [Found("indexing",
                Moved("tile_edge", "columns", 0, 1.0, first, width, f.n_out),
                f"every outlier lies in the last {width} columns ({first}.."
                f"{cols.shape[0] - 1} of {cols.shape[0]}), far beyond "
                "rounding there: the last partial tile is indexed wrongly",
                1.0)]


def _line_chance(f: Facts) -> float:
  """The chance that the outliers, as many places drawn at random, all
  lie on one line with one polarity: ``(1 / (2 L)) ** (n_out - 1)`` when
  every outlier lies in one row (L the row count) or in one column (L the
  column count); 1 otherwise."""
  rows = np.asarray(f.sig.out_rows)
  cols = np.asarray(f.sig.out_cols)
  lines = [v.shape[0] for v in (rows, cols) if np.count_nonzero(v) == 1]
  if not lines or f.n_out < 2:
    return 1.0
  return (0.5 / max(max(lines), 1)) ** (f.n_out - 1)


def _a_pattern(f: Facts) -> bool:
  """Whether the outliers are enough to be a pattern: min_pattern of
  them, or fewer all on one line, which places drawn at random with one
  polarity are with a chance of at most pattern_alpha (a stuck bit of a
  row or a column changes only the elements whose bit differed)."""
  cfg = f.cfg
  return (f.n_out >= cfg.min_pattern
          or _line_chance(f) <= cfg.pattern_alpha)


@says_nonfinite
def stuck(f: Facts) -> list[Found]:
  """``stuck_at``: the outliers are back inside the base after flipping
  one bit, the same bit in (nearly) all, which is the same value in every
  one of them; min_pattern of them, or fewer on one line (a row's or a
  column's stuck bit) where that is no chance of pattern_alpha."""
  s, cfg = f.sig, f.cfg
  if not residual_open(f) or not _a_pattern(f):
    return []
  flips = np.asarray(s.out_flip_bits, np.int64)
  ups = np.asarray(s.out_flip_up, np.int64)
  k = int(np.argmax(flips))
  flip1 = _i(s.n_out_flip1)
  if not (flip1 >= cfg.match_share * f.n_out
          and flips[k] >= cfg.majority * flips.sum()):
    return []
  if ups[k] >= cfg.majority * flips[k]:
    polarity = 1
  elif ups[k] <= (1 - cfg.majority) * flips[k]:
    polarity = 0
  else:
    return []
  return [Found("stuck_at", Stuck(k, polarity, f.n_out, f.n_out),
                f"{flip1} of {f.n_out} outliers are back within rounding "
                f"after flipping bit {k} ({f.field_of_bit(k)}), which is "
                f"{polarity} in every one of them: a stuck-at-{polarity} bit",
                flip1 / f.n_out)]


@says_nonfinite
def unexplained(f: Facts) -> list[Found]:
  """``unknown``: outliers clear of the base (more than a sparse fault's
  share) that no fault hypothesis explains, where the base explains every
  other element (a rounded base, or the golden envelope with nothing but
  the outliers beyond it)."""
  s = f.sig
  if (not residual_open(f) or _sparse(f) or not clear_of_base(f)
      or f.new_nonfinite >= f.cfg.match_share * f.n_out
      or outliers_within_narrow_sum(f)):
    return []
  if _i(s.base_format) < 0 and f.n_beyond > f.n_out:
    return []  # a dense error beyond the golden envelope: a base's
  return [Found("unknown", Unexplained(f.ndiff, f.noise_ratio, f.n_out),
                f"{f.n_out} outliers ({pct(f.n_out / f.n)}) beyond the "
                f"KUT's own noise and the golden envelope that no fault "
                f"hypothesis explains (max error {_f(s.out_abs_max):.3g}, "
                f"{_f(s.out_abs_max) / max(f.golden_rms, 1e-300):.3g} x RMS "
                "golden)", 1.0)]
