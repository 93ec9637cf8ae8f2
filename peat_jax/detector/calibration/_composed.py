"""Calibration on composed cases: faults on top of a real port's own noise.

A real port is never otherwise exact: its own summation order (or input
rounding) already moves most elements by an ulp or more. A composed case is
a *benign base* (what a correct port computes on the case's inputs) with a
*fault* planted on top of its output, so the Detector is judged on what a
ported kernel with a bug looks like:

* bases: the native variants that only reorder or fuse (``default``,
  ``tiled`` with a tile that leaves a partial last tile, ``fma``,
  ``welford``), another summation order from the computation injector, a
  kernel whose last partial column tile alone sums in another order, and
  the precision bases ``in_tf32`` and ``in_bf16``; for kernels without a
  native variant, 1-ulp rounding noise on half of the elements;
* faults: every tensor injector of the tensor calibration (bit flips, stuck
  bits, random values, zeros, NaN, scale, lanes, shifts, truncation, ftz,
  saturation ...), planted on the base's output;
* controls: each base alone (the Detector must not call them faults);
* port mismatches (``peat_jax.kernels.ports``): another constant
  (``parameter``) or closed form (``approximation``) of the same kernel.

The expected model of a composed case is the fault's (primary cause), the
base's model is the expected secondary; accuracy is counted by family
(``precision:fp16`` and ``precision:tf32`` are one family).
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core
from peat_jax import injectors as _injectors
from peat_jax.core import PeatError
from peat_jax.detector.calibration import _calibration as _cal
from peat_jax.kernels import ports as _ports


def family(model: str) -> str:
  """``precision:bf16`` -> ``precision``; ``bitflip`` -> ``bitflip``."""
  return model.split(":")[0]


def _edge_width(n: int) -> int:
  """Width of a partial last column tile of a 16-wide tiling of ``n``."""
  rem = n % 16
  return rem if rem else min(16, max(n // 4, 1))


def _bases(case: _cal.CalibrationCase, inputs: tuple, g: jax.Array
           ) -> list[tuple[str, str, jax.Array]]:
  """(name, expected model, output) of the benign bases of one case (the
  native variants are float32 kernels: 16-bit cases get the others)."""
  out = []
  if case.native is not None and g.dtype == jnp.float32:
    names = {"matmul": ("default", "tiled", "fma", "in_tf32", "in_bf16"),
             "conv": ("default", "tiled", "fma", "in_tf32", "in_bf16"),
             "softmax": ("default", "tiled", "in_bf16"),
             "layer_norm": ("default", "welford", "in_bf16")}.get(
                 case.kernel, ())
    for name in names:
      expected = case.native_variants.get(name)
      if expected is None:
        continue
      t = case.native(name)(*inputs)
      if expected == "reordering" and bool(jnp.all(t == g)):
        expected = "exact"
      out.append((f"native:{name}", expected, t))
  if case.kernel in ("matmul", "conv"):
    kut = _injectors.injecting_kernel("reordering", case.golden_fn,
                                      blocks=4, order="pairwise")
    t = jax.jit(kut)(*inputs, inject_key=jax.random.PRNGKey(7))
    out.append(("reorder", "reordering", t))
    if g.ndim >= 2 and g.shape[-1] >= 24:
      # A correct kernel whose last partial column tile sums in another
      # order (the edge path of a tiled kernel): noise in the last columns
      # only, at rounding level; a false `indexing` alarm of the past.
      w = _edge_width(int(g.shape[-1]))
      out.append(("edge_reorder", "reordering",
                  g.at[..., -w:].set(t[..., -w:])))
  if not out:
    t = _injectors.inject("reordering", jax.random.PRNGKey(11), g,
                          share=0.5, ulps=1)
    out.append(("noise", "reordering", t))
  return out + _precision_bases(case, inputs, g, {n for n, _, _ in out})


#: Input formats of the precision bases (coarser than the case's dtype).
PRECISION_BASES = ("tf32", "bf16", "fp16")
#: GEMM-like kernels whose 16-bit cases get a bf16/fp16 accumulator base.
_ACCUMULATING = ("matmul", "conv", "attention")


def _precision_bases(case: _cal.CalibrationCase, inputs: tuple, g: jax.Array,
                     have: set) -> list[tuple[str, str, jax.Array]]:
  """A correct kernel run in reduced precision: the golden kernel on its
  floating inputs rounded to each format of PRECISION_BASES with fewer
  mantissa bits than the case's dtype (``precision:<fmt>``; a native
  ``in_<fmt>`` variant, where there is one, stands for it), and for 16-bit
  GEMM cases an accumulator of the case's own format
  (``accumulation:<fmt>``: 16-term chunks rounded into it)."""
  own = _core.format_of(g.dtype)
  out = []
  for fmt in PRECISION_BASES:
    f = _core.FORMATS[fmt]
    if f.mantissa_bits >= own.mantissa_bits or f"native:in_{fmt}" in have:
      continue
    rounded = tuple(
        _injectors.inject(f"precision:{fmt}", jax.random.PRNGKey(0), x)
        if jnp.issubdtype(x.dtype, jnp.floating) else x for x in inputs)
    t = jax.jit(case.golden_fn)(*rounded)
    if _cal.bit_equal(t, g):
      continue  # the inputs hold the format's values already (a bf16
      # model's activations in float32): no precision base here
    out.append((f"in_{fmt}", f"precision:{fmt}", t))
  if jnp.dtype(g.dtype).itemsize == 2 and case.kernel in _ACCUMULATING:
    fmt = {"bfloat16": "bf16", "float16": "fp16"}[jnp.dtype(g.dtype).name]
    kut = _injectors.injecting_kernel(f"accumulation:{fmt}", case.golden_fn,
                                      chunk=16)
    t = jax.jit(kut)(*inputs, inject_key=jax.random.PRNGKey(5))
    out.append((f"acc_{fmt}", f"accumulation:{fmt}", t))
  return out


#: Faults whose family cannot be told on a base of the same family.
_SAME_FAMILY_SKIP = {"precision", "accumulation", "truncation", "ftz"}


def _port_cases(case: _cal.CalibrationCase, inputs: tuple
                ) -> list[tuple[str, str, jax.Array]]:
  """The port mismatches of the case's kernel: ``ports.PORTS`` and, on a
  16-bit case, the slips of a bf16 model's ports (``ports.LLAMA_PORTS``;
  ``gqa_wrong_group`` only where there are fewer kv than query heads, and
  there alone: PORTS' attention slips take one kv head per query head)."""
  kind = case.kernel
  found = dict(_ports.PORTS.get(kind, {}))
  grouped = kind == "attention" and inputs[1].shape[-2] != inputs[0].shape[-2]
  if grouped:  # PORTS' attention slips are of one kv head per query head
    found = {}
  if jnp.dtype(inputs[0].dtype).itemsize == 2:
    found.update(_ports.LLAMA_PORTS.get(kind, {}))
    if kind == "attention" and not grouped:
      found.pop("gqa_wrong_group", None)  # exact with one kv head per head
  out = []
  for name, fn in found.items():
    t = jax.jit(lambda *a, fn=fn: _call_port(case, fn, a))(*inputs)
    out.append((name, _ports.EXPECTED_ERROR_MODEL[kind][name], t))
  return out


