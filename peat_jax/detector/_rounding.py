"""The Detector's rounding rules: dense, bounded errors.

Truncation, precision loss, accumulation in a narrow format and reordering,
told apart by representability, one-sidedness and the error level each
predicts."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.detector._facts import (
    ACCUMULATION_LEVEL, BENIGN_NOISE_RATIO, Candidate, LEVEL_OCTAVES,
    NARROW_FORMATS, NOISE_FLOOR_MULTIPLIER, REORDERING_ENVELOPE,
    UNIT_ROUNDOFF, _Facts, _pct, long_sum_bound, within_long_sum)

#: Round toward zero into the output's own format has an RMS error about
#: twice round-to-nearest's (a uniform position in the last place against
#: one centred on it): a KUT whose RMS error against float64 is below this
#: many times the golden kernel's has lost nothing to truncation, whatever
#: the direction of its few differing elements (a correct kernel that
#: rounds twice, an epsilon slip far below the format's resolution).
#: Applies to 16-bit records (a float32 one keeps the direction rules).
TRUNCATION_MIN_RATIO = 1.5
#: Round toward zero changes about half of the nonzero outputs against
#: round to nearest (those the nearest rounding sent up); a one-sided
#: change of far fewer is a normalizer a fraction of an ulp smaller (one
#: softmax row of 2^20 terms: 2.5% of its elements one ulp down), not a
#: truncation.
TRUNCATION_MIN_SHARE = 0.25
#: A long working-precision sum's other order: its largest error at the
#: output's scale (max(|golden|, its RMS)) stays within this many times the
#: working-sum level (a fault's errors do not).
WORKING_SUM_MAX = 4.0


#: Median relative error of a float32 result whose inputs were rounded to a
#: format with unit roundoff u: about 0.6 u (half the inputs' rounding error
#: survives a dot product of random-signed terms; measured 0.5-1.5 u on
#: matmul, layer norm and softmax of normal inputs).
INPUT_ROUNDING_LEVEL = 0.6
_GEMM_KERNELS = ("matmul", "dot_general", "conv", "conv2d",
                 "conv_general_dilated", "attention")
_NORMALIZING_KERNELS = ("softmax", "layer_norm", "log_softmax",
                        "cross_entropy")


def _level_hypotheses(context: Mapping[str, Any], work: str | None = None
                      ) -> list[tuple[str, float]]:
  """(model, predicted median relative error) for dense precision loss;
  ``work`` the output's format (16-bit outputs: only narrower inputs, and
  accumulation in the output's own format)."""
  kernel = str(context.get("kernel", ""))
  # tf32 and fp16 share u = 2**-11; GEMM ports round to tf32 (tensor-core
  # input format), others to fp16. Listed first wins a tie.
  fmts = (("bf16", "tf32", "fp16", "fp8_e4m3", "fp8_e5m2")
          if kernel.split(":")[0] in _GEMM_KERNELS else
          ("bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2"))
  narrow_out = work in ("bf16", "fp16")
  if narrow_out:  # inputs of a bf16 site are bf16 already: only coarser
    fmts = tuple(k for k in fmts if UNIT_ROUNDOFF[k] > UNIT_ROUNDOFF[work])
  hyps = [(f"precision:{k}", INPUT_ROUNDING_LEVEL * UNIT_ROUNDOFF[k])
          for k in fmts]
  reduction = context.get("reduction")
  # A 16-bit output's golden is as narrow as the KUT's, so the
  # representability rule cannot see a GEMM accumulating in that format;
  # the level can (a bf16 matmul's partial sums kept in bf16).
  if (narrow_out and reduction
      and kernel.split(":")[0] in _GEMM_KERNELS + _NORMALIZING_KERNELS):
    return hyps + [(f"accumulation:{work}", ACCUMULATION_LEVEL * math.sqrt(
        float(reduction)) * UNIT_ROUNDOFF[work])]
  # A GEMM's accumulator is its output: a narrow accumulator leaves narrow
  # outputs, which the representability rule names. Only a normalizing
  # kernel (softmax, layer norm) divides by a narrow sum and returns wide
  # outputs; such ports keep the sum in bf16 (an fp16 sum of D exp terms
  # or squares overflows at 65504), so bf16 is the one hypothesis.
  if reduction and kernel.split(":")[0] in _NORMALIZING_KERNELS:
    hyps.append(("accumulation:bf16", ACCUMULATION_LEVEL *
                 math.sqrt(float(reduction)) * UNIT_ROUNDOFF["bf16"]))
  return hyps


