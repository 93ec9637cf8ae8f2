"""Classes the Detector's hand-set cascade got wrong, each fitted in
magnitude by a hypothesis of its own:

* operands truncated toward zero to tf32 (what tensor cores do to raw
  float32 data) shrink the output by u(tf32) / ln 2: ``precision:tf32``
  with ``rounding="toward_zero"``, beside round to nearest's
  ``nearest_even``;
* a multi-bit upset (three bits of a few float32 elements) is ``bitflip``
  with its bits, not ``random_value``;
* tiny outputs flushed to zero, and records whose scale underflows
  ``u x scale``, never pass (degenerate statistics);
* another activation far beyond the noise floor fails.

Fresh seeded inputs, float64 references, output-only (``peat.analyze``
then ``peat.detect``) and the playback path (``diagnose`` with the probe).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access


def _round_bits(x: np.ndarray, drop: int, nearest: bool) -> np.ndarray:
  """float32 ``x`` with its ``drop`` low significand bits rounded away
  (to nearest even, or toward zero)."""
  u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  if nearest:
    u = u + ((1 << (drop - 1)) - 1) + ((u >> drop) & 1)
  u = u & ~np.uint64((1 << drop) - 1) & np.uint64(0xFFFFFFFF)
  return u.astype(np.uint32).view(np.float32)


def _matmul(seed: int, m: int, k: int, n: int):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((m, k)).astype(np.float32)
  b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
  return a, b


def _detect(t, g, r, kernel, reduction=None):
  sig = peat.analyze(jnp.asarray(t), jnp.asarray(g), reference=r)
  return peat.detect(sig, context={"kernel": kernel, "reduction": reduction})


def _flip(x: np.ndarray, where, bits) -> np.ndarray:
  out = np.array(x, copy=True)
  view = out.reshape(-1).view(np.uint32)
  for i in where:
    for b in bits:
      view[i] ^= np.uint32(1 << b)
  return out


@pytest.mark.parametrize("k", [768, 2048])
@pytest.mark.parametrize("nearest", [True, False])
def test_tf32_operands_are_precision_tf32_with_their_rounding(k, nearest):
  a, b = _matmul(k + nearest, 48, k, 96)
  g = np.asarray(jax.jit(jnp.matmul)(a, b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  t = np.asarray(jax.jit(jnp.matmul)(_round_bits(a, 13, nearest),
                                     _round_bits(b, 13, nearest)))
  d = _detect(t, g, r, "matmul", k)
  assert d.model == "precision:tf32", d.evidence
  assert d.verdict == "warn"
  want = "nearest_even" if nearest else "toward_zero"
  assert d.params["rounding"] == want, d.params
  if not nearest:  # the fitted shrink is the predicted u / ln 2
    assert d.params["shrink_u"] == pytest.approx(1 / np.log(2), rel=0.15)


def test_tf32_truncation_is_named_on_the_playback_path():
  a, b = _matmul(3, 64, 1024, 80)
  case = cal.CalibrationCase("matmul", "random", jnp.matmul,
                             (jnp.asarray(a), jnp.asarray(b)), reduction=1024)
  g = jax.jit(jnp.matmul)(a, b)
  r = cal.reference_of(case, case.inputs)
  t = jax.jit(jnp.matmul)(_round_bits(a, 13, False), _round_bits(b, 13, False))
  d = cal.diagnose(t, g, r, {"kernel": "matmul", "reduction": 1024},
                   probe=cal.probe_of(case, case.inputs), dtype=t.dtype)
  assert d.model == "precision:tf32", d.evidence
  assert d.verdict != "fail"


@pytest.mark.parametrize("bits", [(21, 24, 26), (19, 20, 22), (30, 25, 23)])
@pytest.mark.parametrize("base", ["exact", "tf32"])
def test_three_bit_upsets_in_few_elements_are_bitflips(bits, base):
  a, b = _matmul(sum(bits), 64, 768, 128)
  g = np.asarray(jax.jit(jnp.matmul)(a, b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  t = g if base == "exact" else np.asarray(jax.jit(jnp.matmul)(
      _round_bits(a, 13, True), _round_bits(b, 13, True)))
  where = np.random.default_rng(bits[0]).choice(g.size, 5, replace=False)
  t = _flip(t, where, bits)
  d = _detect(t, g, r, "matmul", 768)
  assert d.model == "bitflip", d.evidence
  assert d.verdict == "fail"
  assert set(bits) <= set(d.params["bits"]), d.params


def test_random_values_stay_random_values():
  a, b = _matmul(11, 64, 512, 128)
  g = np.asarray(jax.jit(jnp.matmul)(a, b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  rng = np.random.default_rng(12)
  t = g.copy()
  t.reshape(-1)[rng.choice(g.size, 4, replace=False)] = (
      3.0 * rng.standard_normal(4)).astype(np.float32)
  d = _detect(t, g, r, "matmul", 512)
  assert d.model == "random_value", d.evidence


def _tiny_rows(seed: int, scale: float):
  a, b = _matmul(seed, 64, 256, 96)
  a[[3, 17]] *= scale
  g = np.asarray(jax.jit(jnp.matmul)(a, b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  return g, r


@pytest.mark.parametrize("scale,below", [(1e-36, 1e-36), (1e-37, 1e-36),
                                         (1e-36, 1e-35)])
def test_tiny_outputs_flushed_to_zero_never_pass(scale, below):
  g, r = _tiny_rows(int(-np.log10(scale)), scale)
  t = np.where(np.abs(g) < below, np.float32(0), g)
  assert (t != g).any()
  d = _detect(t, g, r, "matmul", 256)
  assert d.verdict != "pass", d.evidence
  assert d.model == "ftz", d.evidence


@pytest.mark.parametrize("share", [0.5, 0.3])
def test_a_record_whose_scale_underflows_never_passes(share):
  rng = np.random.default_rng(int(share * 10))
  a = (1e-37 * rng.standard_normal((64, 256))).astype(np.float32)
  b = (rng.standard_normal((256, 96)) / 16).astype(np.float32)
  g = np.asarray(jax.jit(jnp.matmul)(a, b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  t = np.where((np.abs(g) < 1e-36) & (rng.random(g.shape) < share),
               np.float32(0), g)
  sig = jax.device_get(peat.analyze(jnp.asarray(t), jnp.asarray(g),
                                    reference=r))
  assert np.isfinite(sig.env_theta) and np.isfinite(sig.z_med_test)
  d = _detect(t, g, r, "matmul", 256)
  assert d.verdict != "pass", d.evidence


def test_a_correct_kernel_at_a_tiny_scale_is_not_failed():
  """The degenerate finding warns; it is no fault of its own."""
  rng = np.random.default_rng(5)
  a = (1e-36 * rng.standard_normal((32, 128))).astype(np.float32)
  b = (rng.standard_normal((128, 64)) / 8).astype(np.float32)
  g = np.asarray(jax.jit(jnp.matmul)(a, b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  t = np.asarray(jax.jit(lambda x, y: jnp.einsum("mk,kn->mn", x[:, ::-1],
                                                 y[::-1]))(a, b))
  d = _detect(t, g, r, "matmul", 128)
  assert d.verdict in ("pass", "warn"), d.evidence


@pytest.mark.parametrize("golden,kut", [
    ("gelu", "silu"), ("silu", "gelu")])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_another_activation_fails(golden, kut, dtype):
  fns = {"gelu": lambda v: jax.nn.gelu(v, approximate=False),
         "silu": jax.nn.silu}
  rng = np.random.default_rng(7)
  x = jnp.asarray((2.0 * rng.standard_normal((128, 384))).astype(np.float32)
                  ).astype(dtype)
  g = jax.jit(fns[golden])(x)
  t = jax.jit(fns[kut])(x)
  r = peat.analyzer.reference(fns[golden], x)
  d = peat.detect(peat.analyze(t, g, reference=r), context={"kernel": golden})
  assert d.verdict == "fail", (d.model, d.evidence)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_erf_and_tanh_gelu_forms_do_not_fail(dtype):
  rng = np.random.default_rng(8)
  x = jnp.asarray((2.0 * rng.standard_normal((128, 384))).astype(np.float32)
                  ).astype(dtype)
  erf = lambda v: jax.nn.gelu(v, approximate=False)
  g = jax.jit(erf)(x)
  t = jax.jit(lambda v: jax.nn.gelu(v, approximate=True))(x)
  r = peat.analyzer.reference(erf, x)
  d = peat.detect(peat.analyze(t, g, reference=r), context={"kernel": "gelu"})
  assert d.verdict != "fail", (d.model, d.evidence)


def _bf16(x: np.ndarray, nearest: bool) -> np.ndarray:
  return _round_bits(x, 16, nearest)


@pytest.mark.parametrize("kernel,share", [("softmax", 0.125), ("softmax", 0.5),
                                          ("gelu", 0.02)])
@pytest.mark.parametrize("nearest", [True, False])
def test_golden_rounded_to_a_coarser_format_is_rounding(kernel, share,
                                                        nearest):
  """Part of an output rounded to bf16 (rows of a softmax, scattered GELU
  elements): each such element equals its golden value rounded to bf16,
  which is that precision, never a permutation nor random values."""
  rng = np.random.default_rng(int(share * 100) + nearest)
  x = (3.0 * rng.standard_normal((128, 300))).astype(np.float32)
  fn = (jax.nn.softmax if kernel == "softmax"
        else lambda v: jax.nn.gelu(v, approximate=False))
  g = np.asarray(jax.jit(fn)(x))
  r = peat.analyzer.reference(fn, jnp.asarray(x))
  t = g.copy()
  if kernel == "softmax":
    rows = rng.random(128) < share
    t[rows] = _bf16(g[rows], nearest)
  else:
    m = rng.random(g.shape) < share
    t[m] = _bf16(g[m], nearest)
  d = _detect(t, g, r, kernel, 300 if kernel == "softmax" else None)
  assert d.model == "precision:bf16", d.evidence
  assert d.verdict == "warn"
  sig = jax.device_get(peat.analyze(jnp.asarray(t), jnp.asarray(g),
                                    reference=r))
  assert int(sig.n_out) == 0
  assert 0 < int(sig.n_rounded) <= int(np.sum((t != g) & (t != 0)))


def test_a_flip_over_partly_rounded_outputs_is_still_found():
  rng = np.random.default_rng(21)
  x = (3.0 * rng.standard_normal((128, 300))).astype(np.float32)
  g = np.asarray(jax.jit(jax.nn.softmax)(x))
  r = peat.analyzer.reference(jax.nn.softmax, jnp.asarray(x))
  t = g.copy()
  t[:16] = _bf16(g[:16], True)
  t = _flip(t, [40 * 300 + 7, 90 * 300 + 100], [29])
  d = _detect(t, g, r, "softmax", 300)
  assert d.model == "bitflip", d.evidence
  assert d.verdict == "fail"

