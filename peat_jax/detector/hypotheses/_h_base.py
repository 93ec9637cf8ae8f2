"""Hypotheses of the base: the dense, bounded error a kernel's arithmetic
leaves.

Another summation order (``reordering``), outputs or inputs rounded to a
narrower format (``precision:<fmt>``, to nearest or toward zero),
partial sums kept in a narrow format (``accumulation:<fmt>``), results
rounded toward zero in the record's own format (``truncation``). Each
hypothesis predicts the error in magnitude (a level in units of its
format's u, a one-sided shrink, an exact rounding interval) and is
accepted only where the record meets that prediction. Where the Analyzer
synthesized the base (outputs rounded to a coarser format, fitted element
by element) or the port probe did (the kernel rerun on rounded inputs),
that fit is the evidence.
"""

from __future__ import annotations

import math

import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.detector.facts import Found, Noise, Rounded
from peat_jax.detector.facts import (
    NARROW_FORMATS, UNIT_ROUNDOFF, Facts, accumulator_format,
    format_of_model, long_sum_bound, narrowest, octaves, pct,
    within_long_sum)

#: Input formats of the level hypotheses, by the site's kind: a GEMM's
#: tensor cores round to tf32; others to bf16 or fp16. Without a kind,
#: tf32 (the GPU default of a float32 dot) before fp16 (same u).
_INPUT_FORMATS = {"gemm": ("bf16", "tf32", "fp16", "fp8_e4m3", "fp8_e5m2"),
                  "other": ("bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2"),
                  "": ("bf16", "tf32", "fp16", "fp8_e4m3", "fp8_e5m2")}
#: The formats whose operand truncation is tested.
_TRUNCATION_FORMATS = ("tf32", "bf16", "fp16")


def _i(x) -> int:
  return int(np.asarray(x))


def _f(x) -> float:
  return float(np.asarray(x))


def _fit(d: float, width: float) -> float:
  """A fit in (0, 1] from a distance in octaves (1 at 0, 1/2 at
  ``width``)."""
  return 2.0 ** (-d / width) if math.isfinite(d) else 0.0


# ------------------------------------------------ outputs in a coarser format


def _mode_name(f: Facts) -> str:
  """The fitted rounding mode: toward zero, or to nearest with its ties
  (even or away, where golden holds ties of the format)."""
  s = f.sig
  mode = _analyzer.BASE_MODES[_i(s.base_mode)]
  if mode == "toward_zero":
    return "toward_zero"
  ties, away = (int(v) for v in np.asarray(s.base_ties))
  if not ties:
    return "nearest"
  return "nearest_away" if away > ties / 2 else "nearest_even"


def rounded_output(f: Facts) -> list[Found]:
  """``precision:<fmt>`` (outputs): the Analyzer's synthesized base, t the
  reference rounded to a coarser format (to nearest or toward zero), on
  the whole output or on the part beyond the golden envelope (part of an
  output computed or stored in bf16)."""
  s, cfg = f.sig, f.cfg
  if not f.dec or _i(s.base_candidate) < 0:
    return []
  whole = _i(s.base_format) >= 0
  covers = int(np.max(np.asarray(s.base_explained))) if whole else _i(
      s.n_rounded)
  if not whole and (covers < cfg.match_share * max(f.n_beyond, 1)
                    or covers < cfg.min_pattern):
    return []
  fmt = NARROW_FORMATS[_i(s.base_candidate)]
  u = UNIT_ROUNDOFF[fmt]
  level = f.rel_med
  beyond_one = level > cfg.one_rounding_median * u
  if whole and beyond_one:
    return []  # more than one rounding: the accumulation hypothesis's
  mode = _mode_name(f)
  part = "the whole output" if whole else f"{covers} elements"
  typical = cfg.one_rounding_typical * u
  return [Found(f"precision:{fmt}",
                Rounded(fmt, "output", mode, level, typical, 0.0, (), covers),
                f"{covers} elements ({pct(covers / max(f.n, 1))}) are the "
                f"float64 reference rounded to {fmt} ({mode.replace('_', ' ')}"
                f"), within the golden kernel's envelope: outputs rounded to "
                f"{fmt} on {part}; median relative error {level:.3g}",
                covers / max(f.n, 1) if whole else 1.0)]