#: A low bit counts as cleared when it is 1 in golden and 0 in the KUT in
#: at least this share of the differing elements (half of them, for bits
#: below the rounding position), and never 0 in golden and 1 in the KUT.
CLEARED_SHARE = 0.25


def _cleared_low_bits(f: _Facts) -> int:
  """How many of the lowest mantissa bits the KUT clears: the longest run
  from bit 0 up where no element gained the bit and many lost it (a
  kernel that truncates to fewer significand bits than any named format:
  ``x & ~0xFF`` keeps 15 of float32's 23)."""
  up = np.asarray(f.s["bits_up"])
  down = np.asarray(f.s["bits_down"])
  k = 0
  while (k < f.mant - 1 and int(up[k]) == 0
         and int(down[k]) >= CLEARED_SHARE * f.ndiff):
    k += 1
  return k


def _truncation_bound(f: _Facts, fmt: str) -> tuple[float, str]:
  """Round toward zero's largest relative error into ``fmt`` (2 u(fmt)),
  or into the working format less its cleared low bits when they make it
  coarser; with the format's name for the evidence."""
  bound = 2 * UNIT_ROUNDOFF.get(fmt, f.u)
  k = _cleared_low_bits(f)
  if k and 2.0 ** -(f.mant - k) > bound:
    return 2.0 ** -(f.mant - k), f"{f.work} with {k} low bits cleared"
  return bound, fmt


def _within_truncation(f: _Facts, bound: float) -> bool:
  """Round toward zero into a format moves every element by less than one
  ulp of it: |t - r| < ``bound`` |r| (2 u(fmt), :func:`_truncation_bound`),
  i.e. at most bound / u(work) units
  of the decomposition's u * scale (plus the golden kernel's own error,
  which a KUT truncating the exact result does not have). Without the
  decomposition the relative error against golden is the check. A KUT
  that truncates its own noisy result may add noise of the golden kernel's
  size: twice the golden kernel's largest error is allowed on top."""
  if f.dec:
    return float(f.s["z_max_test"]) <= (1.25 * bound / f.u
                                        + 2 * float(f.s["env_golden_z"]))
  return f.rel_max <= 4 * bound


#: Round to nearest is unbiased at every value: the share of its error's
#: variance between bins of r (``value_r2``) is the bins' sampling noise
#: (128 bins: ~0.01 on 10^4 elements; tf32 inputs of a K = 768 matmul:
#: 0.009). From this share on, the error is a function of the value (a
#: truncation's bias, another closed form), never an input rounding.
ROUNDING_VALUE_R2 = 0.3
#: Round toward zero leaves a relative error U 2u / m (U uniform in
#: [0, 1), m the significand in [1, 2)): on average u E[1/m] = u / (2 ln 2)
#: = 0.72 u over log-uniform significands. A product of two truncated
#: operands shrinks by twice that, u / ln 2 = 1.44 u, and so does their sum.
TRUNCATED_OPERAND_SHRINK = 1.0 / (2.0 * math.log(2.0))
#: The formats whose operand truncation is tested, by kernel (a GEMM's
#: tensor cores truncate raw float32 operands to tf32).
_TRUNCATION_FORMATS = ("tf32", "bf16", "fp16")


def _truncated_operands(f: _Facts) -> list[Candidate]:
  """Operands rounded toward zero into a narrower format: the output
  shrinks by the predicted share (``TRUNCATED_OPERAND_SHRINK`` u(fmt) per
  truncated operand; one or both of a GEMM's), and what the shrink leaves
  is one rounding of the inputs (``INPUT_ROUNDING_LEVEL`` u(fmt)), each
  within ``LEVEL_OCTAVES``. ``precision:<fmt>`` with the rounding mode in
  its parameters, like round to nearest (``_level_hypotheses``)."""
  s = f.s
  if not (f.dec and f.has_ref and f.work in ("fp32", "fp64")):
    return []
  delta, resid = float(s["fit_delta"]), float(s["fit_resid"])
  if not (math.isfinite(delta) and math.isfinite(resid)) or delta >= 0:
    return []
  kernel = str(f.context.get("kernel", "")).split(":")[0]
  operands = 2 if kernel in _GEMM_KERNELS else 1
  for fmt in _TRUNCATION_FORMATS:
    u = UNIT_ROUNDOFF[fmt]
    if u <= f.u:
      continue
    for k in range(operands, 0, -1):
      shrink = k * TRUNCATED_OPERAND_SHRINK * u
      d_shrink = abs(math.log2(-delta / shrink))
      d_rest = abs(math.log2(max(resid, 1e-300) / (INPUT_ROUNDING_LEVEL * u)))
      if d_shrink <= LEVEL_OCTAVES / 2 and d_rest <= LEVEL_OCTAVES:
        what = "both operands" if k == 2 else "an operand"
        return [Candidate(
            f"precision:{fmt}", 0.9 - 0.05 * (d_shrink + d_rest),
            f"t = (1 {delta:+.3g}) r: the outputs shrink by "
            f"{-delta / u:.3g} u({fmt}), where {what} rounded toward zero "
            f"to {fmt} predict {k * TRUNCATED_OPERAND_SHRINK:.3g} u "
            f"({d_shrink:.2g} octaves); the rest, {resid:.3g} of the "
            f"scale, is one rounding of the inputs (0.6 u({fmt}), "
            f"{d_rest:.2g} octaves): inputs truncated to {fmt}",
            {"format": fmt, "where": "inputs", "rounding": "toward_zero",
             "operands": k, "shrink_u": -delta / u})]
  return []


