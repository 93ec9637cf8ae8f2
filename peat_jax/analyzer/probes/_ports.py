"""The port probe: which constant or closed form a KUT's output matches.

A cross-framework port often computes its kernel with another constant (a
normalization epsilon, the unbiased variance, a softmax temperature, a
missing or doubled ``1/sqrt(d)``) or another closed form (GELU's tanh
form). Where the site's inputs are known (playback, op-level playback,
calibration), the probe computes, in float64 on the host, the kernel's
known variants of those kinds, estimates the constant where one can be
fitted (the epsilon of a layer norm, the temperature of a softmax), and
says which hypothesis explains the KUT's output: its RMS distance to the
KUT's output is at most a quarter of the distance to the model's own
float64 reference, which must itself be beyond the golden kernel's noise.

The variants of each kind live in ``._forms``. Given the site's float64
reference function, the probe also fits the base by synthesis
(``._precision``): the reference on the inputs rounded to bf16, fp16 or
tf32 to nearest, and, where the KUT's error level calls for a format, in
the other rounding modes (toward zero, ties away). For a nonlinear kernel the error such rounding leaves is not
a fixed multiple of u(fmt) (a softmax's grows with its logits), so the
level of the error alone cannot name it; the probe can.

A hypothesis *explains* the output when, over the elements that differ
from the reference, the median of ``|t - h| / |t - r|`` is at most
``EXPLAINS``: a median, so a sparse fault on top of the port (up to half of
the elements) does not hide the port's own cause. The probe then also
returns the Signature of the output against the hypothesis (``h`` rounded
to the output dtype as golden, ``h`` as reference): its outliers are what
the hypothesis does not explain, the Detector's primary cause.

The result is a small dict the Detector reads from its context
(``context["port"]``, peat.detector rules ``parameter`` /
``approximation`` / ``precision``) and playback stores in the site record
(without its ``signature``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.probes._forms import Variant, _f64, _row_order
from peat_jax.analyzer.probes._forms import form_hypotheses, precision_only
from peat_jax.analyzer.probes._precision import INPUT_LEVEL, LEVEL_FORMATS
from peat_jax.analyzer.probes._precision import precision_hypotheses
from peat_jax.analyzer.slips import MIN_ELEMENTS, slip_variants, sub_call
from peat_jax.analyzer.signature import analyze_split_many
from peat_jax.analyzer.signature import decompose_split_many
from peat_jax.analyzer.signature import screen_split_many
from peat_jax.analyzer.signature import with_decomposition
from peat_jax.analyzer.signature import split_reference
from peat_jax.analyzer.signature import median

#: A hypothesis explains the output when the median ratio of the distance
#: to it over the distance to the model's own float64 reference is at most
#: this (over the elements that differ from the reference).
EXPLAINS = 0.25
#: ... and that distance is this many times the golden kernel's own.
BEYOND_GOLDEN = 4.0


#: A record is probed when this share of its elements (and at least
#: PROBE_MIN of them) is beyond the golden kernel's rounding envelope.
PROBE_SHARE = 0.01
PROBE_MIN = 16
#: ... or when its RMS error vs float64 is this many times golden's even
#: inside the envelope (tens of ulps everywhere: another constant, e.g. an
#: epsilon 1e-5 for 1e-6, moves every element a little).
PROBE_DENSE_RATIO = 16.0


def needs_probe(sig, *, screened: bool = False) -> bool:
  """Whether a Signature's dense error calls for the port probe: it has a
  decomposition against a reference, the KUT's RMS error vs float64 is
  beyond ``BEYOND_GOLDEN`` times golden's, and at least ``PROBE_SHARE`` of
  the elements are beyond the golden envelope (not a sparse fault alone),
  or the RMS error is beyond ``PROBE_DENSE_RATIO`` times golden's, or the
  output is 16-bit (bf16, fp16).

  Args:
    sig: a single-record Signature (device or host fields).
    screened: ``sig`` comes from the triage screen
      (``peat.analyzer.screen``): its ``n_beyond`` is the decomposition's
      though ``decomposed`` is False.

  Returns:
    True when a probe may explain the record.
  """
  if not (screened or bool(np.asarray(sig.decomposed))) or not bool(
      np.asarray(sig.has_reference)):
    return False
  n = int(np.asarray(sig.n))
  beyond = int(np.asarray(sig.n_beyond))
  ratio = float(np.asarray(sig.noise_ratio))
  # A 16-bit output hides a port's dense error inside a few of its own
  # units (a bf16-accumulated norm: 2-5 u(bf16)); beyond the benign
  # envelope that is already the probe's question.
  narrow = int(np.asarray(getattr(sig, "dtype_code", 0))) in (1, 2)
  return ratio > BEYOND_GOLDEN and (
      narrow or beyond >= max(PROBE_MIN, PROBE_SHARE * n)
      or ratio > PROBE_DENSE_RATIO)


class _RatioBase(NamedTuple):
  """What every hypothesis's median ratio shares: the elements where the
  KUT's output differs from the reference, the output there, and that
  distance; and the level beyond which an element's error is real."""
  keep: np.ndarray  # bool, the record's shape: finite pairs with t != r
  t: np.ndarray  # float64 t[keep]
  d_r: np.ndarray  # float64 |t - r|[keep], all > 0
  real: float = 0.0  # BEYOND_GOLDEN x the golden kernel's RMS error
  fin: np.ndarray | None = None  # finite pairs
  r: np.ndarray | None = None  # the reference (at the output's dtype)