def narrow_outputs(f: Facts) -> list[Found]:
  """Outputs confined to a coarser format: one rounding into it
  (``precision:<fmt>``, median relative error within one_rounding_median
  u), or partial sums kept in it (``accumulation:<fmt>``, beyond). Read
  where the Analyzer fitted no rounded base (no reference), or where its
  base explains less than one rounding (an accumulator)."""
  cfg = f.cfg
  fmt = narrowest(f)
  if fmt is None:
    return []
  if f.dec and _i(f.sig.base_format) >= 0 and (
      f.rel_med <= f.cfg.one_rounding_median * UNIT_ROUNDOFF[fmt]):
    return []  # the synthesized base's (rounded_output)
  u = UNIT_ROUNDOFF[fmt]
  share = float(f.sig.repr_test[NARROW_FORMATS.index(fmt)])
  bound = f.cfg.one_rounding_median * u
  typical = cfg.one_rounding_typical * u
  if f.rel_med <= bound:
    return [Found(f"precision:{fmt}",
                  Rounded(fmt, "output", "nearest", f.rel_med, typical,
                          octaves(max(f.rel_med, 1e-300), typical), (),
                          f.ndiff),
                  f"{pct(share)} of outputs are exact {fmt} values and the "
                  f"median relative error {f.rel_med:.3g} is within one "
                  f"rounding (<= 3u/4 = {bound:.3g}): outputs rounded to "
                  f"{fmt}", share)]
  if _value_function(f):
    return []  # no running sum rounded to nearest leaves it: a port's
  return [Found(f"accumulation:{fmt}",
                Rounded(fmt, "accumulator", "nearest", f.rel_med, bound,
                        octaves(f.rel_med, bound), (), f.ndiff),
                f"{pct(share)} of outputs are exact {fmt} values but the "
                f"median relative error {f.rel_med:.3g} exceeds one rounding "
                f"(3u/4 = {bound:.3g}): partial sums were kept in {fmt}",
                share)]


# ------------------------------------------------ truncation (own format)


def cleared_low_bits(f: Facts) -> int:
  """How many of the lowest mantissa bits the KUT clears: the longest run
  from bit 0 up where no element gained the bit and many lost it (a
  kernel that truncates to fewer significand bits than any named format:
  ``x & ~0xFF`` keeps 15 of float32's 23)."""
  up = np.asarray(f.sig.bits_up)
  down = np.asarray(f.sig.bits_down)
  k = 0
  while (k < f.mant - 1 and int(up[k]) == 0
         and int(down[k]) >= f.cfg.cleared_share * f.ndiff):
    k += 1
  return k


def truncation_bound(f: Facts) -> tuple[float, str]:
  """Round toward zero's largest relative error into the record's own
  format (2u), or into it less its cleared low bits when they make it
  coarser; with the format's name for the evidence."""
  bound = 2 * f.u
  k = cleared_low_bits(f)
  if k and 2.0 ** -(f.mant - k) > bound:
    return 2.0 ** -(f.mant - k), f"{f.work} with {k} low bits cleared"
  return bound, f.work


def within_truncation(f: Facts, bound: float) -> bool:
  """Round toward zero moves every element by less than one ulp: ``|t -
  r| < bound |r|``, i.e. at most ``bound / u`` units of u x scale
  (truncation_margin on top), plus the golden kernel's own error twice (a
  KUT truncating its own noisy result). Without the decomposition the
  relative error against golden is the check."""
  cfg = f.cfg
  if f.dec:
    return _f(f.sig.z_max_test) <= (cfg.truncation_margin * bound / f.u
                                    + 2 * _f(f.sig.env_golden_z))
  return f.rel_max <= cfg.truncation_golden_factor * bound


def _truncates(f: Facts) -> bool:
  """The magnitude gate of a 16-bit record: below truncation_min_ratio x
  the golden kernel's error it lost nothing to truncation."""
  return (not f.has_ref or f.wide
          or not f.noise_ratio < f.cfg.truncation_min_ratio)


def _independent(f: Facts) -> bool:
  """The independence gate of a direction count: a row-normalizing
  kernel's elements of one row share its sum's rounding and move
  together, so their directions are read on at least
  truncation_min_count differing rows (one row is one coin)."""
  return not f.ctx.normalizing or (
      np.count_nonzero(np.asarray(f.sig.row_ndiff))
      >= f.cfg.truncation_min_count)


def _truncation(f: Facts, bound: float, fmt: str, sentence: str,
                fit: float) -> list[Found]:
  """A ``truncation`` finding: results rounded toward zero into ``fmt``."""
  return [Found("truncation",
                Rounded(fmt, "working", "toward_zero", f.rel_med, bound, 0.0,
                        (), f.ndiff), sentence, fit)]