def _call_port(case, fn, args):
  """The port KUT on the case's inputs, with the golden call's constants
  (a layer norm's eps, an attention mask) where the port takes them."""
  keywords = dict(getattr(case.golden_fn, "keywords", None) or {})
  accepted = inspect.signature(fn).parameters
  return fn(*args, **{k: v for k, v in keywords.items() if k in accepted})


def _stands_out(t, base, r, theta: float) -> bool:
  """Whether a planted fault moves an element of the base beyond the base's
  own outlier envelope (``theta`` units of u * scale, from the base's
  signature): a fault within the port's own rounding is rounding there (as
  a flip of the lowest mantissa bits is in the tensor calibration)."""
  t64 = np.asarray(t, np.float64)
  b64 = np.asarray(base, np.float64)
  r64 = np.asarray(r, np.float64).reshape(b64.shape)
  r2 = r64.reshape(-1, r64.shape[-1]) if r64.ndim else r64.reshape(1, 1)
  rms = np.sqrt(np.mean(np.square(r2), axis=-1, keepdims=True))
  scale = (np.abs(r2) + rms).reshape(r64.shape)
  u = float(_core.format_of(np.asarray(base).dtype).unit_roundoff)
  with np.errstate(invalid="ignore", over="ignore"):
    dz = np.abs(t64 - b64) / (u * np.maximum(scale, 1e-300))
  moved = ~np.isfinite(t64) & np.isfinite(b64)
  return bool(np.any(moved) or np.nanmax(np.where(np.isfinite(dz), dz, 0.0))
              > theta)


