"""One kernel output against the golden kernel, by the Detector's rule.

:func:`assert_matches_golden` is the check of an exported regression test
(``peat.export_repro``): the Analyzer's signature of the KUT's output
against the golden kernel's and their float64 reference, the Detector's
diagnosis of it, and an assertion that the verdict stays below
``fail_on``. A correct kernel of another summation order passes (its error
is rounding noise within the golden kernel's envelope); a kernel whose
error the Detector names as a fault or a precision loss fails, with the
diagnosis in the message.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import detector as _detector
from peat_jax.core import PeatError
from peat_jax.profiler.fuzz import load_repro as load_repro  # noqa: F401

_ORDER = {"pass": 0, "warn": 1, "fail": 2}


class GoldenMismatchError(AssertionError):
  """The KUT's output is not within the golden kernel's noise floor.

  Attributes:
    diagnosis: the Detector's :class:`peat_jax.Diagnosis`.
  """
  # Tracebacks and pytest name it where users import it from.
  __module__ = "peat_jax.testing"

  def __init__(self, message: str, diagnosis: Any):
    super().__init__(message)
    self.diagnosis = diagnosis


def assert_matches_golden(test, golden, reference=None, *,
                          context: Mapping[str, Any] | None = None,
                          fail_on: str = "warn",
                          call: tuple | None = None) -> Any:
  """Asserts that a KUT's output is rounding noise against the golden's.

  >>> peat.testing.assert_matches_golden(my_softmax(x), jax.nn.softmax(x),
  ...     peat.reference_softmax(x),
  ...     context={"kernel": "softmax", "reduction": x.shape[-1]})  # doctest: +SKIP

  Args:
    test: the KUT's output.
    golden: the golden kernel's output on the same inputs.
    reference: their float64 reference (None: the golden kernel is the
      reference; the noise floor is then unknown and only exact or tiny
      differences pass).
    context: the Detector's context (``{"kernel", "reduction"}``: the
      reduction length sets the accumulation level a correct kernel may
      reach).
    fail_on: ``"warn"`` (default: a precision loss fails too) or
      ``"fail"`` (only faults fail).
    call: ``(kernel, args, kwargs)`` of the call that made ``test``: the
      Detector then searches the slip grammar on its inputs
      (``peat.detector.diagnose_call``) and the message names the slip
      (an operand read in the wrong place, another constant, ...).

  Returns:
    The :class:`peat_jax.Diagnosis` (verdict below ``fail_on``).

  Raises:
    GoldenMismatchError: the verdict reaches ``fail_on``; the message
      names the error model, the evidence and the noise ratio.
    PeatError: shapes or dtypes of test and golden differ, a bad
      ``fail_on``.
  """
  if fail_on not in ("warn", "fail"):
    raise PeatError(f"fail_on must be 'warn' or 'fail'; got {fail_on!r}")
  t, g = np.asarray(test), np.asarray(golden)
  if t.shape != g.shape or t.dtype != g.dtype:
    raise PeatError(f"the KUT's output is {t.dtype}{list(t.shape)}; expected "
                    f"{g.dtype}{list(g.shape)} like the golden kernel's")
  ref = None if reference is None else np.asarray(reference, np.float64)
  sig = _analyzer.analyze(t, g, ref)
  if call is not None and ref is not None:
    kernel, args, kwargs = call
    diag = _detector.diagnose_call(
        kernel, args, kwargs, t, g, reference=ref,
        reduction=dict(context or {}).get("reduction"))
  else:
    diag = _detector.detect(sig, context=dict(context or {}))
  if _ORDER[diag.verdict] >= _ORDER[fail_on]:
    ratio = float(np.asarray(sig.noise_ratio))
    raise GoldenMismatchError(
        f"the KUT's output is not the golden kernel's up to rounding: "
        f"{diag.model} ({diag.verdict}); {diag.evidence}; KUT/golden error "
        f"against float64 = {ratio:.3g} (shape {list(t.shape)}, "
        f"{t.dtype})", diag)
  return diag