def _ratio_base(t, r, fin, g=None, r64=None) -> _RatioBase:
  d_r = np.abs(np.where(fin, t, 0.0) - np.where(fin, r, 0.0))
  keep = d_r > 0  # implies finite: elsewhere both are 0
  real = 0.0
  if g is not None and fin.any():
    ref = r if r64 is None else r64
    real = BEYOND_GOLDEN * float(np.sqrt(np.mean(np.square(
        (np.asarray(g, np.float64) - ref)[fin]))))
  return _RatioBase(keep, t[keep], d_r[keep], real, fin, r)


def _ratios(base: _RatioBase, h, real: bool = True) -> np.ndarray:
  """``|t - h| / |t - r|`` over the elements a hypothesis is read on:
  where the KUT or the hypothesis is beyond the golden kernel's noise
  (``base.real``): a slip that reaches some rows only (a max that grows
  in a later block, a mask off by one for some queries) explains the
  real error, and a hypothesis that moves elements the KUT leaves in
  place does not (an infinite ratio where ``t`` equals ``r``). With fewer
  than PROBE_MIN such elements, or ``real`` False (the inputs rounded to
  a format move every element: read as the device's tries read them):
  over every element where ``t != r`` (h non-finite there: an infinite
  ratio)."""
  if not base.t.size:
    return np.full(1, np.inf)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    ratio = np.abs(base.t - h[base.keep]) / base.d_r
  ratio[np.isnan(ratio)] = np.inf
  if real and base.real > 0 and base.r is not None:
    with np.errstate(invalid="ignore", over="ignore"):
      moved = np.abs(h - base.r) > base.real
    moved = moved & base.fin
    sel = (base.d_r > base.real) | moved[base.keep]
    outside = int((moved & ~base.keep).sum())  # h moves, t does not
    if int(sel.sum()) + outside >= PROBE_MIN:
      return np.concatenate([ratio[sel], np.full(outside, np.inf)])
  return ratio


def _median_ratio(base: _RatioBase, h, real: bool = True) -> float:
  """The median of :func:`_ratios`."""
  return median(_ratios(base, h, real))


def probe_answer(model: str, name: str, sentence: str, tried: list[str],
                 ratio: float, distance: float, d_ref: float, d_gold: float,
                 fit: float | None = None,
                 extra: Mapping[str, Any] | None = None) -> dict:
  """The probe's answer for its best hypothesis (``port_probe``'s dict
  without ``row_order`` and ``signature``), from its figures.

  Args:
    model, name, sentence: the hypothesis (error model, name, what it is).
    tried: the names of the hypotheses tried.
    ratio: its median ratio (``|t - h| / |t - r|`` over ``t != r``).
    distance: the KUT's RMS distance to it.
    d_ref, d_gold: the KUT's and the golden kernel's RMS distance to the
      float64 reference.
    fit: the fitted constant, if any.
    extra: the hypothesis's ``where`` and ``rounding``, if any.

  Returns:
    ``{"model", "name", "explains", "tried", "ratio", "distance",
    "reference_distance", "evidence", "sentence", "estimate"?, "where"?,
    "rounding"?}`` (``sentence``: the hypothesis alone, as ``evidence``
    begins).
  """
  out = {"model": model, "name": name, "explains": bool(ratio <= EXPLAINS),
         "tried": list(tried),
         "ratio": float(ratio), "distance": float(distance),
         "reference_distance": float(d_ref), "sentence": sentence,
         "evidence": (f"{sentence}: the KUT's median distance to that "
                      f"variant is {ratio:.3g} of its distance to the "
                      f"model's kernel in float64 ({d_ref:.3g} RMS, "
                      f"{d_ref / max(d_gold, 1e-300):.3g}x the golden "
                      "kernel's)")}
  if fit is not None:
    out["estimate"] = float(fit)
  out.update(extra or {})
  return out


