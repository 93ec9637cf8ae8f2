"""The Detector: which error model explains a signature, with evidence.

Every error model is a hypothesis (:mod:`._hypotheses`) that predicts the
error in magnitude and is accepted by a statistic of the record: exact
relations (NaN/Inf, values in other places, a constant ratio, one bit
forced one way), the fit of the base (another order, a rounding into a
narrower format, a port's constant or form) and the faults on the
residual that base leaves. :func:`detect` tests every hypothesis that
reads the record and ranks the accepted ones (:mod:`._rank`): a fault is
the primary cause and decides the verdict, the base is the secondary one.
Every threshold comes from the call's
:class:`~peat_jax.detector.DetectorConfig` (docs/detector.md lists
them with their derivations).

Where the site's inputs were at hand, the port probe (``context["port"]``)
fitted the base by synthesis (the kernel rerun under the base
hypothesis); the faults are then read on the KUT's output against that
synthesized base.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np

from peat_jax.core import PeatError
from peat_jax.detector.hypotheses import _h_whole as whole
from peat_jax.detector.facts import CONFIG, DetectorConfig
from peat_jax.detector.facts import Found, Noise, Repeat
from peat_jax.detector.facts import (
    Context, Diagnosis, Facts, checked_signature, family, working_format)
from peat_jax.detector.hypotheses._hypotheses import Hypothesis, applicable
from peat_jax.detector.hypotheses._rank import candidate, decide

#: The exact traces read on the original record when the faults are read
#: against the probe's synthesized base.
_EXACT_TRACES = (whole.nonfinite, whole.transposed, whole.shifted,
                 whole.permuted)


def detect(sig, *, repeat=None, dtype=None,
           context: Mapping[str, Any] | Context | None = None,
           config: DetectorConfig = CONFIG) -> Diagnosis:
  """Names the error model that explains one signature.

  Args:
    sig: a Signature of one record (``peat.analyze``).
    repeat: optionally the Signature of a second KUT call on the same
      inputs against the first; any difference there is ``nondeterminism``.
    dtype: the compared arrays' dtype when the signature cannot tell
      (16-bit records: bfloat16 vs float16); inferred otherwise.
    context: what the site is, when known: ``{"kernel": "dot_general",
      "reduction": K, "port": <port probe>}`` (or a :class:`Context`).
      The reduction length K separates accumulation in a narrow format
      (error grows like sqrt(K)) from rounded inputs.
    config: the thresholds (:data:`~peat_jax.detector.CONFIG` by default).

  Returns:
    A :class:`Diagnosis`; ``model`` is ``exact`` for bitwise-equal outputs
    and ``unknown`` when no hypothesis explains a real difference.

  Raises:
    PeatError: ``sig`` is not a single-record Signature, or ``dtype`` is
      not a float dtype the Detector knows.
  """
  s = checked_signature(sig)
  if np.ndim(s.n) != 0:
    raise PeatError(
        f"detect() takes one record's Signature; this one holds "
        f"{np.shape(s.n)[0]} records (from analyze_batch): use "
        "detect_batch()")
  f = Facts(s, working_format(s, dtype), Context.of(context), config)
  accepted = _repeat(repeat, f)
  if f.ndiff == 0 and not accepted:
    return _exact(f, f"all {f.n} elements are bitwise equal to golden")
  if f.ndiff and int(s.n_value_equal) == f.n and not accepted:
    return _exact(f, f"values equal; {f.ndiff} elements differ only in the "
                  "sign of zero", signed_zeros=f.ndiff)
  rebased = _rebased(f)
  if rebased is None:
    accepted += [(h, x) for h in applicable(f) for x in h.test(f)]
  else:
    accepted += _against_probe(f, rebased)
  return decide(accepted, f)


def _exact(f: Facts, sentence: str, signed_zeros: int = 0) -> Diagnosis:
  found = Found("exact", Noise(0.0, 1.0, 0.0, f.n), sentence, 1.0)
  cand = candidate(found)
  if signed_zeros:
    cand = cand._replace(params={**cand.params, "signed_zeros": signed_zeros})
  return Diagnosis(*cand[:4], candidates=(cand,), verdict="pass")


_REPEAT = Hypothesis("nondeterminism", "base", "any", lambda f: [])


def _repeat(repeat, f: Facts) -> list[tuple[Hypothesis, Found]]:
  """``nondeterminism``: a second call on identical inputs differs."""
  if repeat is None:
    return []
  r = checked_signature(repeat)
  rdiff = int(r.n) - int(r.n_bit_equal)
  if not rdiff:
    return []
  return [(_REPEAT, Found(
      "nondeterminism", Repeat(rdiff, rdiff),
      f"two KUT calls on identical inputs differ at {rdiff} of {int(r.n)} "
      f"elements (max |diff| {float(r.abs_max):.3g})", 1.0))]


def _rebased(f: Facts) -> Facts | None:
  """The facts of the KUT's output against the probe's synthesized base
  (its re-based Signature), when the probe explains the output; None
  otherwise. A re-based signature without its decomposition is one the
  triage screen cleared (every element within the variant's rounding
  envelope): no residual left to read."""
  probe = f.ctx.probe
  if probe is None or not probe.explains or probe.signature is None:
    return None
  return Facts(checked_signature(probe.signature), f.work,
               f.ctx._replace(probe=None), f.cfg)


def _against_probe(f: Facts, fr: Facts) -> list[tuple[Hypothesis, Found]]:
  """The probe's base, the exact traces of the original record, and the
  faults on the residual the base leaves (read on the re-based facts)."""
  out = []
  for h in applicable(f):
    if h.role == "base" and h.test.__name__ in ("probed_precision",
                                                "probed_form"):
      out += [(h, x) for x in h.test(f)]
    elif h.test in _EXACT_TRACES:
      out += [(h, x) for x in h.test(f)]
  note = f" (against the KUT's own {f.ctx.probe.name} variant, which " \
         "explains the rest)"
  for h in applicable(fr):
    if h.role != "fault" or h.test in _EXACT_TRACES or not fr.dec:
      continue
    out += [(h, x._replace(sentence=x.sentence + note)) for x in h.test(fr)
            if family(x.model) != "unknown"]
  return out


def detect_batch(sig, *, dtype=None,
                 context: Mapping[str, Any] | None = None,
                 config: DetectorConfig = CONFIG) -> list[Diagnosis]:
  """``detect`` for each record of a batched Signature (``analyze_batch``)."""
  s = jax.device_get(sig)
  count = np.shape(s.n)[0] if np.ndim(s.n) else None
  if count is None:
    return [detect(sig, dtype=dtype, context=context, config=config)]
  return [detect(jax.tree.map(lambda x, i=i: x[i], s), dtype=dtype,
                 context=context, config=config) for i in range(count)]
