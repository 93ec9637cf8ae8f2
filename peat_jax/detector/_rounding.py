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


def _rule_rounding(f: _Facts) -> list[Candidate]:
  """Dense, bounded errors: truncation, precision, accumulation, reordering."""
  s = f.s
  out = []
  if not f.ndiff:
    return out
  repr_t = {k: float(v) for k, v in zip(NARROW_FORMATS, s["repr_test"])}
  repr_g = {k: float(v) for k, v in zip(NARROW_FORMATS, s["repr_golden"])}
  # Formats the test output is confined to (and golden is not).
  narrow = [k for k in NARROW_FORMATS
            if repr_t[k] >= 0.99 and repr_g[k] <= repr_t[k] - 0.2]
  narrowest = narrow[-1] if narrow else None
  if narrow:
    # The coarsest format the output fits (fp8 before fp16 before bf16).
    narrowest = max(narrow, key=lambda k: UNIT_ROUNDOFF[k])

  # Truncation against the float64 reference: the KUT never lands above
  # the exact magnitude while the golden kernel (round to nearest) does as
  # often as below. Needs the reference: against golden, the KUT's
  # truncation of an exact result looks like noise of either sign.
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
      out.append(Candidate(
          "truncation", 0.93,
          f"against the float64 reference {_pct(t_dn)} of outputs are "
          f"smaller in magnitude and {_pct(t_up)} larger (golden: "
          f"{_pct(g_dn)} / {_pct(g_up)}): results rounded toward zero",
          {"format": fmt, "against": "reference"}))
      return out
  # Truncation: every changed magnitude went down, over many elements.
  nonzero = f.n - int(s.get("n_golden_zero", 0))
  if (f.ndiff >= 16 and f.larger <= 0.01 * f.ndiff and f.smaller > 0
      and f.ndiff >= TRUNCATION_MIN_SHARE * nonzero
      and truncates and _within_truncation(f, bound)):
    conf = 0.95 if f.rel_max <= bound * 1.01 else 0.7
    out.append(Candidate(
        "truncation", conf,
        f"{f.smaller} of {f.ndiff} differing elements shrank in magnitude "
        f"and {f.larger} grew; max relative "
        f"error {f.rel_max:.3g} vs 2u({fmt}) = {bound:.3g}: round toward "
        "zero", {"format": fmt}))

  if narrowest is not None:
    u = UNIT_ROUNDOFF[narrowest]
    # One rounding to nearest into fmt leaves every relative error <= u and
    # a median near 3u/8 (a uniform position within the last place, over a
    # log-uniform spread of significands); a running sum rounded at every
    # add leaves more. A median above 3u/4 is therefore more than one
    # rounding. (The median, not the max, is compared: values below the
    # format's normal range round more coarsely.)
    is_acc = f.rel_med > 0.75 * u
    if not is_acc:
      out.append(Candidate(
          f"precision:{narrowest}", 0.95,
          f"{_pct(repr_t[narrowest])} of outputs are exact {narrowest} "
          f"values (golden {_pct(repr_g[narrowest])}) and the median relative "
          f"error {f.rel_med:.3g} is within one rounding (<= 3u/4 = "
          f"{0.75 * u:.3g}): "
          f"outputs rounded to {narrowest}",
          {"format": narrowest, "where": "output"}))
    else:
      out.append(Candidate(
          f"accumulation:{narrowest}", 0.85,
          f"{_pct(repr_t[narrowest])} of outputs are exact {narrowest} "
          f"values but the median relative error {f.rel_med:.3g} exceeds "
          f"one rounding (3u/4 = {0.75 * u:.3g}): partial sums were "
          f"kept in {narrowest}", {"format": narrowest}))
    return out

  # Outputs at working precision: the error level tells the story.
  level = f.rel_med
  # A 16-bit output's benign envelope is the verdict's: another correct
  # order rounds once (or two or three times) into the same format, so a
  # KUT beyond BENIGN_NOISE_RATIO x golden's distance to float64 there is
  # no reordering; the level rules below name it (a bf16 accumulation).
  no_reorder = f.has_ref and f.u >= UNIT_ROUNDOFF["fp16"] and not (
      f.noise_ratio <= BENIGN_NOISE_RATIO)
  if f.dec and f.n_beyond <= f.n_out and f.has_ref and not no_reorder:
    # Nothing but the outliers (explained by a fault, if any) is beyond the
    # golden envelope: rounding noise.
    clean = f.n_out == 0
    conf = (0.95 if not clean or f.noise_ratio <= NOISE_FLOOR_MULTIPLIER * 2
            else 0.85)
    out.append(Candidate(
        "reordering", conf,
        f"rounding noise: every element{'' if clean else ' but the outliers'}"
        f" is within {f.theta_g:.3g} units of "
        f"u({f.work}) x its scale of the float64 reference (16x the golden "
        f"kernel's largest, {float(s['env_golden_z']):.3g}); median relative "
        f"error {level:.3g}, bias {float(s['bias']):+.2f}, KUT/golden RMS "
        f"error vs float64 = {f.noise_ratio:.3g}",
        {"level_u": level / f.u}))
    return out
  within_floor = f.has_ref and f.noise_ratio <= NOISE_FLOOR_MULTIPLIER * 2
  # Another order of the same float32 sum stays within a small multiple of
  # the golden kernel's own error; far beyond it (a few huge errors under a
  # small median) is no reordering, whatever the median says.
  far_beyond = f.has_ref and not f.noise_ratio <= REORDERING_ENVELOPE
  if (within_floor or (level <= 16 * f.u and not far_beyond)) and not (
      no_reorder):
    conf = 0.95 if within_floor else 0.8
    floor = (f"KUT/golden RMS error vs float64 = {f.noise_ratio:.3g}"
             if f.has_ref else "no float64 reference")
    out.append(Candidate(
        "reordering", conf,
        f"unbiased rounding noise: median relative error {level:.3g} "
        f"({level / f.u:.3g} u({f.work})), bias {float(s['bias']):+.2f}, "
        f"{f.larger} up / {f.smaller} down; {floor}",
        {"level_u": level / f.u}))
    return out
  # The largest error at the output's scale (max(|golden|, its RMS)): an
  # output whose terms cancel carries the sum's error at the terms' scale.
  scaled_max = float(_analyzer.relative_to_scale(s)["rel_max"])
  long_bound = long_sum_bound(f)
  if (f.has_ref and not no_reorder and within_long_sum(f)
      and scaled_max <= WORKING_SUM_MAX * long_bound):
    # Far beyond the golden kernel's error yet within what a K-term sum
    # kept in the working format reaches in a correct order (XLA's blocked
    # sum is far more accurate than one added in order): another order.
    k = int(f.context["reduction"])
    out.append(Candidate(
        "reordering", 0.8,
        f"another order of a long sum: median relative error {level:.3g}, "
        f"max {scaled_max:.3g} (against max(|golden|, its RMS)), within "
        f"{ACCUMULATION_LEVEL:g} sqrt(K) u({f.work}) x 2^{LEVEL_OCTAVES:g} "
        f"= {long_bound:.3g} for "
        f"K = {k} terms kept in {f.work} (a correct sum in another order "
        f"reaches it); KUT/golden RMS error vs float64 = "
        f"{f.noise_ratio:.3g}", {"level_u": level / f.u}))
    return out
  if f.dec and float(s["value_r2"]) >= 0.6:
    return out  # a function of the value: a closed form, not input rounding
  best, dist = None, math.inf
  for model, predicted in _level_hypotheses(f.context, f.work):
    d = abs(math.log2(max(level, 1e-300)) - math.log2(predicted))
    if d < dist:
      best, dist, pred = model, d, predicted
  if best is not None and dist <= LEVEL_OCTAVES:
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
    out.append(Candidate(
        best, (0.7 if probed else 0.85) - 0.1 * dist,
        f"outputs are at working precision with median relative error "
        f"{level:.3g}, {dist:.2g} octaves from {why}",
        {"format": fmt, "where": "inputs" if best.startswith("precision")
         else "accumulator"}))
  return out
