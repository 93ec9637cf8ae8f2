"""Constant slips: a kernel's constant refitted to the KUT's output.

Every floating-point constant of a kind (:data:`peat_jax.core.PARAMETERS`:
a normalization's epsilon and variance divisor, a softmax's temperature,
attention's score scale and mask fill, label smoothing, SiLU's beta, a
rotary base and position offset) is fitted on its range by
``._fit.fit_scalar``; a fit that is not the call's own value and is
closer to the KUT than the call's own is a ``parameter`` hypothesis.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.slips import _families as fam
from peat_jax.analyzer.slips._call import Call
from peat_jax.analyzer.slips._fit import distance, fit_scalar

#: A fit is a slip when it differs from the call's value by more than this
#: share of the larger (float32 reads constants to 1e-7; a port's other
#: constant differs by far more) ...
DIFFERS = 1e-3
#: ... and brings the family this much closer to the KUT than the call's
#: own value (a fit to rounding noise gains nothing).
GAIN = 0.5
#: A constant explains an output of at least this many elements: one free
#: parameter matches a scalar output (a mean loss) whatever the slip, so
#: there a fit is a candidate, not an explanation.
MIN_ELEMENTS = 16
#: An epsilon above this share of the median row variance shrinks every
#: output by more than 18%: a scale, not an epsilon slip.
EPS_MAX_SHARE = 0.5


class Range(NamedTuple):
  """Where a constant is searched: ``[lo, hi]``, on a log scale or not,
  integers only (``ints``: the candidates)."""

  lo: float
  hi: float
  log: bool
  ints: tuple[int, ...] = ()


def _row_var(call: Call, centred: bool) -> float:
  x = call.arrays[0]
  c = x - x.mean(-1, keepdims=True) if centred else x
  return float(np.median(np.mean(c * c, -1)))


def _ranges(call: Call) -> dict[str, tuple[Range, float]]:
  """Each constant of the call's kind: its search range and the call's own
  value."""
  kind, kw = call.kind, call.kwargs
  args = call.structured()[0]
  if kind == "layer_norm":
    eps = float(kw.get("eps", args[3] if len(args) > 3 else 1e-6))
    var = _row_var(call, True)
    return {"eps": (Range(1e-12, max(EPS_MAX_SHARE * var, 1e-11), True),
                    eps),
            "ddof": (Range(-2.0, 3.0, False), 0.0)}
  if kind == "rms_norm":
    eps = float(kw.get("eps", args[2] if len(args) > 2 else 1e-6))
    ms = _row_var(call, False)
    return {"eps": (Range(1e-12, max(EPS_MAX_SHARE * ms, 1e-11), True), eps),
            "ddof": (Range(-2.0, 3.0, False), 0.0),
            "offset": (Range(-2.0, 2.0, False), 0.0)}
  if kind in ("softmax", "log_softmax"):
    return {"temperature": (Range(0.2, 5.0, True), 1.0)}
  if kind == "cross_entropy":
    return {"smoothing": (Range(0.0, 0.5, False), 0.0),
            "temperature": (Range(0.2, 5.0, True), 1.0)}
  if kind == "attention":
    d = np.shape(call.arrays[0])[-1]
    own = kw.get("scale")
    own = 1.0 / math.sqrt(d) if own is None else float(own)
    out = {"scale": (Range(d ** -1.5, float(d), True), own)}
    if len(call.arrays) > 3 or kw.get("is_causal"):
      out["fill"] = (Range(1.0, 1e9, True), np.finfo(np.float64).min)
    return out
  if kind == "silu":
    return {"beta": (Range(0.25, 4.0, True), 1.0)}
  if kind == "rope":
    theta = float(kw.get("theta", args[2] if len(args) > 2 else 1e4))
    return {"theta": (Range(1e2, 1e7, True), theta),
            "offset": (Range(-4, 4, False, (-4, -3, -2, -1, 1, 2, 3, 4)),
                       0.0)}
  return {}


def _value(name: str, v: float) -> float:
  """A searched value as the family reads it (a fill is searched by its
  magnitude and is negative)."""
  return -v if name == "fill" else v


def _sentence(call: Call, name: str, v: float, own: float) -> str:
  n = np.shape(call.arrays[0])[-1]
  if name == "ddof":
    return (f"the variance divided by n - {v:.3g} = {n - v:.4g} where the "
            f"model divides by n = {n}" + (" (the unbiased variance)" if
                                           abs(v - 1) < 0.05 else ""))
  if name == "scale":
    d = np.shape(call.arrays[0])[-1]
    why = (": the 1/sqrt(d) is missing" if abs(v - 1.0) <= 0.01 else
           ": 1/sqrt(d) applied twice" if abs(v * d - 1.0) <= 0.01 else "")
    return (f"attention scores scaled by {v:.4g} (the model's {own:.4g}, "
            f"d = {d}){why}")
  if name == "fill":
    return (f"masked scores filled with {v:.4g} instead of the lowest float "
            "(masked keys keep a weight)")
  if name == "smoothing":
    return f"label smoothing {v:.3g} the model does not use"
  if name == "offset" and call.kind == "rope":
    return f"consistent with positions offset by {int(round(v)):+d}"
  if name == "offset":
    return f"the output scaled by {v:.3g} + scale (the model's scale alone)"
  what = _core.PARAMETERS[call.kind][name].split(" (")[0]
  return (f"consistent with {name} {v:.4g} instead of the model's "
          f"{own:.4g} ({what})")


def constant_fits(call: Call, t: np.ndarray, only: str | None = None
                  ) -> list[tuple[_core.Slip, str, Callable[[], np.ndarray]]]:
  """The constants fitted to ``t`` that make slips: ``(slip, sentence,
  fn)`` with ``fn() -> the family's float64 output`` at the fitted
  value (``only``: that constant alone)."""
  if call.kind not in fam.FAMILIES:
    return []
  args, kwargs = call.structured()
  fin = np.isfinite(t)
  run = lambda name, v: fam.evaluate(call.kind, args, kwargs,
                                     fam.Hooks(params={name: v}))
  base = distance(fam.evaluate(call.kind, args, kwargs), t, fin)
  out = []
  for name, (rng, own) in _ranges(call).items():
    if only is not None and name != only:
      continue
    loss = lambda v, name=name: distance(run(name, _value(name, v)), t, fin)
    with np.errstate(all="ignore"):
      if rng.ints:
        errs = {k: loss(float(k)) for k in rng.ints}
        v = float(min(errs, key=errs.get))
        err = errs[v]
      else:
        v, err = fit_scalar(loss, rng.lo, rng.hi, log=rng.log)
    v = _value(name, v)
    if not (err <= GAIN * base) or abs(v - own) <= DIFFERS * max(
        abs(v), abs(own)):
      continue
    slip = _core.Slip("constant", "set", param=name, value=float(v))
    out.append((slip, _sentence(call, name, v, own),
                lambda name=name, v=v: run(name, v)))
  return out
