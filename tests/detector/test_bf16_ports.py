"""The Detector on bf16 sites of a Llama-style model's kernels.

Each case draws fresh seeded bf16 inputs (never zeros; shapes unlike the
`llama` scenario's), runs the model's golden kernel (``nnx.RMSNorm``,
``models.layers.swiglu`` / ``rope``, ``jax.nn.dot_product_attention``), a
port from
peat_jax.kernels.ports and the float64 reference of the model's kernel,
and diagnoses the port as playback does (analyze, the port probe when the
signature calls for it, detect). Correct ports pass with a margin from
the benign envelope; each slip gets its family, and a fitted constant
where there is one, within its magnitude.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access
from peat_jax.detector.facts import _facts  # pylint: disable=protected-access
from peat_jax.kernels import checks
from peat_jax.kernels import ports
from peat_jax.models import layers

BF16 = jnp.bfloat16


def _rand(rng, shape, scale=1.0, shift=0.0):
  return jnp.asarray(shift + scale * rng.standard_normal(shape), BF16)


def _case(kind, seed, small_rows=False):
  """(golden fn, args, kwargs, float64 reference fn, reduction)."""
  rng = np.random.default_rng(seed)
  if kind == "rms_norm":
    n = 1024 if seed % 2 else 768
    x = _rand(rng, (24, n), 1.5, 0.3)
    if small_rows:  # mean squares 2.5e-5..2.3e-4: an eps of 1e-5 shows
      rows = np.exp(rng.uniform(np.log(5e-3), np.log(1.5e-2), (24, 1)))
      x = jnp.asarray(rows * rng.standard_normal((24, n)), BF16)
    scale = jnp.asarray(1.0 + 0.1 * rng.standard_normal(n), jnp.float32)
    return (checks.rms_norm_golden, (x, scale, 1e-6), {},
            peat.analyzer.reference_rms_norm, n)
  if kind == "silu":
    x, up = _rand(rng, (48, 96), 2.0), _rand(rng, (48, 96))
    return layers.swiglu, (x, up), {}, peat.analyzer.reference_silu, None
  if kind == "rope":
    x = _rand(rng, (2, 40, 3, 64))
    pos = jnp.arange(40, dtype=jnp.int32)
    return (layers.rope, (x, pos), {"theta": 10000.0},
            peat.analyzer.reference_rope, None)
  q = _rand(rng, (2, 24, 8, 32))
  k, v = _rand(rng, (2, 24, 2, 32)), _rand(rng, (2, 24, 2, 32))
  return (jax.nn.dot_product_attention, (q, k, v), {},
          peat.analyzer.reference_attention, 24)


def _diagnose(kind, port, seed, small_rows=False):
  golden, args, kwargs, ref_fn, reduction = _case(kind, seed, small_rows)
  g = jax.jit(functools.partial(golden, **kwargs))(*args)
  t = jax.jit(functools.partial(port, **kwargs))(*args)
  r = peat.analyzer.reference(functools.partial(ref_fn, **kwargs), *args)
  ctx = {"kernel": kind}
  if reduction:
    ctx["reduction"] = reduction
  probe = (kind, args, kwargs,
           lambda *a: peat.analyzer.reference(
               functools.partial(ref_fn, **kwargs), *a))
  diag, sig = cal.diagnose(t, g, r, ctx, probe=probe, dtype=t.dtype,
                           full=True)
  return diag, sig


CORRECT = [
    ("rms_norm", ports.rms_norm_hf), ("rms_norm", ports.rms_norm_welford),
    ("rms_norm", ports.rms_norm_two_pass), ("silu", ports.silu_f32),
    ("rope", ports.rope_f32_tables), ("attention", ports.gqa_repeat)]


@pytest.mark.parametrize("kind,port", CORRECT,
                         ids=[p.__name__ for _, p in CORRECT])
@pytest.mark.parametrize("seed", [11, pytest.param(12, marks=pytest.mark.slow)])
def test_correct_bf16_ports_pass_with_a_margin(kind, port, seed):
  diag, sig = _diagnose(kind, port, seed)
  assert diag.verdict == "pass", diag.evidence
  assert diag.model in ("exact", "reordering"), diag.evidence
  ratio = float(np.asarray(sig.noise_ratio))
  # A margin from the benign envelope: half of it at most.
  assert ratio <= _facts.BENIGN_NOISE_RATIO / 2, (ratio, diag.evidence)


SLIPS = [
    ("rms_norm", ports.rms_norm_as_layer_norm, "parameter", "fail"),
    ("rms_norm", ports.rms_norm_acc_bf16, "accumulation:bf16", "warn"),
    ("silu", ports.swiglu_swapped, "indexing", "fail"),
    ("rope", ports.rope_interleaved, "indexing", "fail"),
    ("rope", ports.rope_theta_500k, "parameter", "fail"),
    ("rope", ports.rope_offset, "parameter", "fail"),
    ("attention", ports.gqa_wrong_group, "indexing", "fail")]


@pytest.mark.parametrize("kind,port,model,verdict", SLIPS,
                         ids=[p.__name__ for _, p, _, _ in SLIPS])
@pytest.mark.parametrize("seed", [21, pytest.param(22, marks=pytest.mark.slow)])
def test_bf16_port_slips_are_named(kind, port, model, verdict, seed):
  diag, sig = _diagnose(kind, port, seed)
  assert diag.model == model, diag.evidence
  assert diag.verdict == verdict, diag.evidence
  # Beyond the benign envelope with a margin: never 'reordering'.
  assert float(np.asarray(sig.noise_ratio)) >= 2 * _facts.BENIGN_NOISE_RATIO
  est = diag.params.get("estimate")
  if port is ports.rope_theta_500k:
    assert est == pytest.approx(5e5, rel=0.05), diag.evidence
  if port is ports.rope_offset:
    assert est == 1.0, diag.evidence


def test_an_eps_slip_where_it_matters_is_a_fitted_parameter():
  """Rows whose mean squares are 2.5e-5..2.3e-4: eps 1e-5 for 1e-6 moves
  them by 2-18%, each row by its own factor (named, eps fitted); on rows of
  mean square ~2 the same slip is ~2e-6 relative, far below u(bf16), and
  passes (nothing of it survives the bf16 output)."""
  diag, _ = _diagnose("rms_norm", ports.rms_norm_eps, 31, small_rows=True)
  assert diag.model == "parameter" and diag.verdict == "fail", diag.evidence
  assert diag.params["estimate"] == pytest.approx(1e-5, rel=0.1)
  diag, sig = _diagnose("rms_norm", ports.rms_norm_eps, 31)
  assert diag.verdict == "pass" and diag.model != "truncation", diag.evidence
  assert float(np.asarray(sig.noise_ratio)) < 1.5


FAULTS = [("bitflip", {"count": 3, "bits": (12,)}), ("zero", {"count": 8}),
          ("random_value", {"count": 5})]
BASES = [("rms_norm", ports.rms_norm_acc_bf16, "accumulation:bf16"),
         ("rms_norm", ports.rms_norm_as_layer_norm, "parameter"),
         ("rope", ports.rope_theta_500k, "parameter"),
         ("attention", ports.gqa_wrong_group, "indexing")]


@pytest.mark.parametrize("fault,params", FAULTS, ids=[f for f, _ in FAULTS])
@pytest.mark.parametrize("kind,port,base", BASES,
                         ids=[p.__name__ for _, p, _ in BASES])
def test_a_fault_over_a_bf16_slip_is_the_primary_cause(kind, port, base,
                                                       fault, params):
  """A sparse fault (an exponent bit flipped, zeroed elements, random
  values) on top of a bf16 port's dense error: the fault is named and
  fails, the port's own cause is the secondary one."""
  golden, args, kwargs, ref_fn, reduction = _case(kind, 5)
  g = jax.jit(functools.partial(golden, **kwargs))(*args)
  t = jax.jit(functools.partial(port, **kwargs))(*args)
  t = peat.injectors.inject(fault, jax.random.key(5), t, **params)
  ref = functools.partial(ref_fn, **kwargs)
  r = peat.analyzer.reference(ref, *args)
  ctx = {"kernel": kind, **({"reduction": reduction} if reduction else {})}
  diag = cal.diagnose(t, g, r, ctx, dtype=t.dtype, probe=(
      kind, args, kwargs, lambda *a: peat.analyzer.reference(ref, *a)))
  assert diag.model == fault and diag.verdict == "fail", diag.evidence
  assert diag.secondary is not None and diag.secondary.model == base, (
      diag.secondary)
