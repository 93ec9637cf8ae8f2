"""Detector calibration: errors of known cause -> confusion matrix.

A calibration *case* is one kernel call on realistic inputs (typically site
inputs captured from a model's training with :func:`peat_jax.tap`), its
golden function and, where one exists, a native kernel under test. Errors of
known cause come from three sources:

* tensor injectors (``peat.inject``) applied to the golden output;
* computation injectors (``peat.injecting_kernel``: accumulation in a narrow
  format, another summation order, a key-dependent order) on GEMM kernels;
* the native kernels' variants (``peat_jax.kernels.native``), whose expected
  error model is ``EXPECTED_ERROR_MODEL``.

Each produced output is analyzed against the golden output with the float64
reference, diagnosed, and counted in a confusion matrix.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.detector import hypotheses as _detector
from peat_jax import injectors as _injectors
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.detector import facts as _facts
from peat_jax.detector import hypotheses as _triage

#: Predicted models that count as "no fault" for miss / false-alarm rates.
BENIGN = ("exact", "reordering")


@dataclasses.dataclass(frozen=True)
class CalibrationCase:
  """One kernel call on realistic inputs.

  Attributes:
    kernel: ``matmul``, ``conv``, ``softmax``, ``layer_norm``,
      ``attention`` or ``gelu``.
    source: where the inputs came from (e.g. a site name).
    golden_fn: ``(*inputs) -> output`` with golden JAX kernels.
    inputs: the inputs (float arrays; masks/labels allowed).
    reduction: reduction length of the kernel (K of a matmul, D of a
      softmax), given to the Detector as context.
    native: ``variant -> callable(*inputs)`` for native KUTs, or None.
    native_variants: ``{variant: expected model}`` for ``native``.
    reference_fn: the float64 reference of the call (None: ``golden_fn``
      run on float64 copies, right when it has no dtype of its own
      inside; a bf16 model's kernels cast to float32 inside and need
      theirs, e.g. ``peat.analyzer.reference_rope``).
  """

  kernel: str
  source: str
  golden_fn: Callable[..., jax.Array]
  inputs: tuple
  reduction: int | None = None
  native: Callable[[str], Callable[..., jax.Array]] | None = None
  native_variants: Mapping[str, str] = dataclasses.field(default_factory=dict)
  reference_fn: Callable[..., Any] | None = None


class CalibrationRecord(NamedTuple):
  """One produced error and its diagnosis."""

  kernel: str
  source: str
  dtype: str
  origin: str  # "inject", "compute" or "native"
  error: str  # injector name / variant
  expected: str
  predicted: str
  confidence: float
  verdict: str
  evidence: str
  base: str = ""  # composed cases: the benign base's own model
  secondary: str = ""  # the diagnosis' secondary cause, if any


class CalibrationResult(NamedTuple):
  """Confusion matrix and rates of a calibration run."""

  records: tuple[CalibrationRecord, ...]
  labels: tuple[str, ...]
  confusion: np.ndarray  # [expected, predicted] counts
  accuracy: float
  per_model: Mapping[str, float]
  false_alarms: int
  benign_cases: int
  misses: int
  fault_cases: int

  def table(self) -> str:
    """The confusion matrix as fixed-width text (rows expected)."""
    short = [l.replace("precision:", "prec:").replace("accumulation:", "acc:")
             for l in self.labels]
    width = max(len(s) for s in short) + 1
    head = " " * width + " ".join(f"{i:>3d}" for i in range(len(short)))
    lines = [head]
    for i, s in enumerate(short):
      row = " ".join(f"{int(c):>3d}" if c else "  ." for c in self.confusion[i])
      lines.append(f"{s:<{width}}{row}   {i:>2d} {self.per_model.get(self.labels[i], float('nan')):.0%}"
                   if self.confusion[i].sum() else f"{s:<{width}}{row}   {i:>2d}")
    return "\n".join(lines)

  def summary(self) -> str:
    """One paragraph of rates."""
    return (f"{len(self.records)} cases, top-1 accuracy {self.accuracy:.1%}; "
            f"false alarms {self.false_alarms}/{self.benign_cases} "
            f"(exact/reordering diagnosed as a fault); misses "
            f"{self.misses}/{self.fault_cases} (a fault diagnosed as "
            "exact/reordering)")


#: Bins of stated confidence for the reliability table.
RELIABILITY_BINS = (0.0, 0.7, 0.8, 0.9, 0.95, 1.0)


def reliability(records: Sequence[CalibrationRecord],
                correct: Callable[[CalibrationRecord], bool],
                bins: Sequence[float] = RELIABILITY_BINS
                ) -> list[tuple[float, float, int, float, float]]:
  """Stated confidence against observed accuracy.

  Args:
    records: calibration records.
    correct: whether a record's diagnosis is right (``is_correct``,
      ``family_correct``).
    bins: edges of the confidence bins (the last bin includes 1.0).

  Returns:
    ``(lo, hi, count, mean stated confidence, observed accuracy)`` per
    non-empty bin.
  """
  out = []
  for i, (lo, hi) in enumerate(zip(bins[:-1], bins[1:])):
    last = i == len(bins) - 2
    rows = [r for r in records
            if lo <= r.confidence and (r.confidence < hi or
                                       (last and r.confidence <= hi))]
    if rows:
      out.append((lo, hi, len(rows),
                  float(np.mean([r.confidence for r in rows])),
                  sum(map(correct, rows)) / len(rows)))
  return out


def reliability_table(records: Sequence[CalibrationRecord],
                      correct: Callable[[CalibrationRecord], bool]) -> str:
  """:func:`reliability` as a Markdown table."""
  lines = ["| stated confidence | cases | mean stated | observed accuracy |",
           "| --- | ---: | ---: | ---: |"]
  for lo, hi, n, stated, seen in reliability(records, correct):
    lines.append(f"| [{lo:.2f}, {hi:.2f}{']' if hi >= 1.0 else ')'} | {n} | "
                 f"{stated:.3f} | {seen:.1%} |")
  return "\n".join(lines)


def injections(rng: np.random.Generator, shape: tuple[int, ...], dtype: str
                ) -> list[tuple[str, str, dict[str, Any]]]:
  """(expected model, injector name, params) for tensor injections.

  Bit positions are drawn in the upper mantissa, exponent and sign (a flip
  in the lowest mantissa bits is rounding-sized and, by design, passes).
  """
  size = int(np.prod(shape))
  cols = shape[-1]
  fmt = _core.format_of(dtype)  # sign bit, first exponent bit:
  sign, exp0 = fmt.bits - 1, fmt.mantissa_bits
  out = [
      ("exact", "exact", {}),
      ("bitflip", "bitflip", {"count": int(rng.integers(1, 6)),
                              "bits": int(rng.integers(max(3, exp0 - 9),
                                                       sign))}),
      ("bitflip", "bitflip", {"count": 2, "field_weights": None}),
      ("stuck_at", "stuck_at", {"bit": int(rng.integers(exp0 // 2, exp0)),
                                "value": 1, "share": 0.2}),
      ("stuck_at", "stuck_at", {"bit": int(rng.integers(exp0, sign - 1)),
                                "value": 0, "share": 0.3}),
      ("random_value", "random_value", {"count": int(rng.integers(2, 8))}),
      ("zero", "zero", {"mode": "elements", "count": 20}),
      ("nan", "nan", {"count": 3, "kind": "nan"}),
      ("scale", "scale", {"factor": float(rng.choice([0.5, 0.125, 3.0]))}),
      # Outputs rounded toward zero into a coarser format: that format's
      # precision, the rounding mode in its evidence (docs/detector.md);
      # ``truncation`` is a result rounded toward zero in its own format.
      ("precision:bf16", "truncation", {"fmt": "bf16"}),
      ("ftz", "ftz", {"fmt": "fp16"}),
  ]
  # Rounding into a format at least as precise as the data changes almost
  # nothing (only out-of-range values): such a "precision loss" is no case.
  own = _core.format_of(dtype).unit_roundoff
  for fmt in ("bf16", "fp16", "fp8_e4m3"):
    if _facts.UNIT_ROUNDOFF[fmt] > own:
      out.append((f"precision:{fmt}", f"precision:{fmt}", {}))
  if len(shape) >= 2 and shape[-2] >= 8 and cols >= 8:
    out.append(("zero", "zero", {"mode": "rows", "count": 1}))
  if len(shape) >= 2 and shape[-2] >= 16 and cols >= 16:
    out.append(("zero", "zero", {"mode": "tiles", "count": 1}))
  if cols >= 64 and size >= 4 * cols:
    out.append(("lane", "lane", {"stride": 32, "lane": int(rng.integers(32)),
                                 "axis": -1, "effect": "zero"}))
    out.append(("lane", "lane", {"stride": 32, "lane": int(rng.integers(32)),
                                 "axis": -1, "effect": "scale",
                                 "factor": 3.0}))
  if cols >= 16:
    out.append(("indexing", "indexing", {"mode": "shift", "shift": 1}))
  out.append(("indexing", "indexing", {"mode": "permutation", "count": 64}))
  return out


def _uint(dtype):
  return {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[jnp.dtype(dtype).itemsize]


def diagnose(t, g, r, context, repeat=None, dtype=None, full: bool = False,
             probe=None):
  """The Detector's diagnosis of one produced output, as playback makes
  it: the triage screen, and for a record it flags the decomposition, the
  port probe and ``detect``; with ``full``, ``(diagnosis, signature)``
  (the whole Signature, decomposed, either way).

  ``probe`` is ``(kind, args, kwargs, reference_fn)`` of the call: when
  the signature calls for it (peat.analyzer.needs_probe), the port probe
  runs as in playback and its result is the context's ``port``.
  """
  if r is None or repeat is not None:
    sig = _analyzer.analyze(t, g, r)
  else:
    sig, screen = jax.device_get(_analyzer.screen(t, g, r))
    diag = _triage.triage(sig, screen, dtype=dtype)
    if diag is None or full:
      sig = _analyzer.with_decomposition(
          sig, jax.device_get(_analyzer.decomposition(t, g, r)))
    if diag is not None:
      return (diag, sig) if full else diag
  rep = None if repeat is None else _analyzer.analyze(repeat, t)
  if probe is not None and r is not None and _analyzer.needs_probe(sig):
    kind, args, kwargs, fn = probe
    found = _analyzer.port_probe(kind, args, kwargs, t, g, r,
                                 reference_fn=fn)
    if found is not None:
      context = {**context, "port": found}
  diag = _detector.detect(sig, repeat=rep, dtype=dtype, context=context)
  return (diag, sig) if full else diag


def probe_of(case: "CalibrationCase", inputs: tuple) -> tuple:
  """``diagnose``'s ``probe`` argument for a case on ``inputs``."""
  keywords = dict(getattr(case.golden_fn, "keywords", None) or {})
  return (case.kernel, inputs, keywords,
          lambda *a: reference_of(case, a))