#: The elements beyond the golden envelope are a format's rounding when at
#: least this share of them are golden rounded to it (``n_rounded``, an
#: exact per-element relation; as MATCH_SHARE for the other exact traces).
ROUNDED_SHARE = 0.9


def _rule_rounded_outputs(f: _Facts) -> list[Candidate]:
  """Elements that equal their golden value rounded to a coarser format
  (either direction; ``n_rounded``): that format's precision on the
  elements it covers, never a fault's outliers nor a permutation (part
  of an output computed or stored in bf16, a softmax rounded to bf16)."""
  if (not f.dec or "n_rounded" not in f.s or not f.n_beyond
      or _narrowest(f) is not None):
    return []  # a whole output in the format: the representability rules
  counts = np.asarray(f.s["n_rounded"], np.int64)
  k = int(np.argmax(counts))
  if counts[k] < ROUNDED_SHARE * f.n_beyond:
    return []
  fmt = NARROW_FORMATS[k]
  return [Candidate(
      f"precision:{fmt}", 0.96,
      f"{int(counts[k])} elements ({_pct(counts[k] / f.n)}) are their golden "
      f"values rounded to {fmt} (representable there, within one {fmt} ulp; "
      f"{f.n_beyond} elements are beyond the golden envelope): outputs "
      f"rounded to {fmt}, on {'all' if counts[k] >= 0.99 * f.ndiff else 'part'}"
      " of the output", {"format": fmt, "where": "output",
                         "rounded": int(counts[k]), "covers": int(counts[k])})]


def _narrowest(f: _Facts) -> str | None:
  """The coarsest format the test output is confined to (and golden is
  not): fp8 before fp16 before bf16; None when it fits none."""
  repr_t = dict(zip(NARROW_FORMATS, map(float, f.s["repr_test"])))
  repr_g = dict(zip(NARROW_FORMATS, map(float, f.s["repr_golden"])))
  narrow = [k for k in NARROW_FORMATS
            if repr_t[k] >= 0.99 and repr_g[k] <= repr_t[k] - 0.2]
  return max(narrow, key=lambda k: UNIT_ROUNDOFF[k]) if narrow else None


def _truncation(f: _Facts, narrowest: str | None
                ) -> tuple[list[Candidate], bool]:
  """Round toward zero, against the float64 reference (final when it
  holds) or by the direction of every changed magnitude."""
  s = f.s
  # Against the reference the KUT never lands above the exact magnitude
  # while the golden kernel (round to nearest) does as often as below;
  # against golden, the KUT's truncation of an exact result looks like
  # noise of either sign.
  bound, fmt = _truncation_bound(f, narrowest or f.work)
  # The magnitude gate is a 16-bit one: there a correct kernel's second
  # rounding or a slip below the format's resolution moves a few elements
  # one way at noise ratio ~1; a float32 result rounded toward zero sits
  # at ratio ~1 too when golden's own accumulation error dominates (the
  # native rtz variants), and its one-sidedness over many elements is
  # the trace.
  truncates = (not f.has_ref or f.nbits != 16
               or not f.noise_ratio < TRUNCATION_MIN_RATIO)
  if f.has_ref and f.ndiff >= 16 and truncates:
    t_up, t_dn = float(s["ref_test_grown"]), float(s["ref_test_shrunk"])
    g_up, g_dn = float(s["ref_golden_grown"]), float(s["ref_golden_shrunk"])
    if (t_up <= 0.01 * (t_up + t_dn) and t_dn >= 0.2 and g_up >= 0.25 * (
        g_up + g_dn) and _within_truncation(f, bound)):
      return [Candidate(
          "truncation", 0.93,
          f"against the float64 reference {_pct(t_dn)} of outputs are "
          f"smaller in magnitude and {_pct(t_up)} larger (golden: "
          f"{_pct(g_dn)} / {_pct(g_up)}): results rounded toward zero",
          {"format": fmt, "against": "reference"})], True
  nonzero = f.n - int(s.get("n_golden_zero", 0))
  if (f.ndiff >= 16 and f.larger <= 0.01 * f.ndiff and f.smaller > 0
      and f.ndiff >= TRUNCATION_MIN_SHARE * nonzero
      and truncates and _within_truncation(f, bound)):
    conf = 0.95 if f.rel_max <= bound * 1.01 else 0.7
    return [Candidate(
        "truncation", conf,
        f"{f.smaller} of {f.ndiff} differing elements shrank in magnitude "
        f"and {f.larger} grew; max relative "
        f"error {f.rel_max:.3g} vs 2u({fmt}) = {bound:.3g}: round toward "
        "zero", {"format": fmt})], False
  return [], False


