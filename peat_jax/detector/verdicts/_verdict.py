"""Verdicts: their order, one KUT's verdict over many records, localization.

The one home of the verdict order (``pass`` < ``warn`` < ``fail``): the
report, the campaign drivers and the tools read it from here.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from peat_jax.core import PeatError
from peat_jax.detector.facts import BENIGN_NOISE_RATIO, Candidate, Diagnosis

#: The verdicts, mildest first.
VERDICTS = ("pass", "warn", "fail")
_SEVERITY = {v: i for i, v in enumerate(VERDICTS)}
#: Noise ratio above which a site counts as leaving the noise floor (the
#: verdict's envelope: a record that passes does not localize).
LOCALIZE_NOISE_RATIO = BENIGN_NOISE_RATIO


def severity(v: str) -> int:
  """0 for ``pass``, 1 for ``warn``, 2 for ``fail``.

  Raises:
    PeatError: not a verdict.
  """
  try:
    return _SEVERITY[v]
  except (KeyError, TypeError):
    raise PeatError(f"unknown verdict {v!r}; expected one of "
                    f"{', '.join(VERDICTS)}") from None


def worst(verdicts: Iterable[str], default: str = "pass") -> str:
  """The most severe of ``verdicts`` (``default`` when there is none)."""
  return max(verdicts, key=severity, default=default)


#: Thresholds of ``--fail_on`` / ``fail_on=``: the verdict that fails a run.
FAIL_ON = ("fail", "warn", "never")


def reaches(v: str, fail_on: str) -> bool:
  """Whether verdict ``v`` reaches the threshold ``fail_on``.

  ``fail_on="fail"``: only ``fail``; ``"warn"``: ``warn`` or ``fail``;
  ``"never"``: nothing (CI exit status 1 when it is reached).

  Raises:
    PeatError: an unknown verdict or threshold.
  """
  if fail_on not in FAIL_ON:
    raise PeatError(f"fail_on must be one of {', '.join(FAIL_ON)}; got "
                    f"{fail_on!r}")
  return fail_on != "never" and severity(v) >= severity(fail_on)


class Verdict(NamedTuple):
  """A kernel under test's verdict over many (site, step) records.

  Attributes:
    verdict: ``pass``, ``warn`` or ``fail``.
    deciding: the records (keys as given) that decided it, worst first.
    models: count of records per diagnosed model.
    summary: one sentence.
  """

  verdict: str
  deciding: tuple
  models: Mapping[str, int]
  summary: str


def verdict(diagnoses: Mapping[Any, Diagnosis] | Sequence[Diagnosis]
            ) -> Verdict:
  """Aggregates per-record diagnoses into one verdict for the KUT.

  ``fail`` when any record fails (a fault model, or an error no model
  explains), else ``warn`` when any record warns (precision loss,
  accumulation, truncation, flushing, nondeterminism, or reordering beyond
  the noise-floor envelope), else ``pass``.

  Args:
    diagnoses: ``{record key: Diagnosis}`` (e.g. key ``(site, step)``) or a
      sequence of diagnoses.

  Returns:
    A :class:`Verdict`.

  Raises:
    PeatError: no diagnoses.
  """
  items = (list(diagnoses.items()) if isinstance(diagnoses, Mapping)
           else list(enumerate(diagnoses)))
  if not items:
    raise PeatError("verdict() needs at least one diagnosis")
  items.sort(key=lambda kv: (-severity(kv[1].verdict), -kv[1].confidence))
  top = items[0][1].verdict
  deciding = tuple(k for k, d in items if d.verdict == top)
  models: dict[str, int] = {}
  for _, d in items:
    models[d.model] = models.get(d.model, 0) + 1
  listed = ", ".join(f"{m} x{c}" for m, c in sorted(
      models.items(), key=lambda mc: -mc[1]))
  summary = (f"{top}: {len(deciding)} of {len(items)} records decided it "
             f"(diagnoses: {listed})")
  return Verdict(top, deciding, models, summary)


def diagnosis_record(diag: Diagnosis) -> dict:
  """The msgpack-ready form of a Diagnosis stored in a site record.

  Returns:
    ``{"model", "confidence", "evidence", "verdict"}`` and, when the
    diagnosis has one, ``"secondary": {"model", "confidence",
    "evidence"}``.
  """
  out = {"model": diag.model, "confidence": float(diag.confidence),
         "evidence": diag.evidence, "verdict": diag.verdict}
  if diag.secondary is not None:
    out["secondary"] = {"model": diag.secondary.model,
                        "confidence": float(diag.secondary.confidence),
                        "evidence": diag.secondary.evidence}
  return out


def diagnosis_of(record: Mapping[str, Any]) -> Diagnosis:
  """Rebuilds a Diagnosis (without candidates) from a stored site record.

  Args:
    record: a site record (``{"diagnosis": {"model", "confidence",
      "evidence", "verdict", "secondary"?}, ...}``, docs/campaign.md;
      records written before secondary causes have none).

  Returns:
    The :class:`Diagnosis` (``params`` empty, no candidates).
  """
  d = record["diagnosis"]
  sec = d.get("secondary")
  second = (Candidate(sec["model"], sec["confidence"], sec["evidence"], {})
            if sec else None)
  return Diagnosis(d["model"], d["confidence"], d["evidence"], {}, (),
                   d["verdict"], second)



def variants_verdict(records: Sequence[Mapping[str, Any]],
                     findings: Sequence[Mapping[str, Any]] = ()
                     ) -> tuple[Verdict | None, str]:
  """The verdict of fuzz variants (``peat.fuzz``) and its sentence.

  A finding (the KUT raised, or returned another shape or dtype, on a
  variant) fails it; otherwise :func:`verdict` of the records' diagnoses,
  keyed ``(site, variant)`` (``variant (seed s)`` when the records hold
  several seeds).

  Args:
    records: fuzz site records (``"site"``, ``"variant"``,
      ``"diagnosis"``).
    findings: ``fuzz_error`` entries (``"site"``, ``"variant"``,
      ``"error"``).

  Returns:
    ``(Verdict or None when there is nothing, summary sentence)``.
  """
  several = len({e.get("seed") for e in (*records, *findings)}) > 1

  def key(r):
    return r["site"], r["variant"] + (f" (seed {r.get('seed')})"
                                      if several else "")
  diags = {key(r): diagnosis_of(r) for r in records}
  v = verdict(diags) if diags else None
  if findings:
    first, n = findings[0], len(findings)
    summary = (f"fail: the KUT failed on {n} variant{'s' if n > 1 else ''}"
               f" (first: {first['site']} {first['variant']}: "
               f"{first['error']})")
    if v is not None:
      summary += f"; the others: {v.summary}"
    return Verdict("fail", tuple(key(f) for f in findings),
                   dict(v.models) if v is not None else {}, summary), summary
  if v is None:
    return None, "no variant ran"
  worst = v.deciding[0]
  return v, v.summary + (f"; first: {worst[0]} {worst[1]}"
                         if v.verdict != "pass" else "")

def localize(records: Sequence[Mapping[str, Any]],
             site_order: Sequence[str]) -> dict | None:
  """First site (execution order) leaving the noise floor, earliest step.

  A record leaves it when its noise ratio exceeds
  :data:`LOCALIZE_NOISE_RATIO`, or when it is not exact and its diagnosis
  fails.

  Args:
    records: site records (docs/campaign.md).
    site_order: site names in execution order.

  Returns:
    ``{"site", "step", "noise_ratio"}``, or None when no record left it.
  """
  order = {n: i for i, n in enumerate(site_order)}
  hits = []
  for r in records:
    nr = r["signature"].get("noise_ratio", math.nan)
    bad = (nr == nr and nr > LOCALIZE_NOISE_RATIO) or (
        r["diagnosis"]["model"] != "exact"
        and r["diagnosis"]["verdict"] == "fail")
    if bad:
      hits.append((order.get(r["site"], 1 << 30), r["step"], r["site"], nr))
  if not hits:
    return None
  _, step, site, nr = min(hits)
  return {"site": site, "step": int(step),
          "noise_ratio": None if nr != nr else float(nr)}
