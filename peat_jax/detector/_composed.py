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
from peat_jax.detector import _calibration as _cal
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
  return out


#: Faults whose family cannot be told on a base of the same family.
_SAME_FAMILY_SKIP = {"precision", "truncation", "ftz"}


def _port_cases(case: _cal.CalibrationCase, inputs: tuple
                ) -> list[tuple[str, str, jax.Array]]:
  kind = {"layer_norm": "layer_norm", "softmax": "softmax",
          "attention": "attention", "gelu": "gelu"}.get(case.kernel)
  if kind is None:
    return []
  out = []
  for name, fn in _ports.PORTS[kind].items():
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
      inputs = tuple(jnp.asarray(x).astype(dt)
                     if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
                     else jnp.asarray(x) for x in case.inputs)
      g = jax.jit(case.golden_fn)(*inputs)
      r = _cal.reference_of(case, inputs)
      probe = _cal.probe_of(case, inputs)
      for bname, bexp, base in _bases(case, inputs, g):
        control = _cal.diagnose(base, g, r, context, full=True, probe=probe,
                                dtype=dt)
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
                expected, bexp, _cal.diagnose(t, g, r, context, probe=probe,
                                              dtype=dt))
    if ports:
      inputs = tuple(jnp.asarray(x).astype(jnp.float32)
                     if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
                     else jnp.asarray(x) for x in case.inputs)
      g = jax.jit(case.golden_fn)(*inputs)
      r = _cal.reference_of(case, inputs)
      probe = _cal.probe_of(case, inputs)
      for name, expected, t in _port_cases(case, inputs):
        # Signature only (a runtime FI record, no inputs) and probed.
        add(case, "float32", "port", name, expected, "exact",
            _cal.diagnose(t, g, r, context))
        add(case, "float32", "port+probe", name, expected, "exact",
            _cal.diagnose(t, g, r, context, probe=probe))
    if progress:
      progress(f"{case.kernel:10s} {case.source}: {len(records)} cases so far")
  return summarize_families(records)


def family_correct(r: _cal.CalibrationRecord) -> bool:
  """Right family of the primary cause (exact counts as reordering)."""
  want, got = family(r.expected), family(r.predicted)
  return want == got or (want == "reordering" and got == "exact") or (
      want == "exact" and got == "reordering")


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