def reference_of(case: CalibrationCase, inputs: tuple):
  """The float64 reference of a case's golden function on ``inputs``."""
  return _analyzer.reference(case.reference_fn or case.golden_fn, *inputs)


def bit_equal(a, b) -> bool:
  """Whether two arrays of one float dtype are bitwise equal."""
  return bool(jnp.all(lax.bitcast_convert_type(a, _uint(a.dtype)) ==
                      lax.bitcast_convert_type(b, _uint(b.dtype))))


def cast_inputs(inputs, dtype) -> tuple:
  """A case's inputs as device arrays, the floating-point ones cast to
  ``dtype`` (integer inputs, e.g. labels, kept)."""
  dt = jnp.dtype(dtype)
  return tuple(jnp.asarray(x).astype(dt)
               if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
               else jnp.asarray(x) for x in inputs)


def run_calibration(cases: Sequence[CalibrationCase], *,
                    dtypes: Sequence[str] = ("float32",), seeds: Sequence[int] = (0,),
                    native: bool = True, compute: bool = True,
                    progress: Callable[[str], None] | None = None,
                    ) -> CalibrationResult:
  """Produces errors of known cause on each case and diagnoses them.

  Args:
    cases: kernel calls on realistic inputs.
    dtypes: input dtypes to run each case in (``float32``, ``bfloat16``,
      ``float16``); native variants and computation injectors run in float32.
    seeds: one round of tensor injections per seed.
    native: include the native kernel variants.
    compute: include the computation injectors on GEMM kernels.
    progress: called with one line per case.

  Returns:
    A :class:`CalibrationResult`.

  Raises:
    PeatError: no cases; no dtypes, or one outside CALIBRATION_DTYPES.
  """
  if not cases:
    raise PeatError("run_calibration needs at least one CalibrationCase")
  check_dtypes(dtypes)
  records: list[CalibrationRecord] = []

  def add(case, dtype, origin, error, expected, diag):
    records.append(CalibrationRecord(
        case.kernel, case.source, dtype, origin, error, expected, diag.model,
        float(diag.confidence), diag.verdict, diag.evidence))

  for case in cases:
    _core.release_compiled()  # thousands of shapes in one process
    context = {"kernel": case.kernel, "reduction": case.reduction}
    for dtype in dtypes:
      inputs = cast_inputs(case.inputs, dtype)
      g = jax.jit(case.golden_fn)(*inputs)
      r = reference_of(case, inputs)
      probe = probe_of(case, inputs)
      for seed in seeds:
        rng = np.random.default_rng(
            [seed, len(records), int(np.prod(g.shape))])
        for k, (expected, name, params) in enumerate(
            injections(rng, tuple(g.shape), dtype)):
          key = jax.random.PRNGKey(1000 * seed + k)
          t = _injectors.inject(name, key, g, **params)
          if bit_equal(t, g):
            expected = "exact"  # the fault hit values it does not change
          add(case, dtype, "inject", f"{name} {params}", expected,
              diagnose(t, g, r, context, dtype=jnp.dtype(dtype), probe=probe))
      if dtype != "float32":
        continue
      if compute and case.kernel in ("matmul", "conv"):
        for expected, name, params in (
            ("accumulation:fp16", "accumulation:fp16", {"chunk": 1}),
            ("accumulation:bf16", "accumulation:bf16", {"chunk": 1}),
            ("reordering", "reordering", {"blocks": 4}),
            ("nondeterminism", "nondeterminism", {"blocks": 8})):
          kut = _injectors.injecting_kernel(name, case.golden_fn, where="fwd",
                                         **params)
          t = jax.jit(kut)(*inputs, inject_key=jax.random.PRNGKey(1))
          rep = (jax.jit(kut)(*inputs, inject_key=jax.random.PRNGKey(2))
                 if name == "nondeterminism" else None)
          add(case, dtype, "compute", name, expected,
              diagnose(t, g, r, context, repeat=rep, probe=probe))
      if native and case.native is not None:
        default = case.native("default")(*inputs)
        for variant, expected in case.native_variants.items():
          fn = case.native(variant)
          t = fn(*inputs)
          if variant != "default" and expected != "nondeterminism" and bool(
              jnp.all(t == default)):
            # The variant's difference never triggered on these inputs (no
            # subnormals for ftz, no cancellation, a width the tile
            # divides): it is the default kernel here.
            expected = case.native_variants.get("default", "reordering")
          rep = fn(*inputs) if expected == "nondeterminism" else None
          if expected == "nondeterminism":
            for _ in range(200):  # thread timing: retry until it shows
              if not bool(jnp.all(rep == t)):
                break
              rep = fn(*inputs)
          add(case, dtype, "native", variant, expected,
              diagnose(t, g, r, context, repeat=rep, probe=probe))
    if progress:
      progress(f"{case.kernel:10s} {case.source}: {len(records)} cases so far")
  return summarize(records)