def truncation_vs_reference(f: Facts) -> list[Found]:
  """``truncation``: against the float64 reference the KUT never lands
  above the exact magnitude, while the golden kernel (to nearest) does as
  often as below."""
  s, cfg = f.sig, f.cfg
  if not (f.has_ref and f.ndiff >= cfg.truncation_min_count and _truncates(f)):
    return []
  if narrowest(f) is not None:
    return []  # a coarser format's rounding, toward zero: rounded_output
  t_up, t_dn = _f(s.ref_test_grown), _f(s.ref_test_shrunk)
  g_up, g_dn = _f(s.ref_golden_grown), _f(s.ref_golden_shrunk)
  bound, fmt = truncation_bound(f)
  if not (t_up <= cfg.one_sided * (t_up + t_dn)
          and t_dn >= cfg.one_sided_min_share
          and g_up >= cfg.truncation_min_share * (g_up + g_dn)
          and within_truncation(f, bound)):
    return []
  return _truncation(
      f, bound, fmt, f"against the float64 reference {pct(t_dn)} of outputs "
      f"are smaller in magnitude and {pct(t_up)} larger (golden: "
      f"{pct(g_dn)} / {pct(g_up)}): results rounded toward zero",
      1.0 - t_up / max(t_up + t_dn, 1e-300))


def truncation_by_direction(f: Facts) -> list[Found]:
  """``truncation``: every changed magnitude shrank, about half of the
  nonzero outputs changed, and none moved beyond one ulp; a normalizing
  kernel's directions counted on truncation_min_count rows or more (the
  elements of a row share its sum's rounding)."""
  s, cfg = f.sig, f.cfg
  if narrowest(f) is not None or not _truncates(f) or not _independent(f):
    return []
  nonzero = f.n - _i(s.n_golden_zero)
  bound, fmt = truncation_bound(f)
  if not (f.ndiff >= cfg.truncation_min_count and f.smaller > 0
          and f.larger <= cfg.one_sided * f.ndiff
          and f.ndiff >= cfg.truncation_min_share * nonzero
          and within_truncation(f, bound)):
    return []
  return _truncation(
      f, bound, fmt, f"{f.smaller} of {f.ndiff} differing elements shrank "
      f"in magnitude and {f.larger} grew; max relative error "
      f"{f.rel_max:.3g} vs 2u({fmt}) = {bound:.3g}: round toward zero",
      1.0 - f.larger / max(f.ndiff, 1))


# ------------------------------------------------ another order


def _reorder_allowed(f: Facts) -> bool:
  """A 16-bit output's benign envelope is the verdict's: another correct
  order rounds once (or two or three times) into the same format, so a
  KUT beyond benign_noise_ratio x golden's distance to float64 is no
  reordering there."""
  return not (f.has_ref and f.u >= UNIT_ROUNDOFF["fp16"]
              and not f.noise_ratio <= f.cfg.benign_noise_ratio)


def within_envelope(f: Facts) -> list[Found]:
  """``reordering``: nothing but the outliers (a fault's, if any) is
  beyond the golden kernel's rounding envelope."""
  s = f.sig
  if not (f.dec and f.has_ref and f.n_beyond <= f.n_out
          and _reorder_allowed(f)):
    return []
  clean = f.n_out == 0
  return [Found("reordering",
                Noise(f.rel_med / f.u, f.noise_ratio, f.theta_g,
                      f.n - f.n_out),
                f"rounding noise: every element"
                f"{'' if clean else ' but the outliers'} is within "
                f"{f.theta_g:.3g} units of u({f.work}) x its scale of the "
                f"float64 reference (16x the golden kernel's largest, "
                f"{_f(s.env_golden_z):.3g}); median relative error "
                f"{f.rel_med:.3g}, bias {_f(s.bias):+.2f}, KUT/golden RMS "
                f"error vs float64 = {f.noise_ratio:.3g}", 1.0)]


def _noise_found(f: Facts, fit: float) -> list[Found]:
  floor = (f"KUT/golden RMS error vs float64 = {f.noise_ratio:.3g}"
           if f.has_ref else "no float64 reference")
  return [Found("reordering",
                Noise(f.rel_med / f.u, f.noise_ratio, math.nan, f.ndiff),
                f"unbiased rounding noise: median relative error "
                f"{f.rel_med:.3g} ({f.rel_med / f.u:.3g} u({f.work})), bias "
                f"{_f(f.sig.bias):+.2f}, {f.larger} up / {f.smaller} down; "
                f"{floor}", fit)]


def within_floor(f: Facts) -> list[Found]:
  """``reordering``: noise near the golden kernel's own floor, its RMS
  error against float64 within twice noise_floor_multiplier x golden's."""
  cfg = f.cfg
  if not (_reorder_allowed(f) and f.has_ref
          and f.noise_ratio <= 2 * cfg.noise_floor_multiplier):
    return []
  return _noise_found(f, 1.0)


