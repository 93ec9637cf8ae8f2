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

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.probes._forms import Variant, _f64, _row_order
from peat_jax.analyzer.probes._forms import form_hypotheses, precision_only
from peat_jax.analyzer.probes._precision import INPUT_LEVEL, LEVEL_FORMATS
from peat_jax.analyzer.probes._precision import precision_hypotheses
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
  distance."""
  keep: np.ndarray  # bool, the record's shape: finite pairs with t != r
  t: np.ndarray  # float64 t[keep]
  d_r: np.ndarray  # float64 |t - r|[keep], all > 0


def _ratio_base(t, r, fin) -> _RatioBase:
  d_r = np.abs(np.where(fin, t, 0.0) - np.where(fin, r, 0.0))
  keep = d_r > 0  # implies finite: elsewhere both are 0
  return _RatioBase(keep, t[keep], d_r[keep])


def _where_moved(base: _RatioBase, h, r, g, fin) -> _RatioBase:
  """A structural hypothesis (values in other places) leaves some places
  as they were (the heads a wrong grouping maps right, a rope's first
  position): its ratio is read where it moves the output beyond the golden
  kernel's own error, when at least PROBE_MIN such elements differ."""
  with np.errstate(invalid="ignore"):
    moved = fin & (np.abs(h - r) > np.abs(g - r))
  keep = base.keep & moved
  if int(keep.sum()) < PROBE_MIN:
    return base
  sub = moved[base.keep]
  return _RatioBase(keep, base.t[sub], base.d_r[sub])


def _median_ratio(base: _RatioBase, h) -> float:
  """Median of |t - h| / |t - r| over the elements where t != r (h
  non-finite there: an infinite ratio)."""
  if not base.t.size:
    return np.inf
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    ratio = np.abs(base.t - h[base.keep]) / base.d_r
  ratio[np.isnan(ratio)] = np.inf
  return median(ratio)


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
    "reference_distance", "evidence", "estimate"?, "where"?,
    "rounding"?}``.
  """
  out = {"model": model, "name": name, "explains": bool(ratio <= EXPLAINS),
         "tried": list(tried),
         "ratio": float(ratio), "distance": float(distance),
         "reference_distance": float(d_ref),
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
  hyps = form_hypotheses(kind, args, kwargs, t, reference_fn, ref_args)
  if reference_fn is not None:
    level = (_named_level(only) if only is not None
             else None if precision_only(kind) else _level(t, r, fin))
    hyps += precision_hypotheses(kind, ref_args, reference_fn, hypotheses,
                                 level, _output_u(test))
  if only is not None:
    hyps = [h for h in hyps if h.name == only]
  best = best_answer(hyps, test, t, r, g, fin, d_ref, d_gold, rms)
  if best is None:
    return None
  out, h = best
  explains = out["explains"]
  if not explains:
    order = _row_order(kind, args, np.where(fin, t, 0.0),
                       np.where(fin, r, 0.0))
    if order is not None:
      out["row_order"] = order
  if explains and signature:
    out["hypothesis"] = h
    if signature != "defer":
      probe_signatures([out], [test])
  return out


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


def best_answer(hyps: Sequence[Variant], test, t, r, g, fin, d_ref: float,
                d_gold: float, rms: Callable[[np.ndarray], float]
                ) -> tuple[dict, np.ndarray] | None:
  """The probe's answer for the closest of ``hyps`` and its float64
  output (None when none evaluates): ``t``, ``r``, ``g`` float64, ``fin``
  their finite elements, ``d_ref`` / ``d_gold`` the KUT's and golden's
  RMS distance to the reference, ``rms`` that distance's function."""
  dtype = np.dtype(getattr(test, "dtype", np.float32))
  r_out = _at_output(r, dtype)
  best = _best_variant(hyps, _ratio_base(t, r_out, fin), t, r_out, g, fin,
                       dtype)
  if best is None:
    return None
  ratio, v, h = best
  return probe_answer(v.model, v.name, v.sentence, [hy.name for hy in hyps],
                      ratio, rms(t - h), d_ref, d_gold, v.estimate,
                      v.extra), h


def _best_variant(hyps: Sequence[Variant], base: "_RatioBase", t, r, g,
                  fin, dtype) -> tuple[float, Variant, np.ndarray] | None:
  """The variant with the lowest median ratio (structural ones read where
  they move the output), with its output; None when none evaluates. The
  ratio is read on the variant rounded to the output's dtype."""
  best = None
  for v in hyps:
    try:
      with np.errstate(all="ignore"):
        h = _f64(v.fn())
    except (ValueError, FloatingPointError, ImportError, TypeError):
      continue
    if np.shape(h) != t.shape:
      continue
    hc = _at_output(h, dtype)
    ratio = _median_ratio(_where_moved(base, hc, r, g, fin) if
                          v.model == "indexing" else base, hc)
    if best is None or ratio < best[0]:
      best = (ratio, v, h)
  return best


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
