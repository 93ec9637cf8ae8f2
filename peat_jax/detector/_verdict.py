"""A kernel under test's verdict over many (site, step) records."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence


from peat_jax.core import PeatError
from peat_jax.detector._facts import Diagnosis


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
  order = {"fail": 0, "warn": 1, "pass": 2}
  items.sort(key=lambda kv: (order[kv[1].verdict], -kv[1].confidence))
  worst = items[0][1].verdict
  deciding = tuple(k for k, d in items if d.verdict == worst)
  models: dict[str, int] = {}
  for _, d in items:
    models[d.model] = models.get(d.model, 0) + 1
  top = ", ".join(f"{m} x{c}" for m, c in sorted(
      models.items(), key=lambda mc: -mc[1]))
  summary = (f"{worst}: {len(deciding)} of {len(items)} records decided it "
             f"(diagnoses: {top})")
  return Verdict(worst, deciding, models, summary)
