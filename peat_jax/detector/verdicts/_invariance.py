"""Invariance rules: stale outputs, mutated inputs, batch variance, ignored
inputs, from the facts of ``peat_jax.analyzer.invariance_probe`` and
playback's history of a site's outputs.

Each rule is a sufficient condition read from exact (bitwise) facts, not
from error levels, so it holds whatever the pseudo-error's size:

* ``input_mutation``: an input's bits after a call differ from before it.
  Nothing but the kernel writes there (a fresh device copy per call).
* ``stale``: new values written into the input's own buffer (same
  address) give back the previous call's bits, where the same values in a
  buffer of their own give other ones; or a second call on identical
  inputs, made after a call on other inputs, returns that other call's
  bits; each at >= 90% of the elements that differ (and at least
  ``min(8, their count)``); or, in playback, rows of the KUT's output are
  bit-equal to the same rows of another of its outputs (another site of
  the same shape at this step, or any probed site at an earlier step),
  while the golden kernel's rows differ from those and the KUT's rows are
  wrong (at least ``min(8, rows)`` rows, zero rows not counted).
  Arithmetic does not reproduce another call's bits.
* ``nondeterminism``: two calls on identical values differ, and not with
  another call's values.
* ``input_insensitive``: of the output elements the float64 reference moves
  by more than 2**-3 of their magnitude when one input element per row
  moves by 4x its row's RMS, at least 8 and at least 1/8 stay bit-identical
  in the KUT, and the KUT moves at most 1/8 as many elements where the
  reference does not move at all (else its output follows the input, in
  other places: a permutation). Rounding to nearest into any format at
  least as fine as fp8_e4m3 (u = 2**-4) moves a value that moves by more
  than 2 u.
* ``batch_variance``: row 0 of the batch alone, or the first half as a
  batch, differs bitwise from the same rows of the full call. Reported with
  its size in units in the last place and its RMS against the golden
  kernel's float64 RMS error on the site (the noise floor); it warns while
  the RMS difference is within ``REORDERING_ENVELOPE`` (16) noise floors,
  the most that another summation order of the same float32 sums moves a
  result (another split of a reduction is one), and fails beyond.

:func:`with_invariance` folds them into a signature's diagnosis: a stale,
mutating or input-insensitive kernel fails whatever its values are; the
fault is the primary cause and the signature's model the secondary one.
"""

from __future__ import annotations

from typing import Any, Mapping

from peat_jax.detector.facts import (
    Candidate, Diagnosis, MIN_PATTERN, REORDERING_ENVELOPE, pct as _pct)

#: The invariance error models (DESIGN.md's table).
INVARIANCE_MODELS = ("stale", "input_mutation", "batch_variance",
                     "input_insensitive")
#: Invariance models that fail a kernel under test outright.
INVARIANCE_FAULTS = ("stale", "input_mutation", "input_insensitive")
#: Share of the elements a second identical call changed that must hold the
#: intervening call's bits for ``stale``.
STALE_SHARE = 0.9
#: Least share of the clearly moved elements left bit-identical for
#: ``input_insensitive``.
INSENSITIVE_SHARE = 1.0 / 8.0

_ORDER = {"pass": 0, "warn": 1, "fail": 2}


def _mutation(facts: Mapping[str, Any]) -> list[Candidate]:
  changed = list(facts.get("mutation") or ())
  if not changed:
    return []
  parts = [f"input {m['input']}: {m['changed']} of {m['size']} elements"
           + (f" ({m['zeroed']} now zero)" if m.get("zeroed") else "")
           for m in changed]
  return [Candidate(
      "input_mutation", 0.99,
      "the KUT changed its inputs in place (bits after the call differ from "
      "before it): " + "; ".join(parts) + ". A reference run after it on the "
      "same buffers sees the changed inputs", {"inputs": changed})]


