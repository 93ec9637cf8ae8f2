"""Hypotheses of a port's slip: the grammar's search, or the shape of
the error where the inputs were not at hand.

Where the site's inputs were at hand, the port probe searched the slip
grammar (``peat_jax.analyzer.slips``): it reran the golden computation
in float64 under every slip and names the one that reproduces the KUT's
output in magnitude (:func:`probed_form`): ``indexing`` for an operand
or block read in the wrong place, ``parameter`` for a refitted
constant, ``scale`` for a running sum not rescaled, ``approximation``
for a member of the library of known approximations. A dense error no
slip reproduces is ``unknown``: another function, a wrong formula
(:func:`probed_dense`), never ``approximation``.

Without the inputs, the error's shape alone names the cause, and only
within what the shape can carry:

* ``parameter``: a per-row factor following the row statistic a
  normalization divides by (:func:`row_scale`);
* ``approximation``: an error that is a function of the value, or
  one-sided, within the magnitude of the library's members
  (``approximation_bound``, the library's own ``LIBRARY_BOUND``);
  beyond it, ``unknown``.

Every one needs an error systematically beyond rounding (the KUT's RMS
error against float64 beyond 2 x noise_floor_multiplier x the golden
kernel's).
"""

from __future__ import annotations

import math

import numpy as np

from peat_jax.detector.facts import Form, Found, Slipped, Unexplained
from peat_jax.detector.facts import (
    UNIT_ROUNDOFF, Facts, family, within_long_sum)
from peat_jax.detector.hypotheses import _h_whole as whole

#: The largest error of a known approximation against its function
def _f(x) -> float:
  return float(np.asarray(x))


def level(f: Facts) -> float:
  """A port's error level: the RMS relative error inside the envelope
  (decomposed), else the record's RMS relative error."""
  return _f(f.sig.in_rel_rms) if f.dec else f.rel_rms


def _runners(probe) -> tuple[str, ...]:
  return tuple(f"{r['name']} ({r['ratio']:.2g})"
               for r in probe.extra.get("runners_up", ()) or ())


def _runners_sentence(probe) -> str:
  shown = _runners(probe)
  return f"; next best: {', '.join(shown)}" if shown else ""


def _fit_ratio(f: Facts) -> float:
  """A record-wide factor's residual over its delta (the probe's ratio's
  counterpart: how far the output lies from ``(1 + delta) r``)."""
  delta = abs(float(np.asarray(f.sig.fit_delta)))
  return float(np.asarray(f.sig.fit_resid)) / delta if delta > 0 else math.inf


def _direct(f: Facts, probe) -> list[Found]:
  """What the output says in fewer words than the slip, where it says it
  as well: ``t / g`` one constant, or ``t = (1 + delta) r`` fitting at
  least as closely as the slip (a record-wide ``scale``; always for the
  probe's per-row factor), or every differing element zero (a
  missed write, ``zero``: an operand read as zero before a kernel that
  maps zero to zero is the same output), the slip said beside it."""
  one = whole.scale(f)
  fit = whole.scale_fit(f) if not one else []
  if fit and (probe.name == "row_factor" or _fit_ratio(f) <= probe.ratio):
    one = fit  # one factor fits as well as the slip: the fewer words
  if not one and probe.extra.get("category") == "operand":
    one = whole.zero(f)
  slip = probe.extra.get("sentence") or probe.evidence.split(
      ": the KUT's median distance")[0]  # a probe stored before "sentence"
  note = ("" if probe.name == "row_factor" else
          f" (the slip search's best: {slip})")
  return [x._replace(sentence=x.sentence + note) for x in one or ()]


def probed_form(f: Facts) -> list[Found]:
  """The probe's slip (an operand or block read in the wrong place,
  another constant, a running sum not rescaled, a known approximation,
  a kind's own other form) reproduces the output: its median distance to
  the KUT is at most EXPLAINS of the KUT's distance to float64."""
  probe = f.ctx.probe
  if (probe is None or not probe.explains
      or family(probe.model) in ("precision", "accumulation")):
    return []
  direct = _direct(f, probe)
  if direct:
    return direct
  est = float(probe.extra.get("estimate", math.nan))
  ev = Slipped(probe.name, str(probe.extra.get("category", "form")), est,
               probe.ratio, _runners(probe),
               tuple(probe.extra.get("equivalent", ()) or ()), level(f),
               f.noise_ratio, f.ndiff)
  order = probe.row_order
  if probe.name == "row_factor" and order is not None and abs(
      order) >= f.cfg.row_order:
    return [Found("parameter", ev, f"{probe.evidence}; each row's factor "
                  f"follows the row statistic the kernel divides by (rank "
                  f"correlation {order:+.2f}): a constant of the computation "
                  "differs that no refit of its constants names (e.g. an "
                  "epsilon added elsewhere)" + _runners_sentence(probe), 1.0)]
  return [Found(probe.model, ev, probe.evidence + _runners_sentence(probe),
                1.0)]