def _narrow_outputs(f: _Facts, fmt: str) -> list[Candidate]:
  """Outputs confined to ``fmt``: one rounding into it, or partial sums
  kept in it. One rounding to nearest leaves every relative error <= u and
  a median near 3u/8 (a uniform position within the last place, over a
  log-uniform spread of significands); a running sum rounded at every add
  leaves more, so a median above 3u/4 is more than one rounding. (The
  median, not the max: values below the normal range round coarser.)"""
  u = UNIT_ROUNDOFF[fmt]
  shares = dict(zip(NARROW_FORMATS, map(float, f.s["repr_test"])))
  gold = dict(zip(NARROW_FORMATS, map(float, f.s["repr_golden"])))
  if not f.rel_med > 0.75 * u:
    return [Candidate(
        f"precision:{fmt}", 0.95,
        f"{_pct(shares[fmt])} of outputs are exact {fmt} values (golden "
        f"{_pct(gold[fmt])}) and the median relative error {f.rel_med:.3g} "
        f"is within one rounding (<= 3u/4 = {0.75 * u:.3g}): outputs "
        f"rounded to {fmt}", {"format": fmt, "where": "output"})]
  return [Candidate(
      f"accumulation:{fmt}", 0.85,
      f"{_pct(shares[fmt])} of outputs are exact {fmt} values but the "
      f"median relative error {f.rel_med:.3g} exceeds one rounding (3u/4 = "
      f"{0.75 * u:.3g}): partial sums were kept in {fmt}", {"format": fmt})]


def _no_reorder(f: _Facts) -> bool:
  """A 16-bit output's benign envelope is the verdict's: another correct
  order rounds once (or two or three times) into the same format, so a
  KUT beyond BENIGN_NOISE_RATIO x golden's distance to float64 there is no
  reordering; the level rules name it (a bf16 accumulation)."""
  return f.has_ref and f.u >= UNIT_ROUNDOFF["fp16"] and not (
      f.noise_ratio <= BENIGN_NOISE_RATIO)


def _within_envelope(f: _Facts) -> list[Candidate]:
  """Nothing but the outliers (explained by a fault, if any) is beyond the
  golden envelope: rounding noise."""
  if not (f.dec and f.n_beyond <= f.n_out and f.has_ref):
    return []
  clean = f.n_out == 0
  conf = (0.95 if not clean or f.noise_ratio <= NOISE_FLOOR_MULTIPLIER * 2
          else 0.85)
  return [Candidate(
      "reordering", conf,
      f"rounding noise: every element{'' if clean else ' but the outliers'}"
      f" is within {f.theta_g:.3g} units of u({f.work}) x its scale of the "
      f"float64 reference (16x the golden kernel's largest, "
      f"{float(f.s['env_golden_z']):.3g}); median relative error "
      f"{f.rel_med:.3g}, bias {float(f.s['bias']):+.2f}, KUT/golden RMS "
      f"error vs float64 = {f.noise_ratio:.3g}",
      {"level_u": f.rel_med / f.u})]


