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

from peat_jax.core import PeatError
from peat_jax.detector._facts import (
    Candidate, Diagnosis, NOISE_FLOOR_MULTIPLIER, PRECISION_MODELS, _Facts,
    _host, _pct, _working_format)
from peat_jax.detector._rules import (
    _rule_edge, _rule_ftz, _rule_indexing, _rule_lane, _rule_nonfinite,
    _rule_saturation_clip, _rule_scale, _rule_sparse, _rule_stuck, _rule_tile,
    _rule_zero)
from peat_jax.detector._rounding import _rule_rounding


_RULES = (_rule_nonfinite, _rule_saturation_clip, _rule_indexing, _rule_scale,
          _rule_ftz, _rule_lane, _rule_zero, _rule_tile, _rule_stuck,
          _rule_edge, _rule_sparse, _rule_rounding)


def _record_verdict(model: str, f: _Facts) -> str:
  base = model.split(":")[0]
  if base == "exact":
    return "pass"
  if base == "reordering":
    if not f.has_ref or f.noise_ratio <= NOISE_FLOOR_MULTIPLIER:
      return "pass"
    return "warn"
  if base in PRECISION_MODELS:
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
  for rule in _RULES:
    if cands and cands[0].model == "exact":
      break
    if rule is _rule_rounding and cands:
      break  # a structural fault explains it; noise levels would only blur
    cands.extend(rule(f))
  if not cands:
    floor = (f", {f.noise_ratio:.3g}x the golden noise floor"
             if f.has_ref else "")
    cands.append(Candidate(
        "unknown", 0.5,
        f"{f.ndiff} elements ({_pct(f.share)}) differ, median relative "
        f"error {f.rel_med:.3g}, max {f.rel_max:.3g}{floor}; no error model "
        "explains it", {}))
  cands.sort(key=lambda c: -c.confidence)
  top = cands[0]
  return Diagnosis(top.model, top.confidence, top.evidence, top.params,
                   tuple(cands), _record_verdict(top.model, f))


def detect_batch(sig, *, dtype=None,
                 context: Mapping[str, Any] | None = None) -> list[Diagnosis]:
  """``detect`` for each record of a batched Signature (``analyze_batch``)."""
  s = jax.device_get(sig)
  count = np.shape(s.n)[0] if np.ndim(s.n) else None
  if count is None:
    return [detect(sig, dtype=dtype, context=context)]
  return [detect(jax.tree.map(lambda x, i=i: x[i], s), dtype=dtype,
                 context=context) for i in range(count)]