def _open(f: Facts) -> bool:
  """A dense error beyond rounding (elements beyond the golden envelope
  that are not outliers: a fault's outliers alone leave the rest inside)
  that is no long sum's other order (confined to a narrower format or
  not: the rounding hypotheses, ranked before, name a format's own
  rounding)."""
  cfg = f.cfg
  return (f.dec and f.has_ref and not within_long_sum(f)
          and f.n_beyond > f.n_out
          and f.noise_ratio > 2 * cfg.noise_floor_multiplier)


def _probed(f: Facts) -> bool:
  probe = f.ctx.probe
  return probe is not None and not probe.explains


def row_scale(f: Facts) -> list[Found]:
  """A per-row scale explains the error (``t - r = delta_row * r``, the
  median row's residual at most row_fit_share of its error, the factors
  spread beyond row_spread_min), without the inputs: a constant of a
  normalization (``parameter``). Where the probe ran, a factor of each
  row's own is its last hypothesis, read element by element
  (``probed_form``: ``parameter`` where the factor follows the row
  statistic, ``scale`` otherwise), and this shape adds nothing to it."""
  s, cfg = f.sig, f.cfg
  if not _open(f):
    return []
  err = np.asarray(s.row_err, np.float64)
  res = np.asarray(s.row_resid, np.float64)
  delta = np.asarray(s.row_delta, np.float64)
  rows = err > 0
  if rows.sum() < 2:
    return []
  share = float(np.median(res[rows] / err[rows]))
  d = delta[rows]
  spread = float(np.std(d) / max(np.mean(np.abs(d)), 1e-300))
  if not (share <= cfg.row_fit_share
          and (spread > cfg.row_spread_min or rows.sum() < cfg.band_min_lines)):
    return []
  lo, hi = float(np.min(d)), float(np.max(d))
  side = ("two-sided" if not (np.all(d > 0) or np.all(d < 0)) else
          "one-sided " + ("shrink" if hi < 0 else "growth"))
  seen = (f"t - r = delta_row * r: a per-row scale explains the error "
          f"(median residual {share:.2g} of it), {side}, delta_row in "
          f"[{lo:.3g}, {hi:.3g}] ({abs(np.median(d)) / f.u:.3g} "
          f"u({f.work})), {f.noise_ratio:.3g}x the golden noise floor")
  if _probed(f):
    # The probe tried each row's own factor element by element (its
    # ``row_factor``, named by probed_form where it explains): this
    # shape adds nothing to it.
    return []
  fit = 1.0 - share
  ev = lambda kind: Form(kind, float(np.median(d)), level(f), f.noise_ratio,
                         seen, f.ndiff)
  return [Found("parameter", ev("row_scale"),
                f"{seen}: a constant of the computation differs (e.g. a "
                "normalization epsilon; without the site's inputs an "
                "approximate reciprocal is not ruled out)", fit)]


def _beyond_library(f: Facts, shape: str, r2: float) -> Found:
  """``unknown``: an error of an approximation's shape but beyond any
  known approximation's magnitude (another function)."""
  rms = level(f)
  return Found("unknown", Unexplained(f.ndiff, f.noise_ratio, f.ndiff),
               f"{shape}, RMS {rms:.3g} of the scale, {f.noise_ratio:.3g}x "
               f"the golden noise floor: beyond every known approximation "
               f"(they err by at most {f.cfg.approximation_bound:.2g} of "
               "the scale): "
               "another function, a wrong formula", r2)