def small_median(f: Facts) -> list[Found]:
  """``reordering``: a median relative error within reordering_envelope u
  and an RMS error within reordering_envelope x golden's (no reference:
  the median alone), where no other base holds."""
  cfg = f.cfg
  far_beyond = f.has_ref and not f.noise_ratio <= cfg.reordering_envelope
  if not (_reorder_allowed(f) and not far_beyond
          and f.rel_med <= cfg.reordering_envelope * f.u):
    return []
  return _noise_found(f, 1.0 - f.rel_med / (cfg.reordering_envelope * f.u))


def long_sum_order(f: Facts) -> list[Found]:
  """``reordering``: far beyond the golden kernel's error yet within what
  a K-term sum kept in the working format reaches in a correct order, its
  largest error at the output's scale too."""
  bound = long_sum_bound(f)
  if not (f.has_ref and within_long_sum(f)):
    return []
  scaled_max = f.scaled_max
  if scaled_max > f.cfg.working_sum_max * bound:
    return []
  k = f.ctx.reduction
  return [Found("reordering",
                Noise(f.rel_med / f.u, f.noise_ratio, math.nan, f.ndiff),
                f"another order of a long sum: median relative error "
                f"{f.rel_med:.3g}, max {scaled_max:.3g} (against "
                f"max(|golden|, its RMS)), within {bound:.3g} for K = {k} "
                f"terms kept in {f.work} (a correct sum in another order "
                f"reaches it); KUT/golden RMS error vs float64 = "
                f"{f.noise_ratio:.3g}", 1.0 - f.rel_med / bound)]


# ------------------------------------------------ input precision levels


def _input_formats(f: Facts) -> tuple[str, ...]:
  kind = "gemm" if f.ctx.gemm else ("other" if f.ctx.kernel else "")
  fmts = _INPUT_FORMATS[kind]
  if f.work in ("bf16", "fp16"):  # inputs of a 16-bit site are 16-bit
    fmts = tuple(k for k in fmts if UNIT_ROUNDOFF[k] > f.u)
  return fmts


def _value_function(f: Facts) -> bool:
  """Whether the error is a function of the value (a closed form's or a
  truncation's bias) or one-sided, which no rounding to nearest leaves."""
  return (f.dec and _f(f.sig.value_r2) >= f.cfg.value_r2) or f.biased


def _refuted(f: Facts, fmt: str) -> bool:
  """Whether the port probe synthesized the inputs rounded to ``fmt`` (an
  ``inputs_<fmt>...`` hypothesis) and they did not explain the output: a
  level is weaker evidence than that synthesis."""
  probe = f.ctx.probe
  return (probe is not None and not probe.explains
          and any(t == f"inputs_{fmt}" or t.startswith(f"inputs_{fmt}_")
                  for t in probe.tried))


def input_level(f: Facts) -> list[Found]:
  """``precision:<fmt>`` (inputs): outputs at working precision whose
  median relative error is input_rounding_level u(fmt) of a format,
  within level_octaves; formats of the same u are its alternatives; a
  format whose rounded inputs the port probe synthesized without
  explaining the output is refuted."""
  cfg = f.cfg
  if _value_function(f) or narrowest(f) is not None:
    return []
  fmts = tuple(k for k in _input_formats(f) if not _refuted(f, k))
  if not fmts:
    return []
  preds = [(k, cfg.input_rounding_level * UNIT_ROUNDOFF[k]) for k in fmts]
  dist = [(octaves(f.rel_med, p), k, p) for k, p in preds]
  d, fmt, pred = min(dist, key=lambda x: (x[0], fmts.index(x[1])))
  if d > cfg.level_octaves:
    return []
  alts = tuple(k for k, p in preds if k != fmt and p == pred)
  probe = f.ctx.probe
  weaker = probe is not None and probe.tried_inputs and not probe.explains
  return [Found(f"precision:{fmt}",
                Rounded(fmt, "inputs", "nearest_even", f.rel_med, pred, d,
                        alts, f.ndiff),
                f"outputs are at working precision with median relative "
                f"error {f.rel_med:.3g}, {d:.2g} octaves from "
                f"{cfg.input_rounding_level:g} u({fmt}) = {pred:.3g} for "
                f"inputs rounded to {fmt}"
                + (f" (or {', '.join(alts)}: the same unit roundoff)"
                   if alts else "")
                + ("; the probe's rounded inputs did not explain it"
                   if weaker else ""),
                _fit(d, cfg.level_octaves) * (cfg.half if weaker else 1.0))]


