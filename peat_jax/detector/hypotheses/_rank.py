"""Ranking and verdict: one small function over the accepted hypotheses.

A fault (a sparse or structured cause) is the primary cause whenever one
is accepted, ranked by :data:`~._hypotheses.FAULT_TIERS`, then by the
elements it explains; the best base (the dense error of the arithmetic,
in :data:`~._hypotheses.HYPOTHESES` order) is then the secondary cause,
or the primary one when no fault is. The record's verdict is the worst of
the two causes' (:func:`model_verdict`); a NaN/Inf mismatch always fails
and a record whose figures are degenerate never passes.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from peat_jax import core as _core
from peat_jax.detector.facts import Found, Unexplained
from peat_jax.detector.facts import (
    FAULT_MODELS, PORT_MODELS, PRECISION_MODELS, Candidate, Diagnosis, Facts,
    family, pct, within_working_sum)
from peat_jax.detector.hypotheses._h_port import level as port_level
from peat_jax.detector.hypotheses._h_port import undetermined_note
from peat_jax.detector.hypotheses._hypotheses import FAULT_TIERS, Hypothesis

_ORDER = {"pass": 0, "warn": 1, "fail": 2}


def _plain(v):
  """A parameter value as records and JSON hold it (tuples as lists)."""
  return list(v) if isinstance(v, tuple) else v


def candidate(found: Found) -> Candidate:
  """The Candidate of an accepted hypothesis (its typed evidence's fields
  as ``params``, NaN fields left out)."""
  params = {k: _plain(v) for k, v in found.evidence._asdict().items()
            if not (isinstance(v, float) and math.isnan(v))}
  return Candidate(found.model, float(found.fit), found.sentence, params,
                   found.evidence)


def _tier(found: Found) -> int:
  kind = getattr(found.evidence, "kind", "")
  return FAULT_TIERS.get(f"{family(found.model)}:{kind}",
                         FAULT_TIERS.get(family(found.model), 99))


def is_fault(model: str) -> bool:
  """Whether an error model is a fault (it decides a fail)."""
  return family(model) in FAULT_MODELS


def model_verdict(model: str, f: Facts) -> str:
  """The verdict one cause gives the record.

  ``exact`` passes; ``reordering`` passes within benign_noise_ratio of
  the golden noise floor (or a long sum's working-sum level, or on a
  record too small to have a floor: :func:`no_floor`), else warns;
  precision, accumulation, truncation, ftz and nondeterminism warn; a
  port's other constant or form warns within formula_fail_level of the
  scale and fails beyond; a fault fails; ``unknown`` warns only when
  every element is within the rounding envelope and the error within
  reordering_envelope x the golden floor, and fails otherwise.
  """
  cfg, fam = f.cfg, family(model)
  if fam == "exact":
    return "pass"
  if fam == "reordering":
    benign = (not f.has_ref or f.noise_ratio <= cfg.benign_noise_ratio
              or within_working_sum(f) or no_floor(f))
    return "pass" if benign else "warn"
  if fam in PRECISION_MODELS:
    return "warn"
  if fam in PORT_MODELS:
    return "warn" if port_level(f) <= cfg.formula_fail_level else "fail"
  if fam == "unknown" and _unknown_within(f):
    return "warn"
  return "fail"


def no_floor(f: Facts) -> bool:
  """Fewer than min_pattern elements: the golden kernel's error over them
  is no noise floor (one dot product XLA rounds almost exactly puts a
  correct in-order sum of 134 terms at 132x it), so a ``reordering``
  there, every element within rounding of its scale, is not read
  against it."""
  return f.n < f.cfg.min_pattern


def _unknown_within(f: Facts) -> bool:
  """More than rounding noise, yet every element within the rounding
  envelope (a 16-bit record: within the outlier floor), no NaN/Inf
  mismatch and the error within reordering_envelope x the golden floor:
  a dense error of rounding size no model names is looked at, not
  failed."""
  within = f.dec and (f.n_beyond == 0 or (not f.wide and f.n_out == 0))
  return bool(f.has_ref and within
              and not int(np.asarray(f.sig.n_nonfinite_mismatch))
              and np.isfinite(f.noise_ratio)
              and f.noise_ratio <= f.cfg.reordering_envelope)


def unknown(f: Facts) -> Found:
  """No hypothesis explains it: what was seen, in numbers."""
  s = f.sig
  floor = (f", {f.noise_ratio:.3g}x the golden noise floor"
           if f.has_ref else "")
  rel = f.scaled_max
  seen = [f"{f.ndiff} elements ({pct(f.share)}) differ, median relative "
          f"error {f.rel_med:.3g}, max {rel:.3g} (against max(|golden|, "
          f"its RMS)){floor}"]
  if f.dec:
    seen.append(f"{f.n_beyond} beyond the rounding envelope, {f.n_out} "
                "outliers beyond the KUT's own noise")
    r2 = float(np.asarray(s.value_r2))
    if np.isfinite(r2) and r2 >= f.cfg.value_r2:
      seen.append(f"{r2:.0%} of the error is a function of the value")
  return Found("unknown", Unexplained(f.ndiff, f.noise_ratio, f.ndiff),
               "; ".join(seen) + "; no error model explains it"
               + undetermined_note(f.ctx.probe), f.cfg.half)


def within_underflow(f: Facts) -> bool:
  """Whether the KUT, at an underflowing scale, is within
  ``underflow_factor`` x the larger of the working format's smallest
  normal and the golden kernel's own distance to float64 (absolute: no
  relative figure is measured there)."""
  if not f.has_ref:
    return False
  t = float(np.asarray(f.sig.ref_test_abs_max))
  g = float(np.asarray(f.sig.ref_golden_abs_max))
  tiny = _core.FORMATS[f.work].min_normal
  return (math.isfinite(t) and t <= f.cfg.underflow_factor * max(
      g if math.isfinite(g) else 0.0, tiny))


def degenerate(f: Facts) -> list[str]:
  """The derived figures of a differing record that are degenerate (NaN,
  Inf, 0/0, a zero or underflowing scale), each as ``name value (why)``;
  empty when every figure is measured. A zero or underflowing golden
  scale is measured in absolute terms instead (:func:`within_underflow`):
  not degenerate when the KUT is within it."""
  if not f.ndiff:
    return []
  out = []
  grms = f.golden_rms
  underflowing = (not math.isfinite(grms) or grms == 0.0
                  or grms * f.u < f.cfg.tiny_figure)
  if underflowing and math.isfinite(grms) and within_underflow(f):
    pass  # errors below the smallest normal: the format's, not the KUT's
  elif not math.isfinite(grms) or grms == 0.0:
    out.append(f"golden RMS {grms:.3g} (a zero or non-finite scale)")
  elif grms * f.u < f.cfg.tiny_figure:
    out.append(f"golden RMS {grms:.3g} below tiny / u({f.work}) = "
               f"{f.cfg.tiny_figure / f.u:.3g} (u x scale underflows: "
               "errors there are below the smallest normal number)")
  figures = {"median relative error": f.rel_med}
  if f.has_ref:
    figures["noise ratio"] = f.noise_ratio
  if f.dec:
    figures.update({"envelope theta": f.theta,
                    "golden envelope": f.theta_g,
                    "median z of the KUT": f.zmed_t})
  return out + [f"{name} {value}" for name, value in figures.items()
                if not np.isfinite(value)]


def _worst(a: str, b: str) -> str:
  return a if _ORDER[a] >= _ORDER[b] else b


def _guarded(verdict: str, evidence: str, f: Facts, model: str
             ) -> tuple[str, str]:
  """The two rules no cause overrides: a NaN/Inf where one side is finite
  fails; degenerate figures never pass."""
  n = int(np.asarray(f.sig.n_nonfinite_mismatch))
  if n and verdict != "fail":
    verdict, evidence = "fail", (
        f"{evidence}; {n} elements are NaN/Inf in one of the KUT and golden "
        "outputs and finite in the other (a hard fail)")
  found = degenerate(f) if verdict == "pass" and model != "exact" else []
  if found:
    verdict, evidence = "warn", (
        f"{evidence}; degenerate statistics, not measured against rounding: "
        f"{'; '.join(found)} (a record that cannot be judged never passes)")
  return verdict, evidence


def decide(accepted: Sequence[tuple[Hypothesis, Found]], f: Facts
           ) -> Diagnosis:
  """The diagnosis from the accepted hypotheses: the worst fault (by
  verdict, then tier, elements explained and fit) is primary and the best
  base (the first in hypothesis order) secondary; with no fault the best
  base is primary; with neither, ``unknown``. A
  base whose model is a fault's (the probe's wrong grouping, applied to
  every element) is still the base: a fault on top of it is primary,
  unless the fault alone would only warn (a flush of a few tiny values
  over an output scaled by a slip): the worse cause is primary.

  Args:
    accepted: (hypothesis, finding) pairs, bases in ranking order.
    f: the record's facts.

  Returns:
    The :class:`Diagnosis`.
  """
  def severity(x: Found) -> int:
    return _ORDER[model_verdict(x.model, f)]
  faults = sorted((x for h, x in accepted if h.role == "fault"),
                  key=lambda x: (-severity(x), _tier(x),
                                 -getattr(x.evidence, "covers", 0), -x.fit))
  bases = [x for h, x in accepted if h.role != "fault"]
  top = faults[0] if faults else (bases[0] if bases else unknown(f))
  whole = faults and getattr(top.evidence, "covers", 0) >= (
      f.cfg.match_share * f.ndiff)
  second = bases[0] if faults and bases and not whole else None
  if second is not None and severity(second) > severity(top):
    top, second = second, top  # a warn on top of a failing base: the base
  if second is not None and second.model == top.model:
    second = None
  verdict = model_verdict(top.model, f)
  if second is not None:
    verdict = _worst(verdict, model_verdict(second.model, f))
  verdict, evidence = _guarded(verdict, top.sentence, f, top.model)
  ranked = tuple(candidate(x) for x in (faults + bases or [top]))
  first = candidate(top)._replace(evidence=evidence)
  return Diagnosis(first.model, first.confidence, first.evidence,
                   first.params, ranked, verdict,
                   None if second is None else candidate(second))