def _held(differ: int, held: int, stale_words: str, nondet_words: str,
          params: dict) -> list[Candidate]:
  """``stale`` when another call's bits fill the differing elements, else
  ``nondeterminism``."""
  if held >= STALE_SHARE * differ and held >= min(MIN_PATTERN, differ):
    return [Candidate("stale", 0.97, stale_words, params)]
  return [Candidate("nondeterminism", 0.99, nondet_words,
                    {"differing": differ})]


def _repeat(out: Mapping[str, Any]) -> list[Candidate]:
  rep = out.get("repeat")
  if not rep or not rep["changed"]:
    return []
  changed, prev = int(rep["changed"]), int(rep["from_previous"])
  return _held(
      changed, prev,
      f"a second call on identical inputs, after a call on other inputs, "
      f"returned that other call's bits at {prev} elements "
      f"({rep['rows_from_previous']} of {rep['rows']} rows): an earlier "
      "call's values, not this call's",
      f"two KUT calls on identical inputs differ at {changed} elements "
      f"({prev} of them hold an intervening call's values)",
      {"elements": prev, "rows": int(rep["rows_from_previous"]),
       "source": "previous call"})


def _reuse(out: Mapping[str, Any]) -> list[Candidate]:
  rep = out.get("reuse")
  if not rep or not rep["differ"]:
    return []
  differ, old = int(rep["differ"]), int(rep["from_earlier"])
  return _held(
      differ, old,
      f"new values written into the input's own buffer (same address) "
      f"gave back the previous call's bits at {old} elements "
      f"({rep['rows_from_earlier']} of {rep['rows']} rows) instead of what "
      "the same values in a buffer of their own give: a result kept for "
      "the address, and training reuses its buffers every step",
      f"the same inputs in two buffers give results that differ at "
      f"{differ} elements",
      {"elements": old, "rows": int(rep["rows_from_earlier"]),
       "source": "previous call at the same address"})


def _history(out: Mapping[str, Any]) -> list[Candidate]:
  hist = out.get("history")
  if not hist or not hist.get("stale_rows"):
    return []
  n, rows = int(hist["stale_rows"]), int(hist["rows"])
  if n < min(MIN_PATTERN, rows):
    return []
  return [Candidate(
      "stale", 0.96,
      f"{n} of {rows} output rows are bit-equal to the same rows of the "
      f"KUT's output at {hist['source']}, while the golden kernel's rows "
      "differ from those and the KUT's are wrong here: another call's "
      "values, not this call's", {"rows": n, "source": hist["source"]})]


def _insensitive(out: Mapping[str, Any]) -> list[Candidate]:
  ins = out.get("insensitive")
  if not ins:
    return []
  moved, still = int(ins["moved"]), int(ins["still"])
  elsewhere = int(ins.get("elsewhere", 0))
  if (still < MIN_PATTERN or still < INSENSITIVE_SHARE * moved
      or elsewhere > INSENSITIVE_SHARE * still):
    return []
  what = ("none of them changed: a constant, cached or fallback result"
          if still == moved else "the output ignores part of its input")
  return [Candidate(
      "input_insensitive", 0.9 + 0.09 * still / max(moved, 1),
      f"one input element per row moved: {still} of {moved} output elements "
      f"({_pct(still / max(moved, 1))}) that the float64 reference moves by "
      f"more than 1/8 of their size stayed bit-identical; {what}",
      {"still": still, "moved": moved})]


def _batch(out: Mapping[str, Any]) -> list[Candidate]:
  bat = out.get("batch")
  if not bat:
    return []
  probes = [(k, bat[k]) for k in ("alone", "half")
            if k in bat and bat[k]["differ"]]
  if not probes:
    return []
  name, worst = max(probes, key=lambda kv: kv[1]["rms"])
  ulps = max(p["max_ulps"] for _, p in probes)
  noise = bat.get("noise_rms")
  ratio = (worst["rms"] / noise if noise else None)
  beyond = ratio is not None and ratio > REORDERING_ENVELOPE
  what = ("row 0 computed alone" if name == "alone" else
          f"the first {worst['rows']} rows computed as a batch")
  floor = ("" if ratio is None else
           f"; RMS difference {worst['rms']:.3g}, {ratio:.3g}x the golden "
           "kernel's noise floor")
  return [Candidate(
      "batch_variance", 0.95,
      f"{what} differs from the same rows of the {bat['rows']}-row batch at "
      f"{worst['differ']} of {worst['n']} elements, up to {ulps} ulps{floor}"
      ": a row's result depends on the rest of the batch",
      {"max_ulps": ulps, "rms": worst["rms"], "noise_ratio": ratio,
       "verdict": "fail" if beyond else "warn"})]


