"""Statistics that hold on quantized, tiny and near-zero outputs.

Relative errors are taken against a floor (the output's scale): an
element near zero moved by many of its own ULPs is still rounding at the
output's scale, whereas the same move on a typical element is a fault.
Outputs rounded to a 16-bit format hold many equal values: a few of them
exchanging neighbouring values is rounding, not a permutation. A dense
error inside the rounding envelope that no model names is looked at
(warn), not failed. Every case draws fresh seeded inputs; none is zero.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import injectors

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def _flip(g: jax.Array, idx: np.ndarray, bit: int) -> jax.Array:
  a = np.asarray(g)
  bits = a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).copy()
  bits.flat[idx] ^= np.asarray(1 << bit, bits.dtype)
  return jnp.asarray(bits.view(a.dtype))


def _detect(t, g, r, kernel="dot_general", reduction=64):
  sig = peat.analyze(t, g, r)
  return peat.detect(sig, context={"kernel": kernel, "reduction": reduction})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("size,fault", [(1e-4, False), (1.5, True)],
                         ids=["near_zero", "typical"])
def test_moves_far_in_own_ulps_are_faults_only_at_scale(dtype, seed, size,
                                                        fault):
  """Six elements of magnitude ``size`` (golden's RMS is ~1) each moved by
  16 of their own ULPs (a mantissa bit flipped; bit 16 for float32): near
  zero that is rounding at the output's scale, on typical values a flip."""
  rng = np.random.default_rng(seed)
  r = rng.standard_normal((128, 64))
  idx = rng.choice(r.size, 6, replace=False)
  r.flat[idx] = size * np.where(r.flat[idx] < 0, -1.0, 1.0)
  g = jnp.asarray(r, dtype)
  bit = 16 if fault and jnp.dtype(dtype).itemsize == 4 else 4
  d = _detect(_flip(g, idx, bit), g, r)
  if fault:
    assert d.model == "bitflip" and d.verdict == "fail", d
  else:
    assert d.verdict == "pass" and d.model in ("exact", "reordering"), d


@pytest.mark.parametrize("seed", (0, 1, 2))
def test_quantized_outputs_exchanging_neighbours_are_not_a_permutation(seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((64, 128)) * 3
  r = np.exp(x - x.max(-1, keepdims=True))
  r /= r.sum(-1, keepdims=True)
  g = np.asarray(jnp.asarray(r, jnp.bfloat16))
  vals = np.unique(g)
  flat_g, t = g.reshape(-1), g.copy().reshape(-1)
  pairs = 0
  for v1, v2 in zip(vals[100::2], vals[101::2]):  # neighbouring bf16 values
    i, j = np.nonzero(flat_g == v1)[0], np.nonzero(flat_g == v2)[0]
    if len(i) and len(j):
      t[i[0]], t[j[0]] = v2, v1
      pairs += 1
    if pairs == 8:
      break
  assert pairs == 8
  # The KUT's output holds golden's multiset of values, in other places.
  np.testing.assert_array_equal(np.sort(t), np.sort(flat_g))
  d = _detect(jnp.asarray(t.reshape(g.shape)), jnp.asarray(g), r,
              kernel="softmax", reduction=128)
  assert d.verdict == "pass" and d.model != "indexing", d


@pytest.mark.parametrize("seed", (0, 1))
def test_a_dense_error_inside_the_envelope_that_no_model_names_warns(seed):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(2.0 * rng.standard_normal((128, 96)), jnp.bfloat16)
  with jax.enable_x64(True):
    r = np.asarray(jax.nn.gelu(jnp.asarray(np.asarray(x, np.float64))))
  g = jax.nn.gelu(x)
  t = injectors.inject("reordering", jax.random.PRNGKey(seed), g,
                       share=0.2, ulps=3)
  sig = peat.analyze(t, g, r)
  d = peat.detect(sig, context={"kernel": "gelu", "reduction": 96})
  assert int(sig.n_beyond) == 0 and float(sig.noise_ratio) > 4.0
  assert d.verdict == "warn", d
  # The same error with one element far beyond the envelope fails.
  far = t.at[3, 5].set(g[3, 5] * 4 + 1)
  d = peat.detect(peat.analyze(far, g, r),
                  context={"kernel": "gelu", "reduction": 96})
  assert d.verdict == "fail", d


@pytest.mark.parametrize("dtype", (jnp.bfloat16, jnp.float32),
                         ids=lambda d: jnp.dtype(d).name)
def test_relative_errors_are_taken_against_the_scale(dtype):
  rng = np.random.default_rng(5)
  r = rng.standard_normal((64, 64))
  r.flat[rng.choice(r.size, 5, replace=False)] = 1e-30  # near zero
  g = jnp.asarray(r, dtype)
  t = jnp.asarray(np.asarray(g, np.float64) + 1e-6 * rng.standard_normal(
      r.shape), dtype)
  sig = jax.device_get(peat.analyze(t, g, r)._asdict())
  assert float(sig["rel_max"]) > 1e20  # the plain figure: absurd
  scaled = peat.analyzer.relative_to_scale(sig)
  bound = float(sig["abs_max"]) / float(sig["golden_rms"])
  assert 0 < scaled["rel_max"] <= bound < 1e-2
  assert 0 < scaled["rel_rms"] <= scaled["rel_max"]
  # A NaN figure stays NaN (never a smaller number in its place).
  assert np.isnan(peat.analyzer.relative_to_scale(
      {**sig, "rel_max": float("nan")})["rel_max"])


@pytest.mark.parametrize("dtype", (jnp.bfloat16, jnp.float32),
                         ids=lambda d: jnp.dtype(d).name)
def test_signs_of_values_near_zero_are_no_stuck_sign_bit(dtype):
  """Another formula of a derivative (GELU's far left tail, tiny and
  negative) gives the other sign to values near zero: the sign bit is the
  only one that differs, one way, yet the error is far below rounding at
  the output's scale. The same pattern on typical values is stuck."""
  rng = np.random.default_rng(8)
  r = rng.standard_normal((96, 64))
  near = rng.random(r.shape) < 0.2
  r[near] = 1e-12 * (1.0 + rng.random(near.sum()))
  g = jnp.asarray(r, dtype)
  t = jnp.where(jnp.asarray(near), -g, g)
  d = _detect(t, g, r, kernel="gelu", reduction=64)
  assert d.verdict == "pass" and d.model != "stuck_at", d
  typical = np.abs(r) > 0.5
  t = jnp.where(jnp.asarray(typical), -jnp.abs(g), g)
  d = _detect(t, g, r, kernel="gelu", reduction=64)
  assert d.verdict == "fail", d