def port_probe(kind: str, args: Sequence[Any], kwargs: Mapping[str, Any],
               test, golden, reference, *,
               reference_fn: Callable[..., Any] | None = None,
               reference_args: Sequence[Any] | None = None,
               signature: bool | str = True,
               hypotheses: Mapping[str, Any] | None = None,
               only: str | None = None) -> dict | None:
  """Which port variant of a composite kernel the KUT's output matches.

  Args:
    kind: the composite kind (``layer_norm``, ``softmax``, ``attention``,
      ``gelu``; others give None).
    args: the site's positional arguments (the reference composites'
      signatures, models/layers.py).
    kwargs: its keyword arguments.
    test: the KUT's output.
    golden: the golden kernel's output.
    reference: the float64 reference of the model's own kernel.
    reference_fn: the kernel's float64 reference function on ``args``
      (peat.analyzer.reference_fn); adds the input precision hypotheses.
    reference_args: what ``reference_fn`` takes, when not ``args`` (a
      composite site's flat input arrays).
    signature: with an explaining hypothesis, add the Signature of
      ``test`` against it (``"signature"``); ``"defer"``: add the
      hypothesis's float64 output instead (``"hypothesis"``), for
      :func:`probe_signatures` to analyze with other records' at once.
    hypotheses: input-precision hypotheses computed already (name ->
      float64 output, e.g. ``{"inputs_bf16": ...}``: the same values
      ``reference_fn`` gives on the rounded inputs; playback computes them
      on the device for all sites at once).
    only: try this hypothesis alone (its ``name``, e.g. ``inputs_bf16`` or
      ``eps``): playback carries a site's probe to its later records, each
      with its own magnitudes (and fitted constant), without the others.

  Returns:
    None when no hypothesis applies or the output is within the golden
    kernel's noise; else ``{"model", "name", "explains", "evidence",
    "estimate"?, "ratio", "distance", "reference_distance",
    "signature"?}`` for the best hypothesis (lowest median ratio).
  """
  t, g, r = _f64(test), _f64(golden), _f64(reference)
  if t.shape != r.shape:
    return None
  fin = np.isfinite(t) & np.isfinite(r)
  flat = bool(np.all(fin))  # a[fin] is then a.reshape(-1): the same sum
  some = flat or bool(np.any(fin))
  rms = lambda a: float(np.sqrt(np.mean(np.square(
      a.reshape(-1) if flat else a[fin])))) if some else 0.0
  d_ref, d_gold = rms(t - r), rms(g - r)
  if not d_ref > BEYOND_GOLDEN * d_gold:
    return None
  ref_args = args if reference_args is None else reference_args
  # A primitive kind tries its device formats alone (playback tries them
  # on the device: both must try the same), a composite the formats its
  # error level calls for too.
  primitive = precision_only(kind)
  level = None if primitive else _level(t, r, fin)
  find = lambda a, kw, ra, tt, given, name: _hypotheses(
      kind, a, kw, ra, tt, reference_fn, given, name, level, primitive)
  sub = None if only is not None else _sub(kind, args, kwargs, ref_args,
                                           t.shape)
  first = (_device_formats(kind, ref_args, test, t, r, g, fin,
                           reference_fn, hypotheses)
           if primitive and only is None else None)
  if first is not None:
    ranked, hyps = first
  elif sub is None:
    hyps = find(args, kwargs, ref_args, test, hypotheses, only)
    ranked = ranked_answers(hyps, test, t, r, g, fin)
    if only is None and _composable(ranked):
      ranked = _with_compositions(ranked, lambda **kw: _grammar(
          kind, args, kwargs, t, reference_fn, **kw), test, t, r, g, fin,
                                  kind)
  else:
    ranked, hyps = _searched_on_slice(
        kind, sub, find, hypotheses, reference_fn, test, t, r, g, fin,
        lambda name: find(args, kwargs, ref_args, test, hypotheses, name))
  if ranked and not ranked[0][0] <= EXPLAINS and only in (None, ROW_FACTOR):
    ranked = ranked_answers([_row_factor(t, r)], test, t, r, g, fin) + (
        ranked)
    ranked.sort(key=lambda x: not x[0] <= EXPLAINS)  # stable: explains first
  elif only == ROW_FACTOR:
    ranked = ranked_answers([_row_factor(t, r)], test, t, r, g, fin)
  ranked, undetermined = _determined(ranked, t, len(hyps))
  if not ranked:
    return None
  ratio, v, h = ranked[0]
  same = equivalents(ranked)
  out = probe_answer(v.model, v.name, v.sentence + (
      f" (equivalently: {'; '.join(x.sentence for x in same)})"
      if same else ""), _tried(hyps), ratio,
                     rms(t - h), d_ref, d_gold, v.estimate,
                     {**v.extra, "runners_up": runners_up(ranked),
                      "equivalent": [x.name for x in same],
                      "searched": _searched(hyps)})
  if undetermined:
    out["undetermined"] = undetermined
  small = explains_at(np.size(t), len(hyps))
  if small < EXPLAINS and out["explains"] and not ratio <= small:
    out["explains"] = False  # a few values: a chance match of many tries
  explains = out["explains"]
  if not explains or v.name == ROW_FACTOR:
    order = _row_order(kind, args, np.where(fin, t, 0.0),
                       np.where(fin, r, 0.0))
    if order is not None:
      out["row_order"] = order
  if explains and signature:
    out["hypothesis"] = h
    if signature != "defer":
      probe_signatures([out], [test])
  return out


