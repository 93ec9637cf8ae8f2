"""The Detector's hypotheses, as data.

Every error model the Detector names is one or more hypotheses here: what
it predicts and the statistic that accepts it (the test function's
docstring), the thresholds it reads (from its source: every
``cfg.<name>``), where it applies, and its role:

* ``fault``: a sparse or structured fault; it decides the verdict (fail)
  and ranks first, by :data:`FAULT_TIERS` (exact relations before
  patterns before catch-alls);
* ``base``: the dense error of the kernel's arithmetic (another order, a
  rounding, a port's constant or form), ranked in :data:`HYPOTHESES`
  order; under a fault it is the secondary cause.

Scopes: ``plain`` hypotheses read a record without a decomposition (no
reference), ``any`` hypotheses read any record, ``residual`` ones the
outliers of a decomposed record over its fitted base.
:func:`hypotheses_table` renders the table docs/detector.md shows.
"""

from __future__ import annotations

import inspect
import re
from typing import Callable, NamedTuple

from peat_jax.detector.hypotheses import _h_base as base
from peat_jax.detector.hypotheses import _h_port as port
from peat_jax.detector.hypotheses import _h_residual as residual
from peat_jax.detector.hypotheses import _h_whole as whole
from peat_jax.detector.facts import Found
from peat_jax.detector.facts import Facts


class Hypothesis(NamedTuple):
  """One hypothesis of the Detector.

  Attributes:
    models: the error models it can name.
    role: ``fault`` or ``base``.
    scope: ``plain``, ``any`` or ``residual``.
    test: ``test(facts) -> [Found]`` (empty: not accepted).
  """

  models: str
  role: str
  scope: str
  test: Callable[[Facts], list[Found]]

  @property
  def name(self) -> str:
    """The test function's name."""
    return self.test.__name__

  @property
  def predicts(self) -> str:
    """What it predicts and how it is accepted: its docstring, one
    paragraph."""
    return " ".join((inspect.getdoc(self.test) or "").split())

  @property
  def thresholds(self) -> tuple[str, ...]:
    """The config thresholds its test reads (``cfg.<name>``)."""
    src = inspect.getsource(self.test)
    return tuple(sorted(set(re.findall(r"cfg\.([a-z_0-9]+)", src))))