def run_composed_calibration(cases: Sequence[_cal.CalibrationCase], *,
                             dtypes: Sequence[str] = ("float32",),
                             seeds: Sequence[int] = (0,),
                             ports: bool = True,
                             progress: Callable[[str], None] | None = None,
                             ) -> _cal.CalibrationResult:
  """Faults planted on benign bases, the bases alone, and port mismatches.

  Each record's ``error`` is ``"<fault> on <base>"``; ``expected`` is the
  fault's model (the base's for a control), ``base`` the base's own model.
  The native bases are float32 kernels; bfloat16 and float16 cases have
  the other summation order (GEMMs) or 1-ulp noise as their bases. The port
  mismatches run in float32.

  Args:
    cases: kernel calls on realistic inputs (``tools/calibrate.py``).
    dtypes: input dtypes (``float32``, ``bfloat16``, ``float16``).
    seeds: one round of faults per seed.
    ports: include the port mismatches.
    progress: called with one line per case.

  Returns:
    A :class:`peat_jax.detector.CalibrationResult`.

  Raises:
    PeatError: no cases; no dtypes, or one outside CALIBRATION_DTYPES.
  """
  if not cases:
    raise PeatError("run_composed_calibration needs at least one "
                    "CalibrationCase")
  _cal.check_dtypes(dtypes)
  records: list[_cal.CalibrationRecord] = []

  def add(case, dtype, origin, error, expected, base, diag):
    if isinstance(diag, Exception):  # the Detector raised: a wrong answer
      if progress:
        progress(f"  {case.kernel} {dtype} {origin}:{error}: the Detector "
                 f"raised {type(diag).__name__}: {str(diag)[:200]}")
      records.append(_cal.CalibrationRecord(
          case.kernel, case.source, dtype, origin, error, expected,
          f"raised:{type(diag).__name__}", 0.0, "fail", str(diag)[:200],
          base=base, secondary=""))
      return
    sec = diag.secondary.model if getattr(diag, "secondary", None) else ""
    records.append(_cal.CalibrationRecord(
        case.kernel, case.source, dtype, origin, error, expected,
        diag.model, float(diag.confidence), diag.verdict, diag.evidence,
        base=base, secondary=sec))

  for case in cases:
    _core.release_compiled()  # thousands of shapes in one process
    context = {"kernel": case.kernel, "reduction": case.reduction}
    for dtype in dtypes:
      dt = jnp.dtype(dtype)
      inputs = _cal.cast_inputs(case.inputs, dt)
      try:
        g = jax.jit(case.golden_fn)(*inputs)
      except Exception as e:  # pylint: disable=broad-except
        if progress:  # e.g. XLA:CPU has no float16 dot with float32 result
          progress(f"  {case.kernel} {case.source}: skipped in {dtype}: the "
                   f"golden kernel raised {type(e).__name__}: "
                   f"{str(e)[:160]}")
        continue
      r = _cal.reference_of(case, inputs)
      probe = _cal.probe_of(case, inputs)
      for bname, bexp, base in _bases(case, inputs, g):
        control = _guarded(lambda: _cal.diagnose(
            base, g, r, context, full=True, probe=probe, dtype=dt))
        if isinstance(control, Exception):
          add(case, dtype, "control", bname, bexp, bexp, control)
          continue
        theta = float(control[1].env_theta)
        add(case, dtype, "control", bname, bexp, bexp, control[0])
        for seed in seeds:
          rng = np.random.default_rng([seed, len(records),
                                       int(np.prod(g.shape))])
          for k, (expected, name, params) in enumerate(
              _cal.injections(rng, tuple(g.shape), dtype)):
            if expected == "exact":
              continue
            if (family(expected) in _SAME_FAMILY_SKIP
                and family(bexp) in _SAME_FAMILY_SKIP):
              continue
            t = _injectors.inject(name, jax.random.PRNGKey(1000 * seed + k),
                                  base, **params)
            if not _stands_out(t, base, r, theta):
              continue  # within the base's own noise: not a fault here
            add(case, dtype, "composed", f"{name} {params} on {bname}",
                expected, bexp, _guarded(lambda: _cal.diagnose(
                    t, g, r, context, probe=probe, dtype=dt)))
    if ports:  # in the dtype the model trains in (float32, or bf16)
      inputs = tuple(jnp.asarray(x) for x in case.inputs)
      dtype = jnp.dtype(inputs[0].dtype).name
      g = jax.jit(case.golden_fn)(*inputs)
      r = _cal.reference_of(case, inputs)
      probe = _cal.probe_of(case, inputs)
      for name, expected, t in _port_cases(case, inputs):
        # Signature only (a runtime FI record, no inputs) and probed.
        add(case, dtype, "port", name, expected, "exact", _guarded(
            lambda: _cal.diagnose(t, g, r, context, dtype=t.dtype)))
        add(case, dtype, "port+probe", name, expected, "exact", _guarded(
            lambda: _cal.diagnose(t, g, r, context, probe=probe,
                                  dtype=t.dtype)))
    if progress:
      progress(f"{case.kernel:10s} {case.source}: {len(records)} cases so far")
  return summarize_families(records)