CALIBRATION_DTYPES = ("float32", "bfloat16", "float16")


def check_dtypes(dtypes: Sequence[str]) -> None:
  """A calibration's input dtypes: at least one, each a known name.

  Raises:
    PeatError: none given, or a name outside ``CALIBRATION_DTYPES``.
  """
  unknown = [d for d in dtypes if d not in CALIBRATION_DTYPES]
  if not dtypes or unknown:
    raise PeatError(f"dtypes={tuple(dtypes)!r}: expected one or more of "
                    f"{CALIBRATION_DTYPES}"
                    + (f"; unknown: {unknown}" if unknown else ""))


def is_correct(r: CalibrationRecord) -> bool:
  """Right model; a kernel expected to reorder that is bitwise golden is
  right too (its order happened to match the golden one)."""
  return r.expected == r.predicted or (
      r.expected == "reordering" and r.predicted == "exact")


def summarize(records: list[CalibrationRecord]) -> CalibrationResult:
  """Confusion matrix, per-model accuracy, false alarms and misses.

  Raises:
    PeatError: no records (nothing was diagnosed).
  """
  if not records:
    raise PeatError("no calibration records to summarize: the cases "
                    "produced no error to diagnose. Fix: give cases whose "
                    "outputs have elements, and at least one dtype.")
  labels = sorted({r.expected for r in records} | {r.predicted for r in records},
                  key=lambda l: (l not in BENIGN, l))
  index = {l: i for i, l in enumerate(labels)}
  confusion = np.zeros((len(labels), len(labels)), np.int64)
  for r in records:
    confusion[index[r.expected], index[r.predicted]] += 1
  correct = sum(is_correct(r) for r in records)
  per_model = {}
  for l in labels:
    rows = [r for r in records if r.expected == l]
    if rows:
      per_model[l] = sum(is_correct(r) for r in rows) / len(rows)
  benign = [r for r in records if r.expected in BENIGN]
  faults = [r for r in records if r.expected in _facts.FAULT_MODELS]
  false_alarms = sum(r.predicted.split(":")[0] in _facts.FAULT_MODELS
                     for r in benign)
  misses = sum(r.predicted in BENIGN for r in faults)
  return CalibrationResult(
      tuple(records), tuple(labels), confusion, correct / len(records),
      per_model, false_alarms, len(benign), misses, len(faults))