#: The last resort of a search no slip answers: each row (the last axis)
#: scaled by a factor of its own, fitted by least squares.
ROW_FACTOR = "row_factor"


def _row_factor(t: np.ndarray, r: np.ndarray) -> Variant:
  """``h = delta_row r``, ``delta_row`` each row's least-squares factor:
  a running sum or a normalization's statistic wrong by a row's own
  factor that no slip of the grammar names (``scale``). Tried only where
  nothing else explains the output: it has a parameter per row."""
  def fn():
    if t.ndim == 0 or t.shape[-1] < 2:
      raise ValueError("no rows")
    fin = np.isfinite(t) & np.isfinite(r)
    tt, rr = np.where(fin, t, 0.0), np.where(fin, r, 0.0)
    den = np.sum(rr * rr, -1, keepdims=True)
    delta = np.where(den > 0, np.sum(tt * rr, -1, keepdims=True)
                     / np.where(den > 0, den, 1.0), 1.0)
    if not np.all(delta > 0):
      # A row scaled by zero or less is left zero or negated: the
      # faults' hypotheses name those (zero, indexing), not a factor.
      raise ValueError("a row factor at or below zero")
    return delta * r
  return Variant("scale", ROW_FACTOR, "each row (the last axis) scaled by "
                 "a factor of its own (fitted), that no slip of the grammar "
                 "names", fn, extra={"category": "factor"})


#: Runners-up kept in a probe's answer (name, model, ratio).
RUNNERS_UP = 3
#: Compositions tried when no single hypothesis explains: the best
#: precision bases under the best other slips.
COMPOSE_BASES = 2
COMPOSE_SLIPS = 3


#: Two hypotheses predict the same output (reversing lhs's contraction
#: axis and rhs's) when they differ by at most this share of the output's
#: scale: float64 evaluations of one function in two orders.
SAME_OUTPUT = 1e-12


def equivalents(ranked) -> list[Variant]:
  """The runners-up whose output is the best's (the same slip read on
  another operand): named beside it."""
  if not ranked:
    return []
  _, v0, h0 = ranked[0]
  scale = float(np.max(np.abs(h0[np.isfinite(h0)]), initial=0.0)) or 1.0
  out = []
  for _, v, h in ranked[1:1 + RUNNERS_UP]:
    if np.shape(h) != np.shape(h0):
      continue  # read on a slice of the call
    with np.errstate(invalid="ignore"):
      if np.array_equal(np.isfinite(h), np.isfinite(h0)) and float(np.max(
          np.abs(np.where(np.isfinite(h0), h - h0, 0.0)), initial=0.0)) <= (
              SAME_OUTPUT * scale):
        out.append(v)
  return out