def value_function(f: Facts) -> list[Found]:
  """Without the inputs: the error is a function of the value (at least
  value_r2 of its variance between bins of r): ``approximation`` within
  the library's magnitude (approximation_bound of the scale), ``unknown``
  beyond. With them the probe's search decides (:func:`probed_dense`)."""
  if not _open(f) or _probed(f):
    return []
  r2 = _f(f.sig.value_r2)
  if not (math.isfinite(r2) and r2 >= f.cfg.value_r2):
    return []
  shape = f"the error is a function of the value ({r2:.0%} of its " \
      "variance between bins of r)"
  if level(f) > f.cfg.approximation_bound:
    return [_beyond_library(f, shape, r2)]
  return [Found("approximation",
                Form("value_function", math.nan, level(f), f.noise_ratio,
                     f"{r2:.0%} of the error variance between bins of r",
                     f.ndiff),
                f"{shape}, median relative error {f.rel_med:.3g} "
                f"({f.rel_med / f.u:.3g} u({f.work})), {f.noise_ratio:.3g}x "
                f"the golden noise floor, within a known approximation's "
                f"magnitude ({f.cfg.approximation_bound:.2g} of the scale; "
                "without the call's inputs the member is not identified)", r2)]


def biased_error(f: Facts) -> list[Found]:
  """Without the inputs: a dense error beyond rounding that is one-sided
  (|in_bias| at least biased), which neither another order nor a
  rounding to nearest leaves (a truncation's shrink is its own
  hypothesis, ranked before): ``approximation`` within the library's
  magnitude, ``unknown`` beyond."""
  if not (_open(f) and f.biased) or _probed(f):
    return []
  bias = _f(f.sig.in_bias)
  shape = f"a dense error one-sided beyond rounding (its mean is " \
      f"{bias:+.2f} of its RMS inside the envelope)"
  if level(f) > f.cfg.approximation_bound:
    return [_beyond_library(f, shape, abs(bias))]
  return [Found("approximation",
                Form("biased", math.nan, level(f), f.noise_ratio,
                     f"bias {bias:+.2f}", f.ndiff),
                f"{shape}, median relative error {f.rel_med:.3g} "
                f"({f.rel_med / f.u:.3g} u({f.work})), {f.noise_ratio:.3g}x "
                "the golden noise floor, within a known approximation's "
                f"magnitude ({f.cfg.approximation_bound:.2g} of the scale; "
                "without the call's inputs the member is not identified)", abs(bias))]


def undetermined_note(probe) -> str:
  """What a probe of a few values could not tell apart: the constants that
  each reproduce them (``port_probe``'s ``undetermined``), or ""."""
  fits = (probe.extra.get("undetermined") or ()) if probe is not None else ()
  if not fits:
    return ""
  return ("; on so few values (" + ", ".join(
      f"{c['name']} {c['estimate']:.4g}" for c in fits) + " each reproduce "
          "them) no constant can be told from another: the backward site "
          "(backward=\"kut\") or a per-example output can")


def probed_dense(f: Facts) -> list[Found]:
  """``unknown``: a dense error beyond rounding that no slip of the
  grammar the probe searched reproduces (no operand or block in another
  place, no refitted constant, no input precision, no known
  approximation), and whose level is no narrow format's rounding (within
  1/4 to 2 u of bf16 or fp16) unless a constant reproduces the few values
  where no input precision does: another function, a wrong formula."""
  cfg = f.cfg
  if not (_open(f) and _probed(f)):
    return []
  lvl = f.rel_med
  narrow = any(cfg.narrow_level_low * UNIT_ROUNDOFF[k] <= lvl
               <= cfg.narrow_level_high * UNIT_ROUNDOFF[k]
               for k in ("bf16", "fp16"))
  probe = f.ctx.probe
  if narrow and not probe.extra.get("undetermined"):
    return []  # (a constant reproducing it, no input precision: no format)
  rms = _f(f.sig.in_rel_rms)
  closest = ", ".join((f"{probe.name} ({probe.ratio:.2g})",) + _runners(probe))
  count = len(probe.tried) + sum(probe.extra.get("searched", {}).values())
  note = undetermined_note(probe)
  return [Found("unknown", Unexplained(f.ndiff, f.noise_ratio, f.ndiff),
                f"a dense error beyond rounding (RMS {rms:.3g} of the scale, "
                f"{f.noise_ratio:.3g}x the golden noise floor) that no slip "
                f"of the grammar reproduces ({count} tried: "
                f"operands and blocks in other places, refitted constants, "
                f"input precisions, known approximations; closest by median "
                f"distance ratio, explaining at 0.25 or less: {closest}): "
                f"another function, a wrong formula{note}", cfg.half)]