_F, _B = "fault", "base"
#: Every hypothesis; bases in their ranking order (most specific first).
HYPOTHESES = (
    # Exact traces on any record, and the plain record's faults.
    Hypothesis("saturation / nan / bitflip", _F, "any", whole.nonfinite),
    Hypothesis("indexing", _F, "any", whole.transposed),
    Hypothesis("indexing", _F, "any", whole.shifted),
    Hypothesis("indexing", _F, "any", whole.permuted),
    Hypothesis("ftz", _F, "any", whole.tiny_flush),
    Hypothesis("stuck_at", _F, "any", whole.stuck),
    Hypothesis("stuck_at", _F, "any", whole.stuck_dense),
    Hypothesis("bitflip / random_value", _F, "any", whole.sparse),
    Hypothesis("saturation", _F, "plain", whole.clipped),
    Hypothesis("indexing", _F, "plain", whole.edge),
    Hypothesis("scale", _F, "plain", whole.scale),
    Hypothesis("ftz", _F, "plain", whole.flushed),
    Hypothesis("zero", _F, "plain", whole.zero),
    Hypothesis("lane", _F, "plain", whole.lane),
    Hypothesis("lane", _F, "plain", whole.tiles),
    # Faults that move every element of a decomposed record.
    Hypothesis("scale / parameter", _F, "residual", whole.scale_fit),
    Hypothesis("indexing", _F, "residual", whole.moved_beyond),
    Hypothesis("indexing", _F, "residual", whole.permuted_outliers),
    # Faults on the residual over the fitted base.
    Hypothesis("ftz", _F, "residual", residual.flush_in_format),
    Hypothesis("saturation", _F, "residual", residual.overflow),
    Hypothesis("nan", _F, "residual", residual.nonfinite),
    Hypothesis("bitflip", _F, "residual", residual.bitflip),
    Hypothesis("saturation", _F, "residual", residual.clipped),
    Hypothesis("lane", _F, "residual", residual.lane),
    Hypothesis("zero", _F, "residual", residual.zero),
    Hypothesis("lane", _F, "residual", residual.tiles),
    Hypothesis("indexing", _F, "residual", residual.tile_edge),
    Hypothesis("stuck_at", _F, "residual", residual.stuck),
    Hypothesis("random_value", _F, "residual", residual.random_values),
    Hypothesis("unknown", _F, "residual", residual.unexplained),
    # The base, most specific first.
    Hypothesis("precision / accumulation", _B, "any", base.probed_precision),
    Hypothesis("indexing / parameter / scale / approximation", _B, "any",
               port.probed_form),
    Hypothesis("precision", _B, "any", base.rounded_output),
    Hypothesis("truncation", _B, "any", base.truncation_vs_reference),
    Hypothesis("truncation", _B, "any", base.truncation_by_direction),
    Hypothesis("precision / accumulation", _B, "any", base.narrow_outputs),
    Hypothesis("reordering", _B, "any", base.within_envelope),
    Hypothesis("reordering", _B, "any", base.within_floor),
    Hypothesis("reordering", _B, "any", base.long_sum_order),
    Hypothesis("precision", _B, "any", base.truncated_operands),
    Hypothesis("accumulation", _B, "any", base.accumulation_level),
    Hypothesis("precision", _B, "any", base.input_level),
    Hypothesis("parameter / scale", _B, "any", port.row_scale),
    Hypothesis("approximation / unknown", _B, "any", port.value_function),
    Hypothesis("approximation / unknown", _B, "any", port.biased_error),
    Hypothesis("unknown", _B, "any", port.probed_dense),
    Hypothesis("reordering", _B, "any", base.small_median),
)

#: A fault's rank: exact relations, then patterns, then the catch-alls
#: (one bit forced one way is the fault, the lane it sits in its place; a
#: NaN among a few flipped elements is the flip's; values permuted among
#: the outliers, their error gone when sorted, are no flips, and golden's
#: own values exchanged between whole tiles are the tiles' indexing, not
#: their corruption).
FAULT_TIERS = {"saturation": 0, "scale": 1, "parameter": 1,
               "indexing:shift": 2, "indexing:transpose": 2,
               "indexing:swap": 2, "ftz": 3,
               "stuck_at": 4, "lane:stride": 5, "zero": 6,
               "indexing:permutation": 7, "lane:tile": 8,
               "indexing:tile_edge": 9, "bitflip": 10, "indexing": 11,
               "nan": 12, "random_value": 13, "unknown": 14}


def applicable(f: Facts) -> tuple[Hypothesis, ...]:
  """The hypotheses that read a record: ``any`` always, ``plain`` without
  a decomposition, ``residual`` with one."""
  scope = "residual" if f.dec else "plain"
  return tuple(h for h in HYPOTHESES if h.scope in ("any", scope))


def hypotheses_table() -> str:
  """The Markdown table of every hypothesis: the models it names, its
  role and scope, what it predicts and the thresholds it reads
  (docs/detector.md holds it, generated)."""
  rows = ["| hypothesis | names | role | reads | predicts and accepts | "
          "thresholds |", "| --- | --- | --- | --- | --- | --- |"]
  for h in HYPOTHESES:
    reads = {"plain": "no decomposition", "any": "any record",
             "residual": "the residual"}[h.scope]
    shown = ", ".join(f"`{t}`" for t in h.thresholds) or "-"
    rows.append(f"| `{h.test.__module__.rsplit('.', 1)[-1]}.{h.name}` | "
                f"{h.models} | {h.role} | {reads} | "
                f"{h.predicts.replace('|', '/')} | {shown} |")
  return "\n".join(rows)