#: Families that name one cause: a bitwise-equal output of a reordering
#: base, and a narrow accumulator read as the precision of its format
#: (the level rules tell them apart by how the error grows with K).
_SAME_CAUSE = ({"exact", "reordering"}, {"accumulation", "precision"})


def _guarded(fn):
  """``fn()``, or the exception it raised (recorded as a wrong answer)."""
  try:
    return fn()
  except Exception as e:  # pylint: disable=broad-except
    return e


def family_correct(r: _cal.CalibrationRecord) -> bool:
  """Right family of the primary cause (exact counts as reordering; an
  accumulation in a narrow format as that format's precision)."""
  want, got = family(r.expected), family(r.predicted)
  return want == got or any({want, got} <= pair for pair in _SAME_CAUSE)


def by_base(records: Sequence[_cal.CalibrationRecord]) -> str:
  """A Markdown table of the composed cases by base and dtype: cases, the
  right family, false alarms (a control that fails) and misses (a fault
  that passes). The base is the benign base's model (``exact``,
  ``reordering``, ``precision:<fmt>``, ``accumulation:<fmt>``); port
  mismatches have the golden kernel (``exact``) as theirs."""
  rows: dict = {}
  for r in records:
    k = (r.base, r.dtype)
    n, ok, fa, miss = rows.get(k, (0, 0, 0, 0))
    rows[k] = (n + 1, ok + family_correct(r),
               fa + (r.origin == "control" and r.verdict == "fail"),
               miss + (r.origin != "control" and r.verdict == "pass"))
  lines = ["| base | dtype | cases | right family | false alarms | misses |",
           "| --- | --- | ---: | ---: | ---: | ---: |"]
  for (base, dtype), (n, ok, fa, miss) in sorted(rows.items()):
    lines.append(f"| {base} | {dtype} | {n} | {ok / n:.1%} | {fa} | {miss} |")
  return "\n".join(lines)


def summarize_families(records: Sequence[_cal.CalibrationRecord]
                       ) -> _cal.CalibrationResult:
  """The confusion matrix by family, false alarms and misses by verdict.

  A false alarm is a control (a benign base alone) whose diagnosis fails;
  a miss is a composed or port case whose diagnosis passes.
  """
  fam = [r._replace(expected=family(r.expected), predicted=family(r.predicted))
         for r in records]
  labels = sorted({r.expected for r in fam} | {r.predicted for r in fam},
                  key=lambda l: (l not in _cal.BENIGN, l))
  index = {l: i for i, l in enumerate(labels)}
  confusion = np.zeros((len(labels), len(labels)), np.int64)
  for r in fam:
    confusion[index[r.expected], index[r.predicted]] += 1
  per_model = {}
  for l in labels:
    rows = [r for r in fam if r.expected == l]
    if rows:
      per_model[l] = sum(family_correct(r) for r in rows) / len(rows)
  controls = [r for r in records if r.origin == "control"]
  faults = [r for r in records if r.origin != "control"]
  return _cal.CalibrationResult(
      tuple(records), tuple(labels), confusion,
      sum(family_correct(r) for r in fam) / max(len(fam), 1), per_model,
      sum(r.verdict == "fail" for r in controls), len(controls),
      sum(r.verdict == "pass" for r in faults), len(faults))
