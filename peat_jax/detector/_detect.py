"""The Detector: which error model explains a signature, with evidence.

Each rule is a *sufficient condition* on a :class:`~peat_jax.Signature`
(docs/detector.md lists them with their derivations): when it holds, the
named error model explains the pseudo-error. Thresholds come from
floating-point facts, not from tuning:

* ``u(fmt)``, the unit roundoff of a format (``2**-p`` with ``p`` the
  significand precision including the implicit bit): float32 ``2**-24``,
  bf16 ``2**-8``, fp16 and tf32 ``2**-11``, fp8_e4m3 ``2**-4``, fp8_e5m2
  ``2**-3``. Rounding to nearest into ``fmt`` has relative error ``<= u``;
  round toward zero has ``< 2u`` and is one-signed.
* Rounding noise of another summation order is unbiased (about as many
  positive as negative errors) and within a small multiple of the golden
  kernel's own distance to the float64 reference (the noise floor).
* Faults (bit flips, stuck bits, wrong values, missed writes, wrong
  indices) leave exact structural traces: single bit positions in the XOR of
  the bit patterns, a single polarity, periodic positions, bit patterns of
  the golden output found elsewhere, a constant ratio.

Rules run from the most specific (exact relations) to the least specific
(statistical noise levels); every rule that holds yields a
:class:`Candidate`, the candidates are ranked by confidence, and the first
is the diagnosis.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.core import PeatError
from peat_jax.detector._facts import (
    BENIGN_NOISE_RATIO, Candidate, Diagnosis, MIN_PATTERN, PORT_MODELS,
    PRECISION_MODELS, REORDERING_ENVELOPE, _Facts, _host, _pct,
    _working_format, outliers_within_long_sum, within_working_sum)
from peat_jax.detector._degenerate import _rule_tiny_flush, never_benign
from peat_jax.detector._outliers import _rule_dense_faults, _rule_outliers
from peat_jax.detector._ports import _probe, _rule_port, port_verdict
from peat_jax.detector._rules import (
    _rule_edge, _rule_ftz, _rule_indexing, _rule_lane, _rule_nonfinite,
    _rule_saturation_clip, _rule_scale, _rule_sparse, _rule_stuck, _rule_tile,
    _rule_zero)
from peat_jax.detector._rounding import _rule_rounded_outputs, _rule_rounding


#: With at most this share of elements differing (the rest bitwise
#: golden), sparse elements far beyond their own ulps are read as faults
#: even inside the rounding envelope.
SPARSE_EXACT_SHARE = 0.01
#: ... and they differ from golden in at most this many bits on average: a
#: flip is one bit, where 8 or more ulps of reordering noise (an output
#: near zero, its terms cancelling) carry through several.
SPARSE_EXACT_BITS = 1.5

_RULES = (_rule_nonfinite, _rule_saturation_clip, _rule_indexing, _rule_scale,
          _rule_ftz, _rule_tiny_flush, _rule_lane, _rule_zero, _rule_tile,
          _rule_stuck, _rule_edge, _rule_sparse, _rule_rounding)


def _record_verdict(model: str, f: _Facts) -> str:
  base = model.split(":")[0]
  if base == "exact":
    return "pass"
  if base == "reordering":
    if (not f.has_ref or f.noise_ratio <= BENIGN_NOISE_RATIO
        or within_working_sum(f)):
      return "pass"
    return "warn"
  if base in PRECISION_MODELS:
    return "warn"
  if base in PORT_MODELS:
    return port_verdict(f)
  within = f.dec and (f.n_beyond == 0 or (f.nbits == 16 and f.n_out == 0))
  if (base == "unknown" and f.has_ref and within
      and not int(f.s.get("n_nonfinite_mismatch", 0))
      and np.isfinite(f.noise_ratio)
      and f.noise_ratio <= REORDERING_ENVELOPE):
    # More than rounding noise, yet every element within the rounding
    # envelope (a 16-bit record: within the outlier floor, which a few
    # more roundings in bf16 reach) and no fault's trace: a dense error
    # of rounding size that no model names is looked at, not failed.
    # Beyond REORDERING_ENVELOPE x the golden noise floor no order or
    # rounding of the same formula gets: another formula fails.
    return "warn"
  return "fail"


def detect(sig, *, repeat=None, dtype=None,
           context: Mapping[str, Any] | None = None) -> Diagnosis:
  """Names the error model that explains one signature.

  Args:
    sig: a Signature of one record (``peat.analyze``).
    repeat: optionally the Signature of a second KUT call on the same
      inputs against the first; any difference there is ``nondeterminism``.
    dtype: the compared arrays' dtype when the signature cannot tell
      (16-bit records: bfloat16 vs float16); inferred otherwise.
    context: what the site is, when known: ``{"kernel": "dot_general",
      "reduction": K}``. The reduction length K separates accumulation in a
      narrow format (error grows like sqrt(K)) from rounded inputs.

  Returns:
    A :class:`Diagnosis`; ``model`` is ``exact`` for bitwise-equal outputs
    and ``unknown`` when no rule explains a real difference.

  Raises:
    PeatError: ``sig`` is not a single-record Signature.
  """
  s = _host(sig)
  if np.ndim(s["n"]) != 0:
    raise PeatError(
        f"detect() takes one record's Signature; this one holds "
        f"{np.shape(s['n'])[0]} records (from analyze_batch): use "
        "detect_batch()")
  f = _Facts(s, _working_format(s, dtype), context)
  cands: list[Candidate] = []
  if repeat is not None:
    r = _host(repeat)
    rdiff = int(r["n"]) - int(r["n_bit_equal"])
    if rdiff:
      cands.append(Candidate(
          "nondeterminism", 0.99,
          f"two KUT calls on identical inputs differ at {rdiff} of "
          f"{int(r['n'])} elements (max |diff| {float(r['abs_max']):.3g})",
          {"differing": rdiff}))
  if f.ndiff == 0 and not cands:
    cand = Candidate("exact", 1.0, f"all {f.n} elements are bitwise equal "
                     "to golden", {})
    return Diagnosis(*cand, candidates=(cand,), verdict="pass")
  if f.ndiff and int(s["n_value_equal"]) == f.n:
    cands.append(Candidate(
        "exact", 0.9, f"values equal; {f.ndiff} elements differ only in the "
        "sign of zero", {"signed_zeros": f.ndiff}))
  if not (cands and cands[0].model == "exact"):
    if f.dec or _screened_and_explained(f):  # exact traces hold on any
      # noise: new NaN/Inf, golden's
      # bit patterns moved (a transpose, shift or permutation)
      return never_benign(_nonfinite_fails(_decomposed(
          f, cands + _rule_nonfinite(f) + _rule_indexing(f)), s), f)
    for rule in _RULES:
      if rule is _rule_rounding and cands:
        break  # a structural fault explains it; noise levels would only blur
      cands.extend(rule(f))
  if not cands:
    cands.append(_unknown(f))
  cands.sort(key=lambda c: -c.confidence)
  top = cands[0]
  return never_benign(_nonfinite_fails(Diagnosis(
      top.model, top.confidence, top.evidence, top.params, tuple(cands),
      _record_verdict(top.model, f)), s), f)


def _nonfinite_fails(diag: Diagnosis, s: Mapping[str, Any]) -> Diagnosis:
  """A NaN or Inf where golden has none, or none where golden has one, is a
  hard fail whatever the cause named (the ratio view's
  ``nonfinite_mismatch``)."""
  n = int(s.get("n_nonfinite_mismatch", 0))
  if not n or diag.verdict == "fail":
    return diag
  return diag._replace(
      verdict="fail",
      evidence=f"{diag.evidence}; {n} elements are NaN/Inf in one of the "
      "KUT and golden outputs and finite in the other (a hard fail)")


def _screened_and_explained(f: _Facts) -> bool:
  """A screened record (no decomposition of its own) whose port probe
  explains it by rounded inputs (``precision:<fmt>``, ``accumulation``):
  its diagnosis needs only the probe's re-based signature and the exact
  traces (playback: a probe carried to a site's later records,
  profiler.playback_fi._site_records). A port's other constant or form
  (``parameter``, ``approximation``) is judged on the decomposed level
  and is never decided so."""
  port = f.context.get("port") or {}
  return (not f.dec and f.has_ref and bool(port.get("explains"))
          and port.get("signature") is not None
          and str(port.get("model", "")).split(":")[0] in PRECISION_MODELS)


def _decomposed(f: _Facts, cands: list[Candidate]) -> Diagnosis:
  """Primary and secondary causes from the noise-aware decomposition.

  Faults that move every element (scale, shift, transpose, permutation)
  explain the whole; otherwise faults confined to the outliers are the
  primary cause and the dense rules (rounding, port mismatches) read the
  rest: their model is the secondary cause, or the primary one when
  nothing is beyond the envelope.
  """
  probed = _probe(f)
  rebased = f.context["port"].get("signature") if probed else None
  if rebased is not None:
    # The probe's hypothesis (another constant, form or input precision)
    # explains the dense part: the faults are what it leaves.
    port = f.context["port"]
    fh = _Facts(_host(rebased), f.work,
                {k: v for k, v in f.context.items() if k != "port"})
    # A re-based signature without its decomposition is one the triage
    # screen cleared (playback: analyzer.probe_signatures(cleared=...)):
    # every element within the variant's rounding envelope, no trace of a
    # fault left to find.
    found = (_rule_dense_faults(fh) or _rule_outliers(fh)) if fh.dec else []
    faults = list(cands) + [c._replace(evidence=(
        f"{c.evidence} (against the KUT's own {port['name']} variant, "
        f"which explains the rest)")) for c in found]
    dense = probed
  else:
    wholes = _rule_dense_faults(f)
    faults = list(cands) + wholes
    whole = bool(wholes)
    if not whole:
      faults += _rule_outliers(f)
    elif all(c.params.get("kind") == "permutation" for c in wholes):
      # Sorted outliers lining up with golden's values is a coincidence
      # among densely packed outputs (softmax, 16-bit) or when there are
      # only a few of them: every outlier back within rounding by the same
      # bit forced one way (stuck), or a few by a flip each, is preferred.
      # (Many outliers of a 16-bit output come back within its wide
      # envelope by some exponent flip even when permuted.)
      bits = [c for c in _rule_outliers(f)
              if (c.model == "stuck_at" or (c.model == "bitflip"
                                            and f.n_out < MIN_PATTERN))
              and int(c.params.get("covers", 0)) >= f.n_out]
      if bits:
        faults, whole = list(cands) + bits, False
    if not faults:
      faults += _rule_tiny_flush(f)
    if not faults:
      # A stuck low bit may stay inside the rounding envelope, but every
      # differing element differing in that one bit, one way, is an exact
      # trace that no summation order leaves.
      faults += _rule_stuck(f)
    beyond = f.has_ref and f.noise_ratio > REORDERING_ENVELOPE
    rounded = _rule_rounded_outputs(f)
    if not faults and not rounded and (
        beyond or (f.share <= SPARSE_EXACT_SHARE and
                   f.bits_per_diff <= SPARSE_EXACT_BITS)):
      # A few elements moved by 8 or more ulps where every other element is
      # bitwise golden: in a 16-bit format such a flip can stay inside the
      # envelope (16x the golden kernel's own rounding of u), yet no
      # summation order moves so few elements that far, nor leaves an
      # error beyond REORDERING_ENVELOPE times golden's (a small output, a
      # classifier's logits: 2 of 8 doubled, 25x golden's error), which no
      # cancellation noise reaches either.
      faults += _rule_sparse(f, beyond_reordering=beyond)
    dense = []
    rest = f.ndiff - (f.n_out if faults else 0)
    if not whole and rest > 0:
      dense = rounded + _rule_port(f) + _rule_rounding(f)
  faults = _rank_faults(faults, f)
  dense.sort(key=lambda c: -c.confidence)
  if faults:
    top, second = faults[0], (dense[0] if dense else None)
    if second is not None and second.model == top.model:
      second = None
  elif (dense and dense[0].model == "reordering" and f.n_out
        and not outliers_within_long_sum(f)):
    # Outliers beyond the KUT's own noise that no fault rule explains: the
    # rest is rounding, the outliers are unexplained.
    top, second = _unknown(f), dense[0]
  elif dense:
    top, second = dense[0], None
  else:
    top, second = _unknown(f), None
  verdict = _record_verdict(top.model, f)
  if second is not None and _worse(_record_verdict(second.model, f), verdict):
    verdict = _record_verdict(second.model, f)
  return Diagnosis(top.model, top.confidence, top.evidence, top.params,
                   tuple(faults + dense) or (top,), verdict, second)


def _rank_faults(faults: list[Candidate], f: _Facts) -> list[Candidate]:
  """Faults by confidence, except that flips explaining every outlier
  (``covers``) outrank the NaN/Inf some of those flips made: a NaN among
  few flipped elements is the flip's, not a cause of its own."""
  def explains_all(c: Candidate) -> bool:
    return (c.model == "bitflip" and f.dec and f.n_out > 0
            and int(c.params.get("covers", 0)) >= f.n_out)
  return sorted(faults, key=lambda c: (not explains_all(c), -c.confidence))


