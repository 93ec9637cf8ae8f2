"""Faults over a correct kernel's reduced precision, and the composed
calibration's reduced-precision bases.

A port that computes in TF32, bf16 or fp16 (inputs rounded to the format)
or accumulates a 16-bit GEMM in its own format is correct but dense-noisy;
a sparse or structured fault on top of it must be named as the primary
cause and fail, whatever the base's format, with the precision (or
accumulation) as the secondary cause. Fresh seeded inputs, never zeros.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import detector
from peat_jax import injectors
from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access
from peat_jax.detector.calibration import _composed as comp  # pylint: disable=protected-access
from peat_jax.models import layers


def _normal(seed, shape, dtype=jnp.float32, scale=1.0, offset=0.0):
  x = np.random.default_rng(seed).standard_normal(shape) * scale + offset
  return jnp.asarray(x, dtype)


def _matmul(dtype):
  a, b = _normal(31, (64, 160), dtype), _normal(32, (160, 72), dtype, 0.1)
  return detector.CalibrationCase("matmul", "random", jnp.matmul, (a, b),
                                  reduction=160)


def _layer_norm(dtype):
  x = _normal(33, (48, 128), dtype, 1.5, 0.7)
  scale, bias = _normal(34, (128,), scale=0.2, offset=1.0), _normal(35, (128,))
  return detector.CalibrationCase(
      "layer_norm", "random",
      functools.partial(layers.layer_norm.__wrapped__, eps=1e-6),
      (x, scale, bias), reduction=128)


#: (case, dtype, base name, base model)
BASES = [
    (_matmul, jnp.float32, "in_tf32", "precision:tf32"),
    (_matmul, jnp.float32, "in_fp16", "precision:fp16"),
    (_layer_norm, jnp.float32, "in_bf16", "precision:bf16"),
    (_layer_norm, jnp.float16, "in_bf16", "precision:bf16"),
    (_matmul, jnp.bfloat16, "acc_bf16", "accumulation:bf16"),
    (_matmul, jnp.float16, "acc_fp16", "accumulation:fp16"),
]
IDS = [f"{c.__name__[1:]}-{jnp.dtype(d).name}-{b}" for c, d, b, _ in BASES]

FAULTS = [
    ("bitflip", {"count": 3, "bits": -2}),  # an exponent bit (from the top)
    ("zero", {"mode": "rows", "count": 1}),
    pytest.param("zero", {"mode": "elements", "count": 8},
                 marks=pytest.mark.slow),
    pytest.param("random_value", {"count": 5}, marks=pytest.mark.slow),
]


def _base(make, dtype, name):
  case = make(dtype)
  g = jax.jit(case.golden_fn)(*case.inputs)
  bases = {n: (m, t) for n, m, t in comp._bases(case, case.inputs, g)}
  return case, g, bases[name]


@pytest.mark.parametrize("make,dtype,name,model", BASES, ids=IDS)
def test_the_base_alone_is_its_format_and_never_fails(make, dtype, name,
                                                      model):
  case, g, (want, t) = _base(make, dtype, name)
  assert want == model
  assert not cal.bit_equal(t, g), "the base must carry its own error"
  r = cal.reference_of(case, case.inputs)
  diag = cal.diagnose(t, g, r, {"kernel": case.kernel,
                                "reduction": case.reduction},
                      probe=cal.probe_of(case, case.inputs), dtype=t.dtype)
  assert diag.verdict != "fail", diag


@pytest.mark.parametrize("fault,params", FAULTS,
                         ids=["bitflip", "zero_rows", "zero_elements",
                              "random_value"])
@pytest.mark.parametrize("make,dtype,name,model", BASES, ids=IDS)
def test_a_fault_over_reduced_precision_is_primary_and_fails(
    make, dtype, name, model, fault, params):
  case, g, (_, base) = _base(make, dtype, name)
  r = cal.reference_of(case, case.inputs)
  if fault == "bitflip":
    fmt = {2: 15, 4: 31}[jnp.dtype(dtype).itemsize]
    params = {"count": 3, "bits": fmt + params["bits"]}
  t = injectors.inject(fault, jax.random.PRNGKey(9), base, **params)
  diag = cal.diagnose(t, g, r, {"kernel": case.kernel,
                                "reduction": case.reduction},
                      probe=cal.probe_of(case, case.inputs), dtype=t.dtype)
  assert diag.model.split(":")[0] == fault, diag.evidence
  assert diag.verdict == "fail", diag
  if diag.secondary is not None:  # the base's own cause, never the fault
    assert comp.family(diag.secondary.model) in (
        "precision", "accumulation", "reordering", "exact"), diag.secondary


def test_accumulation_and_precision_are_one_cause_in_the_score():
  rec = cal.CalibrationRecord("matmul", "s", "bfloat16", "control", "acc",
                              "accumulation:bf16", "precision:bf16", 0.9,
                              "warn", "", base="accumulation:bf16")
  assert comp.family_correct(rec)
  assert not comp.family_correct(rec._replace(predicted="bitflip"))
  table = detector.composed_by_base([rec, rec._replace(
      origin="composed", expected="zero", predicted="reordering",
      verdict="pass")])
  assert "| accumulation:bf16 | bfloat16 | 2 | 50.0% | 0 | 1 |" in table


def test_a_nan_over_an_attention_ports_precision_is_named_not_raised():
  """The probe's attention scale fit read every candidate's RMS as NaN
  when the KUT's output held one, and raised (All-NaN slice): a
  campaign's record lost. The composed calibration found it."""
  q, k, v = (_normal(s, (2, 16, 2, 32)) for s in (36, 37, 38))
  case = detector.CalibrationCase(
      "attention", "random",
      functools.partial(layers.attention.__wrapped__, mask=None), (q, k, v),
      reduction=16)
  g = jax.jit(case.golden_fn)(*case.inputs)
  bases = {n: t for n, _, t in comp._bases(case, case.inputs, g)}
  t = injectors.inject("nan", jax.random.PRNGKey(2), bases["in_bf16"],
                       count=3, kind="nan")
  diag = cal.diagnose(t, g, cal.reference_of(case, case.inputs),
                      {"kernel": "attention", "reduction": 16},
                      probe=cal.probe_of(case, case.inputs), dtype=t.dtype)
  assert diag.model == "nan" and diag.verdict == "fail", diag


