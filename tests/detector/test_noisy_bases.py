"""The Detector on real ports: faults over a port's own rounding noise, the
port mismatches (another constant or closed form), composite diagnoses, the
ratio view and the NaN/Inf hard fail.

Inputs are fresh seeded normal draws shaped like the models' sites (a
reduction with a partial last tile, logits of training scale, activations
with an offset for the layer norm); the full composed calibration on
captured site inputs is ``python -m peat_jax.tools.calibrate --composed``
(docs/detector.md).
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import analyzer
from peat_jax import detector
from peat_jax import injectors
from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access
from peat_jax.kernels import native
from peat_jax.kernels import ports
from peat_jax.models import layers


def _normal(seed, shape, scale=1.0, offset=0.0):
  x = np.random.default_rng(seed).standard_normal(shape) * scale + offset
  return jnp.asarray(x.astype(np.float32))


@pytest.fixture(scope="module")
def matmul_case():
  a, b = _normal(1, (64, 200)), _normal(2, (200, 88), 0.1)
  return detector.CalibrationCase(
      "matmul", "random", jnp.matmul, (a, b), reduction=200,
      native=lambda v: jax.jit(functools.partial(native.matmul, variant=v)),
      native_variants={"default": "reordering", "tiled": "reordering",
                       "in_bf16": "precision:bf16"})


def _diagnose(t, g, r, case, probe=True):
  ctx = {"kernel": case.kernel, "reduction": case.reduction}
  pr = cal.probe_of(case, case.inputs) if probe else None
  return cal.diagnose(t, g, r, ctx, probe=pr, dtype=t.dtype)


FAULTS = [
    ("bitflip", "bitflip", {"count": 3, "bits": 27}),
    ("stuck_at", "stuck_at", {"bit": 16, "value": 1, "share": 0.2}),
    ("random_value", "random_value", {"count": 5}),
    ("zero", "zero", {"mode": "elements", "count": 20}),
    ("zero", "zero", {"mode": "rows", "count": 1}),
    ("nan", "nan", {"count": 3, "kind": "nan"}),
    ("scale", "scale", {"factor": 0.5}),
    ("lane", "lane", {"stride": 32, "lane": 5, "axis": -1, "effect": "zero"}),
    ("indexing", "indexing", {"mode": "shift", "shift": 1}),
    ("indexing", "indexing", {"mode": "permutation", "count": 64}),
]


@pytest.mark.parametrize("base", ["tiled", "default"])
@pytest.mark.parametrize("family,name,params", FAULTS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in
                              enumerate(FAULTS)])
def test_fault_over_reordering_noise_is_named_and_fails(
    matmul_case, base, family, name, params):
  g = jnp.matmul(*matmul_case.inputs)
  r = cal.reference_of(matmul_case, matmul_case.inputs)
  t0 = matmul_case.native(base)(*matmul_case.inputs)
  assert not cal.bit_equal(t0, g), "the base must carry its own noise"
  t = injectors.inject(name, jax.random.key(3), t0, **params)
  diag = _diagnose(t, g, r, matmul_case)
  assert diag.model.split(":")[0] == family, diag.evidence
  assert diag.verdict == "fail", diag
  if diag.secondary is not None:  # the base's rounding, never the fault
    assert diag.secondary.model in ("reordering", "exact"), diag.secondary


# Faults confined to some elements (a shift or scale of the whole output
# leaves no element of the base's own error to name).
SPARSE = FAULTS[:4] + FAULTS[7:8] + FAULTS[9:]


@pytest.mark.parametrize("family,name,params", SPARSE,
                         ids=[f"{n}-{i}" for i, (n, _, _) in
                              enumerate(SPARSE)])
def test_fault_over_bf16_inputs_names_both_causes(matmul_case, family, name,
                                                  params):
  g = jnp.matmul(*matmul_case.inputs)
  r = cal.reference_of(matmul_case, matmul_case.inputs)
  t = injectors.inject(name, jax.random.key(4),
                       matmul_case.native("in_bf16")(*matmul_case.inputs),
                       **params)
  diag = _diagnose(t, g, r, matmul_case)
  assert diag.model.split(":")[0] == family, diag.evidence
  assert diag.verdict == "fail"
  assert diag.secondary is not None and diag.secondary.model == (
      "precision:bf16"), diag


def test_benign_bases_alone_are_not_faults(matmul_case):
  g = jnp.matmul(*matmul_case.inputs)
  r = cal.reference_of(matmul_case, matmul_case.inputs)
  for base, want in (("default", "pass"), ("tiled", "pass"),
                     ("in_bf16", "warn")):
    diag = _diagnose(matmul_case.native(base)(*matmul_case.inputs), g, r,
                     matmul_case)
    assert diag.verdict == want, (base, diag)
    assert diag.model.split(":")[0] in ("reordering", "exact", "precision")


def test_split_k_partial_last_tile_passes(matmul_case):
  """A correct kernel whose last partial column tile sums fewer terms in
  another order: rounding-level error confined to the last columns, which
  an ``indexing`` rule reading direction alone called a fault."""
  a, b = matmul_case.inputs
  g = jnp.matmul(a, b)
  r = cal.reference_of(matmul_case, matmul_case.inputs)
  w = b.shape[1] % 16  # 88 = 5 x 16 + 8: a partial tile of 8 columns
  assert w
  # The last tile's K loop split in two halves, summed in float32.
  half = a.shape[1] // 2
  edge = (jnp.matmul(a[:, :half], b[:half, -w:])
          + jnp.matmul(a[:, half:], b[half:, -w:]))
  t = g.at[:, -w:].set(edge)
  assert not cal.bit_equal(t, g)
  diag = _diagnose(t, g, r, matmul_case)
  assert diag.verdict == "pass", diag
  assert diag.model in ("reordering", "exact"), diag


@pytest.fixture(scope="module")
def composite_cases():
  x = _normal(5, (48, 128), 1.5, 0.7)
  scale, bias = _normal(6, (128,), 0.2, 1.0), _normal(7, (128,), 0.1)
  logits = _normal(8, (48, 96), 2.5)
  q, k, v = (_normal(s, (2, 16, 2, 32)) for s in (9, 10, 11))
  gx = _normal(12, (48, 64), 1.2)
  return {
      "layer_norm": detector.CalibrationCase(
          "layer_norm", "random",
          functools.partial(layers.layer_norm.__wrapped__, eps=1e-6),
          (x, scale, bias), reduction=128),
      "softmax": detector.CalibrationCase(
          "softmax", "random", jax.nn.softmax, (logits,), reduction=96),
      "attention": detector.CalibrationCase(
          "attention", "random",
          functools.partial(layers.attention.__wrapped__, mask=None),
          (q, k, v), reduction=16),
      "gelu": detector.CalibrationCase(
          "gelu", "random", functools.partial(jax.nn.gelu, approximate=False),
          (gx,)),
  }


PORT_CASES = [(kind, name) for kind in ports.PORTS for name in ports.PORTS[kind]]


@pytest.mark.parametrize("kind,name", PORT_CASES,
                         ids=[f"{k}-{n}" for k, n in PORT_CASES])
def test_port_mismatch_is_named_with_the_probe(composite_cases, kind, name):
  case = composite_cases[kind]
  fn = ports.PORTS[kind][name]
  keywords = dict(getattr(case.golden_fn, "keywords", None) or {})
  accepted = inspect.signature(fn).parameters
  t = jax.jit(lambda *a: fn(*a, **{k: v for k, v in keywords.items()
                                   if k in accepted}))(*case.inputs)
  g = jax.jit(case.golden_fn)(*case.inputs)
  r = cal.reference_of(case, case.inputs)
  diag = _diagnose(t, g, r, case)
  assert diag.model == ports.EXPECTED_ERROR_MODEL[kind][name], diag.evidence
  assert diag.verdict in ("warn", "fail")


def test_eps_mismatch_names_the_constant(composite_cases):
  """The classic cross-framework slip: the kernel's eps 1e-5 where the
  model uses 1e-6; tens of ulps, not a narrower format."""
  case = composite_cases["layer_norm"]
  x, scale, bias = case.inputs
  # A small variance makes eps matter beyond rounding.
  xs = x * 0.02
  t = ports.layer_norm_eps(xs, scale, bias, eps=1e-6, port_eps=1e-5)
  g = case.golden_fn(xs, scale, bias)
  r = cal.reference_of(case, (xs, scale, bias))
  ctx = {"kernel": "layer_norm", "reduction": 128}
  diag = cal.diagnose(t, g, r, ctx,
                           probe=cal.probe_of(case, (xs, scale, bias)))
  assert diag.model == "parameter", diag.evidence
  assert "1e-05" in diag.evidence or "1e-5" in diag.evidence, diag.evidence


def test_metric_ratios_of_a_reduced_precision_kernel(matmul_case):
  a, b = matmul_case.inputs
  g = jnp.matmul(a, b)
  r = cal.reference_of(matmul_case, matmul_case.inputs)
  own = analyzer.metric_ratios(jax.device_get(
      analyzer.analyze(matmul_case.native("default")(a, b), g, r))._asdict())
  bf = analyzer.metric_ratios(jax.device_get(
      analyzer.analyze(matmul_case.native("in_bf16")(a, b), g, r))._asdict())
  assert set(own) == set(analyzer.RATIO_METRICS)
  # Another summation order: about the golden kernel's own error.
  assert 0.3 < own["rmse"] < 3.0 and own["nonfinite_mismatch"] == 0
  # bf16 inputs: 2^16 times float32's unit roundoff, within a factor.
  assert 2 ** 11 < bf["rmse"] < 2 ** 19, bf
  assert bf["beyond_ulps"] > 0.5 and abs(bf["bias"]) < 0.2


def test_nan_where_golden_has_none_or_lost_is_a_hard_fail(matmul_case):
  a, b = matmul_case.inputs
  g = jnp.matmul(a, b)
  r = cal.reference_of(matmul_case, matmul_case.inputs)
  # The golden output holds a NaN (as a model's overflow would); the KUT
  # returns a finite value there: a mismatch, whatever else it computes.
  g_nan = g.at[3, 5].set(jnp.nan)
  t = matmul_case.native("default")(a, b)
  sig = jax.device_get(analyzer.analyze(t, g_nan, r))._asdict()
  assert analyzer.metric_ratios(sig)["nonfinite_mismatch"] == 1
  diag = detector.detect(analyzer.analyze(t, g_nan, r),
                         context={"kernel": "matmul", "reduction": 200})
  assert diag.verdict == "fail", diag
  assert "NaN/Inf" in diag.evidence
