"""Calibration of the invariance models: KUTs of known behaviour on
captured site inputs (``python -m peat_jax.tools.calibrate --invariance``).

Each case's golden kernel is wrapped into kernels under test that behave
in one known way beyond one call's values, probed like a playback site
(``peat_jax.analyzer.invariance_probe``) and diagnosed like a record
(``detect`` of the signature against golden, then ``with_invariance``):

| KUT | expected model |
| --- | --- |
| the golden kernel itself | ``exact``, or ``batch_variance`` where the golden kernel's own row 0 alone (or first half of the batch) differs bitwise from the same rows of the full batch (XLA:CPU's dot, layer norm and attention do on some shapes) |
| the native kernel (``default``), where the case has one | its model (``reordering`` or ``exact``) |
| last quarter of the rows: the previous call's values | ``stale`` |
| a result cached by the input's device address | ``stale`` |
| the first call's result for every input | ``input_insensitive`` |
| every second element of the last input axis ignored (a subsampled reduction; matmul) | ``input_insensitive`` |
| the right result, then its first input zeroed in place | ``input_mutation`` |
| the float64 reference rounded, below the full batch's rows (where the rows can be computed apart) | ``batch_variance`` |

The in-place write of ``input_mutation`` and the address cache need CPU
device buffers (``unsafe_buffer_pointer``); elsewhere they are skipped.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import core as _core
from peat_jax.detector.calibration import _calibration as _cal
from peat_jax.detector import facts as _facts
from peat_jax.detector import verdicts as _invariance
from peat_jax.core import PeatError


def _axes(case: _cal.CalibrationCase, inputs) -> tuple[list, list]:
  """Batch axes: the rows of the first input (and of q, k, v)."""
  rows = np.shape(inputs[0])[0]
  if case.kernel in ("matmul", "conv"):
    return [0] + [None] * (len(inputs) - 1), [0]
  return [0 if np.ndim(x) >= 2 and np.shape(x)[0] == rows else None
          for x in inputs], [0]


class _StaleRows:
  """The golden result with its last quarter of rows from the previous call."""

  def __init__(self, golden: Callable, inputs):
    self.golden = jax.jit(golden)
    self.prev = np.asarray(self.golden(*[jnp.asarray(x) * 0.5 + 0.25
                                         if jnp.issubdtype(
                                             jnp.asarray(x).dtype,
                                             jnp.floating) else x
                                         for x in inputs]))

  def __call__(self, *xs):
    out = np.array(self.golden(*xs))
    cut = out.shape[0] - max(out.shape[0] // 4, 1)
    fresh = out.copy()
    if self.prev.shape == out.shape:
      out[cut:] = self.prev[cut:]
    self.prev = fresh
    return jnp.asarray(out)


class _AddressCache:
  """A result kept for the first input's device address."""

  def __init__(self, golden: Callable):
    self.golden, self.cache = jax.jit(golden), {}

  def __call__(self, *xs):
    key = (xs[0].unsafe_buffer_pointer(), tuple(xs[0].shape))
    if key not in self.cache:
      self.cache[key] = self.golden(*xs)
    return self.cache[key]


class _Constant:
  """The first call's result, whatever the input."""

  def __init__(self, golden: Callable):
    self.golden, self.out = jax.jit(golden), None

  def __call__(self, *xs):
    if self.out is None:
      self.out = self.golden(*xs)
    return self.out


def _subsampled(golden: Callable) -> Callable:
  """Every second element of the last input axis of the first input
  dropped, the rest doubled: a matmul over half its reduction."""
  def kut(x, *rest):
    keep = (jnp.arange(x.shape[-1]) % 2 == 0).astype(x.dtype)
    return golden(x * keep * 2, *rest)
  return jax.jit(kut)


def _zeroing(golden: Callable) -> Callable:
  """The right result; then its first input's buffer set to zero."""
  g = jax.jit(golden)

  def kut(*xs):
    out = jax.block_until_ready(g(*xs))
    x = xs[0]
    ctypes.memset(x.unsafe_buffer_pointer(), 0, x.size * x.dtype.itemsize)
    return out
  return kut


def _batch_variant(golden: Callable, reference: Callable, rows: int
                   ) -> Callable:
  """Golden for the full batch, the rounded float64 reference below it."""
  g = jax.jit(golden)

  def kut(*xs):
    if np.shape(xs[0])[0] >= rows:
      return g(*xs)
    r = reference(*[np.asarray(x) for x in xs])
    return jnp.asarray(np.asarray(r).astype(np.asarray(xs[0]).dtype))
  return kut


def _cpu() -> bool:
  return jax.devices()[0].platform == "cpu"