@pytest.mark.parametrize("k", [16, 32, 96])
def test_a_float32_gemm_accumulated_in_bf16_is_accumulation_at_short_k(k):
  """A float32 GEMM whose running sum is kept in bf16 has bf16-exact
  outputs; at a short reduction a few elements err by more than one
  rounding, within the accumulator's tail (accumulation_tail K u): that is
  the accumulator, warn, never an unknown fault (it read unknown, fail, on
  a small GPT's attention and MLP GEMMs)."""
  a, b = _normal(40 + k, (48, k)), _normal(41 + k, (k, 64), scale=0.3)
  case = detector.CalibrationCase("matmul", "random", jnp.matmul, (a, b),
                                  reduction=k)
  g = np.asarray(jnp.matmul(a, b))
  acc = np.zeros((48, 64), np.float32)
  an, bn = np.asarray(a), np.asarray(b)
  for i in range(k):  # the running sum rounded to bf16 after every add
    acc = (acc + an[:, i:i + 1] * bn[i:i + 1, :]).astype(
        jnp.bfloat16).astype(np.float32)
  r = cal.reference_of(case, case.inputs)
  diag = cal.diagnose(acc, g, r, {"kernel": "matmul", "reduction": k},
                      probe=cal.probe_of(case, case.inputs), dtype=acc.dtype)
  assert diag.model == "accumulation:bf16", diag.evidence
  assert diag.verdict == "warn", diag