def _within_floor(f: _Facts) -> list[Candidate]:
  """Unbiased noise near the golden kernel's own floor. Another order of
  the same float32 sum stays within a small multiple of the golden
  kernel's own error; far beyond it (a few huge errors under a small
  median) is no reordering, whatever the median says."""
  within = f.has_ref and f.noise_ratio <= NOISE_FLOOR_MULTIPLIER * 2
  far_beyond = f.has_ref and not f.noise_ratio <= REORDERING_ENVELOPE
  if not (within or (f.rel_med <= 16 * f.u and not far_beyond)):
    return []
  floor = (f"KUT/golden RMS error vs float64 = {f.noise_ratio:.3g}"
           if f.has_ref else "no float64 reference")
  return [Candidate(
      "reordering", 0.95 if within else 0.8,
      f"unbiased rounding noise: median relative error {f.rel_med:.3g} "
      f"({f.rel_med / f.u:.3g} u({f.work})), bias "
      f"{float(f.s['bias']):+.2f}, {f.larger} up / {f.smaller} down; "
      f"{floor}", {"level_u": f.rel_med / f.u})]


def _long_sum_order(f: _Facts) -> list[Candidate]:
  """Far beyond the golden kernel's error yet within what a K-term sum
  kept in the working format reaches in a correct order (XLA's blocked
  sum is far more accurate than one added in order), its largest error at
  the output's scale (max(|golden|, its RMS)) too: another order."""
  scaled_max = float(_analyzer.relative_to_scale(f.s)["rel_max"])
  long_bound = long_sum_bound(f)
  if not (f.has_ref and within_long_sum(f)
          and scaled_max <= WORKING_SUM_MAX * long_bound):
    return []
  k = int(f.context["reduction"])
  return [Candidate(
      "reordering", 0.8,
      f"another order of a long sum: median relative error {f.rel_med:.3g}, "
      f"max {scaled_max:.3g} (against max(|golden|, its RMS)), within "
      f"{ACCUMULATION_LEVEL:g} sqrt(K) u({f.work}) x 2^{LEVEL_OCTAVES:g} "
      f"= {long_bound:.3g} for K = {k} terms kept in {f.work} (a correct "
      f"sum in another order reaches it); KUT/golden RMS error vs float64 "
      f"= {f.noise_ratio:.3g}", {"level_u": f.rel_med / f.u})]


def _level(f: _Facts) -> list[Candidate]:
  """Outputs at working precision whose median relative error is one of
  the level hypotheses' (inputs rounded to nearest into a format, a
  narrow accumulator), within LEVEL_OCTAVES; never for an error that is a
  function of the value (``ROUNDING_VALUE_R2``)."""
  if f.dec and float(f.s["value_r2"]) >= ROUNDING_VALUE_R2:
    return []  # a closed form or a truncation's bias, not input rounding
  level = f.rel_med
  best, dist, pred = None, math.inf, math.nan
  for model, predicted in _level_hypotheses(f.context, f.work):
    d = abs(math.log2(max(level, 1e-300)) - math.log2(predicted))
    if d < dist:
      best, dist, pred = model, d, predicted
  if best is None or dist > LEVEL_OCTAVES:
    return []
  fmt = best.split(":")[1]
  if best.startswith("accumulation"):
    why = (f"0.3 sqrt(K) u({fmt}) = {pred:.3g} for a K = "
           f"{int(f.context['reduction'])} reduction whose running sum is "
           f"kept in {fmt}")
  else:
    why = (f"0.6 u({fmt}) = {pred:.3g} for inputs or intermediates rounded "
           f"to {fmt}")
  port = f.context.get("port") or {}
  # The probe computed the kernel on rounded inputs and they did not
  # explain it: the level alone is weaker evidence than that.
  probed = any(str(n).startswith("inputs_") for n in port.get("tried", ())
               ) and not port.get("explains")
  return [Candidate(
      best, (0.7 if probed else 0.85) - 0.1 * dist,
      f"outputs are at working precision with median relative error "
      f"{level:.3g}, {dist:.2g} octaves from {why}",
      {"format": fmt, "where": "inputs" if best.startswith("precision")
       else "accumulator", "rounding": "nearest_even"})]


def _rule_rounding(f: _Facts) -> list[Candidate]:
  """Dense, bounded errors: truncation, precision, accumulation,
  reordering. The hypotheses in order; the first that holds ends the
  search (a truncation by direction is kept beside the next)."""
  if not f.ndiff:
    return []
  narrowest = _narrowest(f)
  out, final = _truncation(f, narrowest)
  if final:
    return out
  if narrowest is not None:
    return out + _narrow_outputs(f, narrowest)
  # Outputs at working precision: the error level tells the story.
  stages = ((_level,) if _no_reorder(f) else
            (_within_envelope, _within_floor, _long_sum_order, _level))
  for stage in stages:
    if stage is _level:
      found = _truncated_operands(f)
      if found:
        return out + found
    found = stage(f)
    if found:
      return out + found
  return out