def accumulation_level(f: Facts) -> list[Found]:
  """``accumulation:<fmt>``: a K-term reduction whose running sum is kept
  in a narrow format, at accumulation_level sqrt(K) u(fmt), within
  level_octaves: a 16-bit GEMM or normalizing site's own format, a
  float32 normalizing kernel's bf16 sum."""
  cfg, k = f.cfg, f.ctx.reduction
  if not k or _value_function(f):
    return []
  fmt = accumulator_format(f)
  if fmt is None and f.ctx.normalizing:
    fmt = "bf16"
  if fmt is None:
    return []
  pred = cfg.accumulation_level * math.sqrt(float(k)) * UNIT_ROUNDOFF[fmt]
  d = octaves(f.rel_med, pred)
  if d > cfg.level_octaves:
    return []
  return [Found(f"accumulation:{fmt}",
                Rounded(fmt, "accumulator", "nearest_even", f.rel_med, pred,
                        d, (), f.ndiff),
                f"outputs are at working precision with median relative "
                f"error {f.rel_med:.3g}, {d:.2g} octaves from "
                f"{cfg.accumulation_level:g} sqrt(K) u({fmt}) = {pred:.3g} "
                f"for a K = {k} reduction whose running sum is kept in {fmt}",
                _fit(d, cfg.level_octaves))]


def truncated_operands(f: Facts) -> list[Found]:
  """``precision:<fmt>`` (inputs, toward zero): operands truncated into a
  narrower format shrink the output by truncated_operand_shrink u(fmt)
  per operand (one, or both of a product), and the rest is one rounding
  of the inputs (input_rounding_level u(fmt)), each within
  level_octaves."""
  s, cfg = f.sig, f.cfg
  if not (f.dec and f.has_ref and f.work in ("fp32", "fp64")
          and narrowest(f) is None):
    return []
  delta, resid = _f(s.fit_delta), _f(s.fit_resid)
  if not (math.isfinite(delta) and math.isfinite(resid)) or delta >= 0:
    return []
  counts = (2, 1) if (f.ctx.gemm or not f.ctx.kernel) else (1,)
  best = None
  for fmt in _TRUNCATION_FORMATS:
    u = UNIT_ROUNDOFF[fmt]
    for k in counts:
      d_shrink = octaves(-delta, k * cfg.truncated_operand_shrink * u)
      d_rest = octaves(max(resid, 1e-300), cfg.input_rounding_level * u)
      if (d_shrink <= cfg.level_octaves / 2 and d_rest <= cfg.level_octaves
          and (best is None or d_shrink + d_rest < best[0])):
        best = (d_shrink + d_rest, fmt, k, d_shrink, d_rest)
  if best is None:
    return []
  _, fmt, k, d_shrink, d_rest = best
  u = UNIT_ROUNDOFF[fmt]
  what = "both operands" if k == 2 else "an operand"
  return [Found(f"precision:{fmt}",
                Rounded(fmt, "inputs", "toward_zero", f.rel_med,
                        k * cfg.truncated_operand_shrink, d_shrink, (),
                        f.ndiff, -delta / u),
                f"t = (1 {delta:+.3g}) r: the outputs shrink by "
                f"{-delta / u:.3g} u({fmt}), where {what} rounded toward "
                f"zero to {fmt} predict "
                f"{k * cfg.truncated_operand_shrink:.3g} u ({d_shrink:.2g} "
                f"octaves); the rest, {resid:.3g} of the scale, is one "
                f"rounding of the inputs ({cfg.input_rounding_level:g} "
                f"u({fmt}), {d_rest:.2g} octaves): inputs truncated to "
                f"{fmt}", _fit(d_shrink + d_rest, cfg.level_octaves))]


def probed_precision(f: Facts) -> list[Found]:
  """``precision`` / ``accumulation`` fitted by synthesis: the port probe
  reran the kernel on the site's inputs rounded to a format and that
  explains the output."""
  probe = f.ctx.probe
  if probe is None or not probe.explains or not probe.model.startswith(
      ("precision", "accumulation")):
    return []
  fmt = format_of_model(probe.model) or ""
  mode = str(probe.extra.get("rounding", "nearest_even"))
  # Formats whose rounded inputs give the same output (fp16 and tf32
  # share a significand: in fp16's range they round alike).
  alts = tuple(n[len("inputs_"):] for n in probe.extra.get("equivalent", ())
               if n.startswith("inputs_"))
  return [Found(probe.model,
                Rounded(fmt, str(probe.extra.get("where", "inputs")), mode,
                        f.rel_med, math.nan, 0.0, alts, f.ndiff),
                probe.evidence, 1.0)]