def _own_batch_variance(golden: Callable, inputs, in_axes) -> bool | None:
  """Whether the golden kernel's own rows depend on the batch around them;
  None when its rows cannot be computed apart (an argument bound to the
  whole batch, e.g. a per-example mask)."""
  g = jax.jit(golden)
  full = np.asarray(g(*inputs))
  rows = np.shape(inputs[0])[0]
  variant = False
  for stop in (1, (rows + 1) // 2):
    if not 1 <= stop < rows:
      continue
    sub = [x if ax is None else np.asarray(x)[:stop]
           for x, ax in zip(inputs, in_axes)]
    part = np.asarray(g(*sub))
    if part.shape != full[:stop].shape:
      return None
    variant |= not np.array_equal(part, full[:stop])
  return variant


def behaviours(case: _cal.CalibrationCase, inputs, reference: Callable
               ) -> list[tuple[str, str, Callable]]:
  """(name, expected model, KUT) of one case (module docstring)."""
  g = case.golden_fn
  own = _own_batch_variance(g, inputs, _axes(case, inputs)[0])
  out = [("golden", "batch_variance" if own else "exact", jax.jit(g))]
  if case.native is not None and case.native_variants.get("default"):
    out.append(("native:default", case.native_variants["default"],
                case.native("default")))
  out += [("stale_rows", "stale", _StaleRows(g, inputs)),
          ("constant", "input_insensitive", _Constant(g))]
  if own is not None:  # rows that can be computed apart
    out.append(("batch_variant", "batch_variance",
                _batch_variant(g, reference, int(np.shape(inputs[0])[0]))))
  if case.kernel == "matmul":
    out.append(("subsampled", "input_insensitive", _subsampled(g)))
  if _cpu():
    out += [("address_cache", "stale", _AddressCache(g)),
            ("zeroing", "input_mutation", _zeroing(g))]
  return out


def run_invariance_calibration(cases: Sequence[_cal.CalibrationCase], *,
                               progress: Callable[[str], None] | None = None
                               ) -> _cal.CalibrationResult:
  """The invariance models' confusion matrix on captured site inputs.

  Args:
    cases: calibration cases (float32 inputs are used as given).
    progress: called with one line per case.

  Returns:
    A :class:`CalibrationResult` (origin ``invariance``; a ``stale``,
    ``input_mutation`` or ``input_insensitive`` case diagnosed ``exact`` or
    ``reordering`` is a miss, a golden or native case diagnosed with a
    fault, an invariance fault included, a false alarm).

  Raises:
    PeatError: no cases.
  """
  if not cases:
    raise PeatError("run_invariance_calibration needs at least one "
                    "CalibrationCase")
  records = []
  for case in cases:
    _core.release_compiled()  # many shapes in one process
    inputs = tuple(np.asarray(x) for x in case.inputs)
    g = np.asarray(jax.jit(case.golden_fn)(*inputs))
    ref_of = lambda *xs, c=case: np.asarray(_cal.reference_of(
        c, tuple(jnp.asarray(x) for x in xs)), np.float64)
    r = ref_of(*inputs)
    context = {"kernel": case.kernel, "reduction": case.reduction}
    in_axes, out_axes = _axes(case, inputs)
    beh = behaviours(case, inputs, ref_of)
    for name, expected, kut in beh:
      facts = _analyzer.invariance_probe(
          kut, inputs, reference=ref_of, golden=[g], in_axes=in_axes,
          out_axes=out_axes)
      t = np.asarray(kut(*[jnp.array(x, copy=True) for x in inputs]))
      diag = _cal.diagnose(t, g, r, context)  # triaged, as in playback
      out = facts["outputs"][0] if facts["outputs"] else {}
      diag = _invariance.with_invariance(
          diag, {"mutation": facts["mutation"], "outputs": [out]})
      records.append(_cal.CalibrationRecord(
          case.kernel, case.source, g.dtype.name, "invariance", name, expected,
          diag.model, float(diag.confidence), diag.verdict, diag.evidence,
          secondary=diag.secondary.model if diag.secondary else ""))
    if progress:
      progress(f"{case.kernel:<10s} {case.source}: {len(beh)} behaviours")
  result = _cal.summarize(records)
  faults = [r for r in records if r.expected in _invariance.INVARIANCE_FAULTS]
  benign = [r for r in records if r.expected in _cal.BENIGN]
  bad = set(_invariance.INVARIANCE_FAULTS) | set(_facts.FAULT_MODELS)
  return result._replace(
      false_alarms=sum(r.predicted in bad for r in benign),
      benign_cases=len(benign),
      misses=sum(r.predicted in _cal.BENIGN for r in faults),
      fault_cases=len(faults))