def _tried(hyps: Sequence[Variant]) -> list[str]:
  """The names of the hypotheses tried outside the grammar (the input
  precisions, a kind's own forms): the grammar's are counted
  (:func:`_searched`)."""
  return [h.name for h in hyps if "category" not in h.extra]


def _searched(hyps: Sequence[Variant]) -> dict[str, int]:
  """How many slips of each category of the grammar were tried."""
  out: dict[str, int] = {}
  for h in hyps:
    cat = h.extra.get("category")
    if cat is not None:
      out[cat] = out.get(cat, 0) + 1
  return out


#: Candidates of a search on a slice confirmed on the whole call.
CONFIRM = 4


def _device_formats(kind, ref_args, test, t, r, g, fin, reference_fn,
                    given):
  """A primitive's device formats first (``probe_formats``: what playback
  tries on the device): ``(ranked, hypotheses)`` where one of them
  explains the output, else None (the whole search follows)."""
  if reference_fn is None:
    return None
  hyps = precision_hypotheses(kind, ref_args, reference_fn, given, None,
                              _output_u(test))
  ranked = ranked_answers(hyps, test, t, r, g, fin)
  if ranked and ranked[0][0] <= EXPLAINS:
    return ranked, hyps
  return None


def _hypotheses(kind, args, kwargs, ref_args, test, reference_fn, given,
                only, level, every=False) -> list[Variant]:
  """Every hypothesis of a call (``only``: that one alone): a kind's own
  forms, the grammar's slips and the input precisions (``every``: every
  format, not those the error level calls for)."""
  t = _f64(test)
  hyps = form_hypotheses(kind, args, kwargs, t, reference_fn, ref_args)
  hyps += _grammar(kind, args, kwargs, t, reference_fn, only=only)
  if reference_fn is not None:
    lvl = _named_level(only) if only is not None else level
    hyps += precision_hypotheses(kind, ref_args, reference_fn, given, lvl,
                                 _output_u(test),
                                 every=every and only is None)
  if only is not None:
    hyps = [h for h in hyps if h.name == only]
  return hyps


def _sub(kind, args, kwargs, ref_args, shape):
  """The slice of a large call the search reads, or None (the call's
  array arguments must be the reference's)."""
  try:
    sub = sub_call(kind, args, kwargs, tuple(shape))
  except (ValueError, TypeError, IndexError):
    return None
  if sub is None or len(sub.arrays) != len(ref_args):
    return None
  return sub


def _searched_on_slice(kind, sub, find, given, reference_fn, test, t, r, g,
                       fin, whole):
  """The search on a slice of the call (compositions included), its best
  candidates confirmed on the whole call: ``(ranked, the slice's
  hypotheses)``, those confirmed ranked first, the rest of the slice's
  ranking after them (runners-up, read on the slice)."""
  idx = sub.index
  part = lambda a: np.asarray(a)[idx]
  sgiven = None if given is None else {k: part(v) for k, v in given.items()}
  ts, tt, rr, gg, ff = part(test), t[idx], r[idx], g[idx], fin[idx]
  hyps = find(sub.args, sub.kwargs, sub.arrays, ts, sgiven, None)
  ranked = ranked_answers(hyps, ts, tt, rr, gg, ff)
  if _composable(ranked):
    ranked = _with_compositions(ranked, lambda **kw: _grammar(
        kind, sub.args, sub.kwargs, tt, reference_fn, **kw), ts, tt, rr, gg,
                                ff, kind)
  confirmed = []
  for _, v, _ in ranked[:CONFIRM]:
    confirmed += whole(v.name)
  return (ranked_answers(confirmed, test, t, r, g, fin) + ranked[CONFIRM:],
          hyps)


def _grammar(kind, args, kwargs, t, reference_fn, **kw):
  """The grammar's hypotheses of the call (none for a call whose array
  arguments are not the reference's)."""
  try:
    return slip_variants(kind, args, kwargs, t, (
        None if reference_fn is None else
        (lambda *xs: reference_fn(*xs))), **kw)
  except (ValueError, TypeError, KeyError, IndexError):
    return []


