"""Hypotheses of a port's other constant or closed form.

A cross-framework port often computes a slightly different function:

* ``parameter``: a constant of the computation differs (a normalization
  epsilon, the unbiased variance, a softmax temperature, a missing or
  doubled ``1/sqrt(d)``): for a normalizing kernel it scales each row by
  its own factor, ``t - r = delta_row * r``, following the row statistic
  the kernel divides by;
* ``approximation``: another closed form of the same function (GELU's
  tanh form for erf, a fast exp, an approximate reciprocal): the error is
  a function of the value alone.

Both need an error systematically beyond rounding (the KUT's RMS error
against float64 beyond 2 x noise_floor_multiplier x the golden kernel's).
Where the site's inputs were at hand, the port probe reran the kernel's
known variants in float64 and names the constant or form exactly.
"""

from __future__ import annotations

import math

import numpy as np

from peat_jax.detector.facts import Form, Found, Moved
from peat_jax.detector.facts import (
    UNIT_ROUNDOFF, Facts, family, within_long_sum)


def _f(x) -> float:
  return float(np.asarray(x))


def level(f: Facts) -> float:
  """A port's error level: the RMS relative error inside the envelope
  (decomposed), else the record's RMS relative error."""
  return _f(f.sig.in_rel_rms) if f.dec else f.rel_rms


def probed_form(f: Facts) -> list[Found]:
  """The probe's variant (another constant, form or indexing of the same
  kernel) explains the output."""
  probe = f.ctx.probe
  if (probe is None or not probe.explains
      or family(probe.model) in ("precision", "accumulation")):
    return []
  est = float(probe.extra.get("estimate", math.nan))
  if family(probe.model) == "indexing":
    ev = Moved(probe.name, "", 0, 1.0, 0, 0, f.ndiff)
  else:
    ev = Form(probe.name, est, level(f), f.noise_ratio, probe.evidence,
              f.ndiff)
  return [Found(probe.model, ev, probe.evidence, 1.0)]


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
  spread beyond row_spread_min): a constant of a normalization
  (``parameter``), or, where the probe read the row order and it does
  not follow the row statistic, an approximate reciprocal or rsqrt
  (``approximation``)."""
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
  order = f.ctx.probe.row_order if _probed(f) else None
  fit = 1.0 - share
  ev = lambda kind: Form(kind, float(np.median(d)), level(f), f.noise_ratio,
                         seen, f.ndiff)
  if order is not None and abs(order) >= cfg.row_order:
    return [Found("parameter", ev("row_statistic"),
                  f"{seen}, following the row statistic the kernel divides "
                  f"by (rank correlation {order:+.2f}): a constant of the "
                  "computation differs that the probe does not know (e.g. "
                  "an epsilon added elsewhere)", fit)]
  if _probed(f):
    probe = f.ctx.probe
    shown = f"{order:+.2f}" if order is not None else "n/a"
    return [Found("approximation", ev("reciprocal"),
                  f"{seen}; the row factor does not follow the row "
                  f"statistic the kernel divides by as a constant's effect "
                  f"would (rank correlation {shown}), and no constant the "
                  f"probe fitted explains it ({probe.name}: ratio "
                  f"{probe.ratio:.2g}): an approximate reciprocal or rsqrt",
                  fit)]
  return [Found("parameter", ev("row_scale"),
                f"{seen}: a constant of the computation differs (e.g. a "
                "normalization epsilon; without the site's inputs an "
                "approximate reciprocal is not ruled out)", fit)]


def value_function(f: Facts) -> list[Found]:
  """``approximation``: the error is a function of the value (at least
  value_r2 of its variance between bins of r)."""
  if not _open(f):
    return []
  r2 = _f(f.sig.value_r2)
  if not (math.isfinite(r2) and r2 >= f.cfg.value_r2):
    return []
  return [Found("approximation",
                Form("value_function", math.nan, level(f), f.noise_ratio,
                     f"{r2:.0%} of the error variance between bins of r",
                     f.ndiff),
                f"the error is a function of the value ({r2:.0%} of its "
                f"variance between bins of r), median relative error "
                f"{f.rel_med:.3g} ({f.rel_med / f.u:.3g} u({f.work})), "
                f"{f.noise_ratio:.3g}x the golden noise floor: another "
                "closed form of the same function", r2)]


def biased_error(f: Facts) -> list[Found]:
  """``approximation``: a dense error beyond rounding that is one-sided
  (|in_bias| at least biased), which neither another order nor a
  rounding to nearest leaves (a truncation's shrink is its own
  hypothesis, ranked before): another function or constant."""
  if not (_open(f) and f.biased):
    return []
  bias = _f(f.sig.in_bias)
  return [Found("approximation",
                Form("biased", math.nan, level(f), f.noise_ratio,
                     f"bias {bias:+.2f}", f.ndiff),
                f"a dense error one-sided beyond rounding (its mean is "
                f"{bias:+.2f} of its RMS inside the envelope), median "
                f"relative error {f.rel_med:.3g} ({f.rel_med / f.u:.3g} "
                f"u({f.work})), {f.noise_ratio:.3g}x the golden noise "
                "floor: another function or constant", abs(bias))]


def probed_dense(f: Facts) -> list[Found]:
  """``approximation``: a dense error beyond rounding that neither a
  constant nor an input precision the probe tried explains, and whose
  level is no narrow format's rounding (within 1/4 to 2 u of bf16 or
  fp16): another closed form of the same function within
  approximation_bound of the scale, another function beyond it."""
  cfg = f.cfg
  if not (_open(f) and _probed(f)):
    return []
  lvl = f.rel_med
  narrow = any(cfg.narrow_level_low * UNIT_ROUNDOFF[k] <= lvl
               <= cfg.narrow_level_high * UNIT_ROUNDOFF[k]
               for k in ("bf16", "fp16"))
  rms = _f(f.sig.in_rel_rms)
  if narrow:
    return []
  probe = f.ctx.probe
  closed = rms <= cfg.approximation_bound
  what = ("another closed form of the same function" if closed else
          "another function (beyond any closed form of this one: a wrong "
          "formula)")
  return [Found("approximation",
                Form("closed_form" if closed else "formula", math.nan, rms,
                     f.noise_ratio, f"tried {', '.join(probe.tried)}",
                     f.ndiff),
                f"a dense error beyond rounding (RMS {rms:.3g} of the scale, "
                f"{f.noise_ratio:.3g}x the golden noise floor) that neither "
                f"a constant nor an input precision the probe tried explains "
                f"({', '.join(probe.tried)}; best {probe.name}, ratio "
                f"{probe.ratio:.2g}): {what}",
                max(1.0 - rms / cfg.approximation_bound, cfg.half))]