def invariance_candidates(facts: Mapping[str, Any], output: int = 0
                          ) -> list[Candidate]:
  """The invariance models the facts of one record satisfy, best first.

  Args:
    facts: a record's invariance facts (``invariance_probe``'s result, or
      the record's ``"invariance"`` entry): ``{"mutation": [...],
      "outputs": [{"repeat", "insensitive", "batch", "history"}]}``.
    output: which output the record is of (a backward site with several
      cotangents has one record per cotangent).

  Returns:
    Candidates (``stale``, ``input_mutation``, ``input_insensitive``,
    ``nondeterminism``, ``batch_variance``), highest confidence first.
  """
  outs = facts.get("outputs") or ()
  out = outs[output] if output < len(outs) else {}
  cands = (_mutation(facts) + _repeat(out) + _reuse(out) + _history(out)
           + _insensitive(out) + _batch(out))
  return sorted(cands, key=lambda c: -c.confidence)


def _worse(a: str, b: str) -> str:
  return a if _ORDER[a] >= _ORDER[b] else b


def with_invariance(diag: Diagnosis, facts: Mapping[str, Any],
                    output: int = 0) -> Diagnosis:
  """A signature's diagnosis with the invariance models folded in.

  A stale, mutating or input-insensitive KUT is the primary cause (verdict
  ``fail``) and the signature's model the secondary one (none when it was
  ``exact``). ``batch_variance`` is the primary cause when the signature
  says ``exact`` or ``reordering`` or a milder verdict than its own, else
  the secondary one (when there is none yet); its verdict (``warn``
  within the reordering envelope, ``fail`` beyond) counts either way.
  ``nondeterminism`` takes the place of a passing signature.

  Args:
    diag: the signature's :class:`Diagnosis`.
    facts: the record's invariance facts.
    output: the output index of the record.

  Returns:
    The :class:`Diagnosis` to record (``diag`` itself when no invariance
    model holds).
  """
  cands = invariance_candidates(facts, output)
  if not cands:
    return diag
  own = Candidate(diag.model, diag.confidence, diag.evidence, diag.params)
  keep = tuple(cands) + tuple(diag.candidates or (own,))
  faults = [c for c in cands if c.model in INVARIANCE_FAULTS]
  if faults:
    top = faults[0]
    second = None if diag.model == "exact" else own
    return Diagnosis(top.model, top.confidence, top.evidence, top.params,
                     keep, "fail", second)
  nondet = [c for c in cands if c.model == "nondeterminism"]
  if nondet and diag.verdict == "pass":
    top = nondet[0]
    return Diagnosis(top.model, top.confidence, top.evidence, top.params,
                     keep, "warn", None if diag.model == "exact" else own)
  bv = [c for c in cands if c.model == "batch_variance"]
  if not bv:
    return diag._replace(candidates=keep)
  top = bv[0]
  verdict = _worse(diag.verdict, top.params["verdict"])
  benign = diag.model.split(":")[0] in ("exact", "reordering")
  if benign or _ORDER[top.params["verdict"]] > _ORDER[diag.verdict]:
    return Diagnosis(top.model, top.confidence, top.evidence, top.params,
                     keep, verdict, None if diag.model == "exact" else own)
  second = diag.secondary if diag.secondary is not None else top
  return diag._replace(candidates=keep, verdict=verdict, secondary=second)
