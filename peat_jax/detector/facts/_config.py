"""Every threshold of the Detector, in one frozen object, with its derivation.

A threshold is either a floating-point fact (a unit roundoff, a binomial
tail, the size of a K-term sum's rounding) or a quantile of a named
calibration measurement. :class:`DetectorConfig` holds them all; the rules
read them from the config of the call (``peat.detect(sig,
config=...)``, :data:`CONFIG` by default), never from a bare number.
:func:`config_table` renders the table docs/detector.md shows (generated,
and checked in CI by tests/detector/test_config.py).

>>> from peat_jax.detector import CONFIG
>>> CONFIG.benign_noise_ratio
4.0
"""

from __future__ import annotations

import dataclasses
import math

from peat_jax import analyzer as _analyzer

#: The basis of a threshold: a floating-point fact, or a calibration
#: quantile (the measurement it names follows in its derivation).
FACT = "fact"
CALIBRATION = "calibration"


def _t(value: float, basis: str, derivation: str):
  """A config field: its default value, basis and derivation."""
  return dataclasses.field(default=value, metadata={
      "basis": basis, "derivation": " ".join(derivation.split())})


@dataclasses.dataclass(frozen=True)
class DetectorConfig:
  """The Detector's thresholds (each field's metadata: its derivation)."""

  # -- the golden envelope and the verdict of rounding noise --------------
  noise_floor_multiplier: float = _t(2.0, CALIBRATION, """
      torch.compile's fp64 check: a KUT within 2x the golden kernel's RMS
      error against float64 is the golden kernel's own noise (measured
      here: torch's SDPA backward at 1.4-1.9x on eight seeds).""")
  benign_noise_ratio: float = _t(4.0, CALIBRATION, """
      reordering passes up to 4x the golden kernel's RMS error against
      float64: two x86-64 CPUs of one kind rounded the same golden dots
      1.7x apart, and correct kernels written another standard way sit at
      up to 2x on one of them (torch's SDPA backward: 1.4-1.9x on eight
      seeds).""")
  reordering_envelope: float = _t(16.0, CALIBRATION, """
      another correct order of a float32 sum was measured at up to 4x the
      golden kernel's error (calibration, 774 tensor cases); 4x beyond
      that no order of the same formula reaches.""")
  # -- patterns and exact traces -------------------------------------------
  min_pattern: float = _t(8, FACT, """
      8 independent events share one polarity (or one lane) with
      probability 2**-7: fewer elements are no pattern.""")
  pattern_alpha: float = _t(2.0 ** -7, FACT, """
      the binomial tail below which a pattern is not chance: the
      probability that 8 fair coins agree (min_pattern).""")
  match_share: float = _t(0.9, FACT, """
      an exact relation (a shift, a transpose, a cause covering the
      outliers) holds on at least 90% of the compared elements: rounding
      noise of the base may hide a few at the envelope's edge.""")
  majority: float = _t(0.95, FACT, """
      a structural pattern (one lane, one stuck bit) holds on at least 95%
      of its elements: a uniform spread over 32 lanes puts 3% in one.""")
  sparse_share: float = _t(0.01, FACT, """
      a sparse fault (flips, random values) touches at most 1% of the
      elements (at least min_pattern of them may always be sparse).""")
  sparse_whole_share: float = _t(0.25, FACT, """
      without a decomposition, a sparse fault changes at most a quarter
      of the elements: round to nearest changes about half of them.""")
  flip_bits_whole: float = _t(3.0, FACT, """
      without a decomposition, flips differ from golden in at most 3 bits
      per element on average; a random float32 value differs in 16.""")
  permutation_gain: float = _t(16.0, FACT, """
      values permuted among the outliers meet their references when both
      are sorted: sorting shrinks the outliers' error by at least the
      golden envelope's factor, 16 (a smooth distortion of the values,
      another formula, keeps its error when sorted).""")
  permutation_sample_factor: float = _t(2.0, FACT, """
      n values drawn like the data (random values in a lane or a tile)
      also meet golden's when both are sorted, to about their spread over
      sqrt(n) (two samples of one distribution: the gaps of their order
      statistics): sorting shrinks their error by about 0.7 sqrt(n), at
      most 1.6 sqrt(n) in 99 of 100 draws (normal samples, n = 64 to
      4096); a permutation's sorted values meet theirs within the base's
      rounding: a gain beyond 2 sqrt(n).""")
  flip_odds: float = _t(2.0 ** -3, FACT, """
      bitflip predicts its outliers back inside the base after the flips
      with probability ~1, a value drawn like the data with the flip
      null's p: over a base that is not golden itself, bitflip is named
      where the binomial tail of the null is at most 1/8 (a likelihood
      ratio of 8; the null's 16 partners per place resolve p down to
      1/18).""")
  biased: float = _t(0.5, FACT, """
      rounding to nearest is unbiased: the mean of its errors is within
      4/sqrt(n) of their RMS (0.5 from n = 64); a dense error more biased
      than that is no rounding to nearest, nor another order.""")
  biased_min_count: float = _t(64, FACT, """
      the bias is read on at least 64 elements (see biased).""")
  permuted_error: float = _t(2.0 ** -4, FACT, """
      values in another place err by about the spread of the values; a
      permutation's largest error is at least 1/16 of the golden RMS
      (quantized outputs exchanging neighbours err by one ulp).""")
  # -- dense levels of rounding --------------------------------------------
  accumulation_level: float = _t(0.3, CALIBRATION, """
      the median relative error of a K-term sum rounded to u at every add
      is about 0.3 sqrt(K) u (random walk; measured 0.25-0.42 sqrt(K) u on
      matmul, softmax and layer norm).""")
  accumulation_tail: float = _t(4.0, FACT, """
      a K-term sum rounded to u at every add errs by at most
      lambda sqrt(K) u sum|terms| with probability 1 - 2 exp(-lambda**2/2)
      (Higham and Mary's probabilistic bound; lambda = 4: 0.9993 per
      element), and sum|terms| is about sqrt(K) times the output's RMS for
      terms of either sign: an accumulator's largest error is 4 K u x the
      golden RMS.""")
  biased_sum_level: float = _t(2.4, CALIBRATION, """
      an in-order float32 sum of K terms whose small terms fall below half
      an ulp of the running sum loses them, shifting it by ~2.4 sqrt(K) u
      (softmax of 2**20 logits of deviation 2,
      tests/detector/test_long_sums.py): a normalizer's shift, not a
      scale fault.""")
  input_rounding_level: float = _t(0.6, CALIBRATION, """
      inputs rounded to a format of unit roundoff u leave a median
      relative error of about 0.6 u in a float32 result (measured 0.5-1.5 u
      on matmul, layer norm and softmax of normal inputs).""")
  level_octaves: float = _t(1.5, CALIBRATION, """
      a level hypothesis holds within 1.5 octaves of the observed median
      (the spread of the measured levels above: 0.25-0.42 and 0.5-1.5 are
      each within 1.6 octaves).""")
  one_rounding_median: float = _t(0.75, FACT, """
      one rounding to nearest leaves a median relative error near 3u/8
      (a uniform position in the last place over log-uniform
      significands); above 3u/4 (twice that) it is more than one
      rounding.""")
  truncated_operand_shrink: float = _t(1.0 / (2.0 * math.log(2.0)), FACT, """
      round toward zero leaves a relative error U 2u / m (U uniform, m the
      significand in [1, 2)): u E[1/m] = u / (2 ln 2) = 0.72 u on average
      per truncated operand.""")
  long_sum_min_u: float = _t(16.0, FACT, """
      a reduction is long when its working-sum level exceeds 16 u (the
      golden envelope without a reference): from K = 356 terms at 0.3
      sqrt(K) u x 2**1.5.""")
  working_sum_max: float = _t(4.0, FACT, """
      another order of a long working-precision sum keeps its largest
      error at the output's scale within 4x its level (Gaussian tails of
      the random walk at 10**5 elements).""")
  # -- truncation ------------------------------------------------------------
  truncation_min_ratio: float = _t(1.5, FACT, """
      round toward zero into the output's own format has an RMS error
      about twice round to nearest's; a 16-bit KUT below 1.5x the golden
      kernel's has lost nothing to truncation.""")
  truncation_min_share: float = _t(0.25, FACT, """
      round toward zero changes about half of the nonzero outputs against
      round to nearest; a one-sided change of fewer than a quarter is a
      normalizer a fraction of an ulp smaller.""")
  one_sided: float = _t(0.01, FACT, """
      one-sided: at most 1% of the changed magnitudes go the other way
      (the golden kernel's own rounding of elements near a tie).""")
  one_sided_min_share: float = _t(0.2, FACT, """
      against the reference, round toward zero shrinks at least 20% of
      the outputs (those whose exact value is not representable).""")
  cleared_share: float = _t(0.25, FACT, """
      a low bit counts as cleared when at least a quarter of the differing
      elements lost it and none gained it (half of them have it set).""")
  # -- ports: another constant or closed form ------------------------------
  value_r2: float = _t(0.3, CALIBRATION, """
      round to nearest is unbiased at every value: the share of its
      error's variance between 128 bins of r is their sampling noise
      (measured 0.009 for tf32 inputs of a K = 768 matmul, 0.01 on 10**4
      elements);
      from 0.3 the error is a function of the value.""")
  row_fit_share: float = _t(0.3, FACT, """
      a per-row scale explains a row's error when its residual is at most
      0.3 of it (91% of its energy).""")
  row_order: float = _t(0.95, FACT, """
      a constant's effect on a normalization follows the row statistic it
      meets almost exactly (rank correlation 0.95 or more); an approximate
      reciprocal's follows its significand bits.""")
  approximation_bound: float = _t(_analyzer.LIBRARY_BOUND, FACT, """
      the library of known approximations (peat_jax.analyzer.slips:
      fast exp, rsqrt, reciprocal, erf, tanh and their fitted classes)
      errs by at most this much of its function, measured at import on
      fixed grids (LIBRARY_BOUND); a dense error beyond it is another
      function, a wrong formula (unknown), not an approximation.""")
  formula_fail_level: float = _t(2.0 ** -8, FACT, """
      a port's other constant or form warns while its RMS error stays
      within u(bf16) = 2**-8 of the scale (what bf16 training tolerates)
      and fails beyond it.""")
  row_spread_min: float = _t(0.05, FACT, """
      per-row factors that spread by more than 5% of their mean are a
      row statistic's effect, not one constant (a scale).""")
  # -- scale and the whole-record relations --------------------------------
  scale_spread_u: float = _t(8.0, FACT, """
      t = c g rounded: t/g varies by at most ~2u around c; 8u allows the
      golden's own rounding on both sides.""")
  scale_min_u: float = _t(64.0, FACT, """
      a scale differs from 1 by more than 64 u: a normalizer a few ulps
      off is rounding.""")
  fit_share: float = _t(0.05, FACT, """
      a record-wide scale explains the error when the fit's residual and
      its per-row spread are each at most 5% of the scale's delta.""")
  # -- sparse whole-record rules -------------------------------------------
  sparse_exact_share: float = _t(0.01, FACT, """
      with at most 1% of the elements differing (the rest bitwise golden),
      sparse elements far beyond their own ulps are faults even inside
      the rounding envelope.""")
  sparse_exact_bits: float = _t(1.5, FACT, """
      ... when they differ from golden in at most 1.5 bits on average (a
      flip is one; 8 or more ulps of rounding noise carry through
      several).""")
  flip_min_ulps: float = _t(8.0, FACT, """
      an element moved by fewer than 8 of its own ulps is rounding, not a
      flip (another order moves values by a few ulps).""")
  rounding_abs_ulps: float = _t(1024.0, FACT, """
      with more than sparse_share of the elements differing, errors below
      1024 u of the golden RMS are a short reduction's cancellation noise
      (outputs near zero are many of their own ulps off).""")
  sparse_min_scale_units: float = _t(2.0, FACT, """
      a moved element within 2 u of the golden RMS is rounding at the
      output's scale, whatever its own ulp distance.""")
  stuck_spike: float = _t(4.0, FACT, """
      a dense error's rounding changes a run of low bits, each bit above
      in about half as many elements as the one below (a carry reaches it
      half as often); a bit changed in 4x as many elements as each of its
      neighbours (twice that decay) is moved on its own: a stuck bit.""")
  sign_magnitude_tol: float = _t(2.0 ** -4, FACT, """
      a stuck sign bit leaves every magnitude golden's up to the base's
      rounding: the geometric mean of |t| / |g| stays within the coarsest
      base's unit roundoff (fp8_e4m3 inputs, 2**-4) of 1; a wrong formula
      whose values cross zero moves it far more (a softmax VJP without
      its diagonal term: 0.23).""")
  stuck_low_bit_share: float = _t(0.25, FACT, """
      a last bit rounded the other way within the envelope changes fewer
      than a quarter of the elements; a stuck bit 0 changes about half.""")
  hot_factor: float = _t(64.0, FACT, """
      a column (row) belongs to an edge band when its mean error is 64x
      the median column's (a fault's band against rounding noise).""")
  lane_min_cols: float = _t(64, FACT, """
      lanes (column index mod 32) are read on at least two full periods
      of 32 columns.""")
  lane_min_lines: float = _t(2, FACT, """
      a lane is periodic: its elements lie in at least two of its columns
      (each with half of the busiest one's); one column is a line, whole
      (zero) or in part.""")
  # -- zeros, flushes, saturation ------------------------------------------
  zero_share: float = _t(0.9, FACT, """
      zeros are the fault when at least 90% of the elements it leaves are
      zero (as match_share).""")
  flush_other_share: float = _t(0.05, FACT, """
      a flush explains the differing elements when at most 5% of them are
      not golden values below the format's smallest normal.""")
  tiny_flush_power: float = _t(2, FACT, """
      a zero where golden holds less than u**2 x the output's RMS is a
      flushed tiny output: a cancelling sum's residue is at least u times
      its terms' scale, so no order of the sum zeroes a value u times
      smaller (u float32's for a 16-bit record: its kernels sum in
      float32 and round once).""")
  saturation_share: float = _t(0.5, FACT, """
      values clipped at a format's maximum are the cause when they are at
      least half of the elements that differ.""")
  half: float = _t(0.5, FACT, """
      a majority: more than half of the elements (a band: at most half of
      the lines).""")
  band_min_lines: float = _t(4, FACT, """
      a trailing band, or per-row factors, are read on at least 4 lines
      (rows or columns).""")
  repr_share: float = _t(0.99, FACT, """
      outputs are in a coarser format when 99% of them are representable
      there (a float32 value is bf16-representable by chance with
      probability 2**-16).""")
  repr_gap: float = _t(0.2, FACT, """
      ... and golden's outputs are at least 20 points less so (a golden
      output already in the format says nothing of the KUT).""")
  one_rounding_typical: float = _t(0.375, FACT, """
      the median relative error of one rounding to nearest: 3u/8 (a
      uniform position in the last place, log-uniform significands).""")
  narrow_level_low: float = _t(0.25, FACT, """
      an error level within [1/4, 2] u of bf16 or fp16 is a computation in
      that format (one to a few roundings), not a closed form's.""")
  narrow_level_high: float = _t(2.0, FACT, """
      the upper end of that band: a few roundings of a computation in bf16
      or fp16 stay within 2 u of it (narrow_level_low).""")
  truncation_margin: float = _t(1.25, FACT, """
      truncation's bound in units of u x scale holds a quarter more: the
      scale adds the row's RMS to |r|, and golden's own rounding of the
      truncated value.""")
  truncation_golden_factor: float = _t(4.0, FACT, """
      without a reference the relative error against golden (itself up
      to u off, and near a binade edge twice that) stays within 4x the
      truncation bound.""")
  truncation_min_count: float = _t(16, FACT, """
      one-sidedness is read on at least 16 differing elements (16 fair
      coins agree with probability 2**-15).""")
  # -- degenerate figures --------------------------------------------------
  tiny_figure: float = _t(2.0 ** -126, FACT, """
      float32's smallest normal: a scale below it / u cannot carry a unit
      of roundoff (u x scale underflows).""")
  underflow_factor: float = _t(2.0, FACT, """
      at an underflowing scale errors are absolute: a kernel that flushes
      subnormals (XLA on CPU does) is off by up to the working format's
      smallest normal per element, one that keeps them by less; the KUT
      is measured within 2x the larger of that and the golden kernel's
      own distance to float64 (the golden is one such kernel).""")


#: The Detector's thresholds by default.
CONFIG = DetectorConfig()


def derivation(name: str) -> tuple[str, str]:
  """``(basis, derivation)`` of a threshold of :class:`DetectorConfig`.

  Raises:
    KeyError: no such threshold.
  """
  for f in dataclasses.fields(DetectorConfig):
    if f.name == name:
      return f.metadata["basis"], f.metadata["derivation"]
  raise KeyError(f"no Detector threshold named {name!r}")


def _shown(value: float) -> str:
  if float(value).is_integer():
    return f"{value:g}"
  k = math.log2(value)
  if k.is_integer():
    return f"2**{int(k)}"
  return f"{value:.4g}"


def config_table(config: DetectorConfig = CONFIG) -> str:
  """The Markdown table of every threshold: name, value, basis and
  derivation (docs/detector.md holds it, generated)."""
  rows = ["| threshold | value | basis | derivation |",
          "| --- | --- | --- | --- |"]
  for f in dataclasses.fields(config):
    rows.append(f"| `{f.name}` | {_shown(getattr(config, f.name))} | "
                f"{f.metadata['basis']} | {f.metadata['derivation']} |")
  return "\n".join(rows)
