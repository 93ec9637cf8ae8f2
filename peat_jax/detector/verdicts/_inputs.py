"""A record's name from hypotheses fitted on its own inputs.

The Detector reads one record's error signature; on a fuzz variant the
call's inputs are at hand as well, and the analyzer's shape probe
(``peat.analyzer.shape_probe``) says which shape-gated slip (a dropped
or repeated element, a narrow accumulator, a wrong mean) the KUT's
output matches on them. :func:`named_by_inputs` turns a probe that
explains the output into the record's diagnosis: a hypothesis that
reproduces the KUT's output from its inputs is a stronger reading than
the signature's, and a slip that the KUT shows beyond the golden
kernel's noise (the probe's precondition) is a wrong result: ``fail``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping


def named_by_inputs(diagnosis: Mapping[str, Any],
                    found: Mapping[str, Any] | None,
                    port: Mapping[str, Any] | None = None) -> dict:
  """The diagnosis record after the shape probe.

  Args:
    diagnosis: the record's diagnosis (``diagnosis_record``).
    found: the shape probe's answer, or None.
    port: the record's port probe answer, if any: an explaining one with
      a lower median ratio keeps the diagnosis.

  Returns:
    The diagnosis unchanged, or with the probe's ``model``, verdict
    ``fail``, its evidence, ``named_by: "inputs"`` and the signature's
    reading in ``signature_model`` / ``signature_verdict``.
  """
  out = dict(diagnosis)
  if not found or not found.get("explains"):
    return out
  if port and port.get("explains") and float(port.get(
      "ratio", math.inf)) <= float(found.get("ratio", math.inf)):
    return out
  out.update(
      model=found["model"], verdict="fail", named_by="inputs",
      signature_model=diagnosis.get("model"),
      signature_verdict=diagnosis.get("verdict"),
      evidence=(f"{found['evidence']}; fitted on the call's own inputs "
                f"(the signature alone read {diagnosis.get('model')}, "
                f"{diagnosis.get('verdict')})"))
  return out
