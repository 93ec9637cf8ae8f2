"""One call's diagnosis, as playback makes it: :func:`diagnose_call`.

Where a user holds a kernel call's inputs (a unit test, a captured site,
a fuzz variant), the Detector can do more than read the output: the
triage screen clears rounding noise, and a flagged record is decomposed
and explained by the port probe, which reruns the golden computation in
float64 under the slips of the grammar (``peat.analyzer.port_probe``)
and names the one that reproduces the KUT's output.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.core import PeatError
from peat_jax.detector.facts import CONFIG, DetectorConfig, Diagnosis
from peat_jax.detector.hypotheses._detect import detect
from peat_jax.detector.hypotheses._triage import triage


def call_template(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
  """The recorded form of a composite call: ``(treedef, leaves,
  is_array)`` with the array leaves left out (``kernels.kut.recording``'s
  template), and the array leaves in call order."""
  leaves, treedef = jax.tree.flatten((tuple(args), dict(kwargs)))
  is_array = tuple(isinstance(x, (jax.Array, np.ndarray)) for x in leaves)
  arrays = [x for x, a in zip(leaves, is_array) if a]
  return (treedef, tuple(None if a else x for x, a in zip(leaves, is_array)),
          is_array), arrays


def _reference_fn(kernel: str, args, kwargs) -> tuple[Callable, list]:
  """The float64 reference of a call as a function of its array
  arguments, and those arguments."""
  if _analyzer.reference_traced(kernel, dict(kwargs)) is not None:
    return _analyzer.reference_fn(kernel, dict(kwargs)), list(args)
  template, arrays = call_template(args, kwargs)
  return _analyzer.reference_fn(kernel, {"template": template}), arrays


def diagnose_call(kernel: str, args: Sequence[Any],
                  kwargs: Mapping[str, Any] | None, test, golden, *,
                  reference=None, reduction: int | None = None,
                  dtype=None, config: DetectorConfig = CONFIG) -> Diagnosis:
  """The Detector's diagnosis of one kernel call's output.

  >>> diag = peat.detector.diagnose_call(
  ...     "layer_norm", (x, scale, bias), {"eps": 1e-6},
  ...     my_layer_norm(x, scale, bias), golden_layer_norm(x, scale, bias))
  >>> diag.model, diag.verdict  # doctest: +SKIP
  ('indexing', 'fail')

  Args:
    kernel: the site kind (``dot_general``, ``conv_general_dilated``, a
      composite kind of ``peat.REFERENCES``).
    args: the call's positional arguments, as the KUT received them
      (primitives: the operands).
    kwargs: its keyword arguments (primitives: the primitive's parameters,
      e.g. ``dimension_numbers``).
    test: the KUT's output.
    golden: the golden kernel's output on the same inputs.
    reference: their float64 reference (None: computed from the kind's
      reference on ``args``).
    reduction: the reduction length (None: not given to the Detector).
    dtype: the compared arrays' dtype when the Signature cannot tell.
    config: the Detector's thresholds.

  Returns:
    The :class:`~peat_jax.detector.Diagnosis`: the triage screen's where
    it clears the record, else the decomposed record's with the port
    probe (the slip search) as its context.

  Raises:
    PeatError: ``test`` and ``golden`` differ in shape or dtype, or the
      kind has no float64 reference.
  """
  kwargs = dict(kwargs or {})
  t, g = jax.numpy.asarray(test), jax.numpy.asarray(golden)
  if t.shape != g.shape or t.dtype != g.dtype:
    raise PeatError(f"the KUT's output is {t.dtype}{list(t.shape)}; expected "
                    f"{g.dtype}{list(g.shape)} like the golden kernel's. Fix: "
                    "return the golden output's shape and dtype")
  fn, arrays = _reference_fn(kernel, args, kwargs)
  r = np.asarray(fn(*arrays) if reference is None else reference,
                 np.float64)
  context = {"kernel": kernel, "reduction": reduction}
  sig, screen = jax.device_get(_analyzer.screen(t, g, r))
  found = triage(sig, screen, dtype=dtype, config=config)
  if found is not None:
    return found
  sig = _analyzer.with_decomposition(
      sig, jax.device_get(_analyzer.decomposition(t, g, r)))
  if _analyzer.needs_probe(sig):
    probe = _analyzer.port_probe(kernel, args, kwargs, t, g, r,
                                 reference_fn=fn, reference_args=arrays)
    if probe is not None:
      context["port"] = probe
  return detect(sig, dtype=dtype, context=context, config=config)