def runners_up(ranked) -> list[dict]:
  """The best hypotheses after the first, with their median ratios (the
  evidence's "and not these")."""
  return [{"name": v.name, "model": v.model, "ratio": float(ratio)}
          for ratio, v, _ in ranked[1:1 + RUNNERS_UP]]


#: The chance a search may take of naming a wrong slip on a record of a
#: few elements (one value: a loss), spread over its hypotheses.
SMALL_FALSE = 0.01


def explains_at(n: int, tried: int) -> float:
  """The median ratio at which a hypothesis explains ``n`` elements after
  ``tried`` hypotheses: EXPLAINS from MIN_ELEMENTS elements on; below,
  a wrong hypothesis's ratio at one element is about uniform near zero,
  so one of ``tried`` lands under ``x`` with chance ``tried * x`` (per
  element the median needs: ``ceil(n / 2)``), kept at SMALL_FALSE."""
  if n >= MIN_ELEMENTS:
    return EXPLAINS
  need = max(1, (n + 1) // 2)
  return min(EXPLAINS, (SMALL_FALSE / max(tried, 1)) ** (1.0 / need))


def _determined(ranked, t, tried: int) -> tuple[list, list[dict]]:
  """``ranked`` without the refitted constants the output is too small to
  tell apart, and those constants, as candidates (name, fitted value).
  A fit spends one element on its constant (one number, a scalar loss,
  is matched by any constant whatever the slip); the rest must meet it
  at :func:`explains_at` of their own count after ``tried`` hypotheses."""
  n = int(np.size(t))
  if n >= MIN_ELEMENTS:
    return ranked, []
  bar = explains_at(n - 1, tried) if n > 1 else -math.inf
  loose = lambda x: (x[1].extra.get("category") == "constant"
                     and not x[0] <= bar)
  return ([x for x in ranked if not loose(x)],
          [{"name": v.name, "estimate": float(v.estimate), "ratio": float(q)}
           for q, v, _ in filter(loose, ranked) if q <= EXPLAINS])


def _composable(ranked) -> bool:
  """Whether compositions are tried: no single hypothesis explains, or
  the best is the inputs rounded to a format alone (a slip on top of a
  precision base leaves the base explaining most elements)."""
  return bool(ranked) and (not ranked[0][0] <= EXPLAINS
                           or _rounded_inputs(ranked[0][1]))


def _with_compositions(ranked, grammar, test, t, r, g, fin, kind=""):
  """``ranked`` with two-step compositions added: each of the best
  precision bases (inputs rounded to a format) under each of the best
  other slips, re-ranked."""
  bases = [v for _, v, _ in ranked if v.name.startswith("inputs_")
           and "+" not in v.name][:COMPOSE_BASES]
  slips = [v.name for _, v, _ in ranked if not v.name.startswith("inputs_")
           and v.extra.get("slip") and "+" not in v.name][:COMPOSE_SLIPS]
  # A constant's effect may hide under the base's rounding when fitted
  # alone: every constant of the kind is refitted on the rounded inputs.
  slips += [p for p in _core.PARAMETERS.get(kind, {}) if p not in slips]
  more = []
  for b in bases:
    for name in slips:
      more += grammar(only=f"{b.name}+{name}")
  if not more:
    return ranked
  out = ranked_answers([v for _, v, _ in ranked] + more, test, t, r, g, fin)
  alone = {v.name: q for q, v, _ in out if "+" not in v.name}
  return [x for x in out if "+" not in x[1].name or _gains(x, alone)]


#: A composition (a slip on a precision base) replaces its base where
#: the base does not explain the output, or where it halves the base's
#: ratio: a second slip that changes nothing (a row read from its
#: identical neighbour) or leaves rounding noise gains nothing.
COMPOSE_GAIN = 0.5


def _gains(x, alone: Mapping[str, float]) -> bool:
  """Whether a composition earns its second slip (:data:`COMPOSE_GAIN`)."""
  q, v, _ = x
  base = alone.get(v.name.partition("+")[0])
  return base is None or not base <= EXPLAINS or q <= COMPOSE_GAIN * base


def _level(t: np.ndarray, r: np.ndarray, fin: np.ndarray) -> float | None:
  """The KUT's median relative error against the reference (against
  max(|r|, its RMS)) over the finite elements where they differ."""
  d = np.abs(t - r)[fin]
  keep = d > 0
  if not keep.any():
    return None
  scale = max(float(np.sqrt(np.mean(np.square(r[fin])))), 1e-300)
  return float(np.median(d[keep] / np.maximum(np.abs(r[fin][keep]), scale)))


def _named_level(name: str) -> float | None:
  """The level at which a named precision hypothesis (``inputs_<fmt>...``)
  is tried: its own prediction."""
  for fmt in LEVEL_FORMATS:
    if name.startswith(f"inputs_{fmt}"):
      return INPUT_LEVEL * _core.FORMATS[fmt].unit_roundoff
  return None


def _output_u(test) -> float:
  """The unit roundoff of the KUT output's dtype."""
  name = np.dtype(getattr(test, "dtype", np.float32)).name
  return _core.FORMATS[_core.DTYPE_FORMAT.get(name, "fp32")].unit_roundoff


def _at_output(h: np.ndarray, dtype) -> np.ndarray:
  """A float64 output (a hypothesis's, the reference) rounded to the KUT
  output's dtype where it is 16-bit: the KUT rounds its own result there
  too, and half an ulp of bf16 is no part of either distance (the ratio
  reads the KUT against both, rounded alike)."""
  if np.dtype(dtype).itemsize > 2:
    return h
  with np.errstate(all="ignore"):
    return np.asarray(h.astype(np.float32).astype(dtype), np.float64)


def ranked_answers(hyps: Sequence[Variant], test, t, r, g, fin
                   ) -> list[tuple[float, Variant, np.ndarray]]:
  """Every hypothesis that evaluates, as ``(median ratio, variant, its
  float64 output)``, best first (a tie to the first listed). ``t``,
  ``r``, ``g``: float64; ``fin``: their finite elements. The ratio is read
  on the variant and the reference rounded to the output's dtype;
  structural ones (``indexing``) where they move the output."""
  dtype = np.dtype(getattr(test, "dtype", np.float32))
  r_out = _at_output(r, dtype)
  base = _ratio_base(t, r_out, fin, g, r)
  out = []
  for n, v in enumerate(hyps):
    try:
      with np.errstate(all="ignore"):
        h = _f64(v.fn())
    except (ValueError, FloatingPointError, ImportError, TypeError,
            IndexError, KeyError, ZeroDivisionError):
      continue
    if np.shape(h) != t.shape:
      continue
    hc = _at_output(h, dtype)
    ratios = _ratios(base, hc, real=not _rounded_inputs(v))
    ratio = median(ratios)
    out.append((_rank_key(ratio, base, hc, n), ratio, v, h))
  out.sort(key=lambda x: x[0])
  return [(ratio, v, h) for _, ratio, v, h in out]


def _rounded_inputs(v: Variant) -> bool:
  """Whether a hypothesis is the inputs rounded to a format alone (every
  element moves; playback tries them on the device too)."""
  return v.extra.get("where") == "inputs" and "+" not in v.name


def _explained_share(base: _RatioBase, h) -> float:
  """The share of the KUT's real error a hypothesis explains, read alike
  for every hypothesis: of the elements beyond the golden kernel's noise
  (``base.real``) those within EXPLAINS of the hypothesis, over those
  elements and the ones the hypothesis alone moves beyond it (fewer than
  PROBE_MIN beyond: of every differing element)."""
  with np.errstate(invalid="ignore", over="ignore"):
    good = np.abs(base.t - h[base.keep]) <= EXPLAINS * base.d_r
    if base.real > 0 and base.r is not None:
      beyond = base.d_r > base.real
      if int(beyond.sum()) >= PROBE_MIN:
        moved = (np.abs(h - base.r) > base.real) & base.fin
        alone = int(moved.sum()) - int(moved[base.keep][beyond].sum())
        return float((good & beyond).sum()) / (int(beyond.sum()) + alone)
  return float(good.mean()) if good.size else 0.0


def _rms_to(base: _RatioBase, h) -> float:
  """The RMS of ``t - h`` over the differing elements (inf where ``h`` is
  not finite)."""
  if not base.t.size:
    return np.inf
  with np.errstate(invalid="ignore", over="ignore"):
    v = float(np.sqrt(np.mean(np.square(base.t - h[base.keep]))))
  return v if np.isfinite(v) else np.inf


def _rank_key(ratio: float, base: _RatioBase, h, index: int) -> tuple:
  """Hypotheses that explain rank by the share of the KUT's real error
  they explain (:func:`_explained_share`; two slips equal on most elements, positions rolled by
  one and offset by one: the one right at the edge too), then by their
  median ratio, then by their RMS distance to the KUT (two truncations
  of which one nests in the other agree on most elements and differ on
  the rest); the others by their median ratio; ties to the first
  listed."""
  if ratio <= EXPLAINS:
    return (0, -_explained_share(base, h), ratio, _rms_to(base, h), index)
  return (1, 0.0, ratio, _rms_to(base, h), index)


def best_answer(hyps: Sequence[Variant], test, t, r, g, fin, d_ref: float,
                d_gold: float, rms: Callable[[np.ndarray], float]
                ) -> tuple[dict, np.ndarray] | None:
  """The probe's answer for the closest of ``hyps`` and its float64
  output (None when none evaluates): ``t``, ``r``, ``g`` float64, ``fin``
  their finite elements, ``d_ref`` / ``d_gold`` the KUT's and golden's
  RMS distance to the reference, ``rms`` that distance's function."""
  ranked = ranked_answers(hyps, test, t, r, g, fin)
  if not ranked:
    return None
  ratio, v, h = ranked[0]
  return probe_answer(v.model, v.name, v.sentence, _tried(hyps), ratio,
                      rms(t - h), d_ref, d_gold, v.estimate,
                      {**v.extra, "runners_up": runners_up(ranked),
                       "searched": _searched(hyps)}), h


def probe_signatures(probes: Sequence[dict | None],
                     tests: Sequence[Any],
                     cleared: Callable[[Any, Any], bool] | None = None
                     ) -> None:
  """The re-based Signatures of many deferred probes, in one executable.

  For each probe made with ``signature="defer"`` whose hypothesis explains
  the output, replaces its ``"hypothesis"`` (the float64 output; or
  ``"hypothesis_split"``: that output already rounded to the test's dtype
  and split into float32 halves, device arrays) by the
  ``"signature"`` ``port_probe`` would have added (``test`` against the
  hypothesis rounded to the output's dtype, the hypothesis as reference:
  the same values, one dispatch and one transfer for all, NumPy fields).
  One probe or many, each record runs at its own shape
  (`analyze_split_many`): a deferred probe's Signature is bitwise the one
  ``port_probe(signature=True)`` adds (tests/analyzer/test_ports.py), and
  a campaign's sites compile once.

  Args:
    probes: ``port_probe`` results (None where no probe ran); modified in
      place.
    tests: the KUT output of each probe's record, in the same order.
    cleared: triage (playback): given a re-based record's screen
      (``screen_split_many``: its Signature without the decomposition, and
      its Screen), whether it is inside the hypothesis's rounding envelope
      with nothing left to explain; such a record keeps the screened
      Signature (``decomposed`` False), the others are decomposed. None:
      every one is decomposed.

  Raises:
    PeatError: as ``analyze_split_many``.
  """
  todo = [(p, t) for p, t in zip(probes, tests)
          if p is not None and ("hypothesis" in p or "hypothesis_split" in p)]
  if not todo:
    return
  golds, his, los = [], [], []
  for p, t in todo:
    if "hypothesis_split" in p:  # the output's dtype and halves, on device
      gold, hi, lo = p["hypothesis_split"]
    else:
      hi, lo = split_reference(p["hypothesis"], np.shape(t), batched=False)
      gold = p["hypothesis"].astype(
          t.dtype if hasattr(t, "dtype") else np.asarray(t).dtype)
    golds.append(gold)
    his.append(hi)
    los.append(lo)
  args = ([t for _, t in todo], golds, his, los)
  if cleared is None:
    sigs = analyze_split_many(*args, to_host=True)
  else:
    screens = screen_split_many(*args, to_host=True)
    flagged = [i for i, (sig, scr) in enumerate(screens)
               if not cleared(sig, scr)]
    decs = decompose_split_many(*[[a[i] for i in flagged] for a in args],
                                to_host=True)
    sigs = [sig for sig, _ in screens]
    for i, dec in zip(flagged, decs):
      sigs[i] = with_decomposition(sigs[i], dec)
  for (p, _), sig in zip(todo, sigs):
    p.pop("hypothesis", None)
    p.pop("hypothesis_split", None)
    p["signature"] = sig