def _worse(a: str, b: str) -> bool:
  order = {"pass": 0, "warn": 1, "fail": 2}
  return order[a] > order[b]


def _unknown(f: _Facts) -> Candidate:
  """No model explains it: say what was seen, in numbers."""
  s = f.s
  floor = (f", {f.noise_ratio:.3g}x the golden noise floor"
           if f.has_ref else "")
  rel = _analyzer.relative_to_scale(s)["rel_max"]
  seen = [f"{f.ndiff} elements ({_pct(f.share)}) differ, median relative "
          f"error {f.rel_med:.3g}, max {rel:.3g} (against max(|golden|, "
          f"its RMS)){floor}"]
  if f.dec:
    seen.append(f"{f.n_beyond} beyond the rounding envelope, {f.n_out} "
                "outliers beyond the KUT's own noise")
    if f.has_ref:
      up, dn = float(s["ref_test_grown"]), float(s["ref_test_shrunk"])
      if up + dn > 0 and min(up, dn) <= 0.05 * (up + dn):
        seen.append("one-sided " + ("shrink" if dn > up else "growth")
                    + " against the float64 reference")
    err = np.asarray(s["row_err"], np.float64)
    res = np.asarray(s["row_resid"], np.float64)
    if np.sum(err > 0) >= 2:
      share = float(np.median(res[err > 0] / err[err > 0]))
      if share <= 0.3:
        seen.append("constant per row (a per-row scale fits)")
    r2 = float(s["value_r2"])
    if np.isfinite(r2) and r2 >= 0.3:
      seen.append(f"{r2:.0%} of the error is a function of the value")
  return Candidate("unknown", 0.5, "; ".join(seen) + "; no error model "
                   "explains it", {})


def detect_batch(sig, *, dtype=None,
                 context: Mapping[str, Any] | None = None) -> list[Diagnosis]:
  """``detect`` for each record of a batched Signature (``analyze_batch``)."""
  s = jax.device_get(sig)
  count = np.shape(s.n)[0] if np.ndim(s.n) else None
  if count is None:
    return [detect(sig, dtype=dtype, context=context)]
  return [detect(jax.tree.map(lambda x, i=i: x[i], s), dtype=dtype,
                 context=context) for i in range(count)]
