"""Tests of the float64 references (peat_jax.analyzer.references._references)."""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from peat_jax import analyzer as R
from peat_jax.core import PeatError


def _rand(shape, seed=0, dtype=np.float32):
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16,
                                   np.float16])
def test_matmul_is_float64_exact(dtype):
  a, b = _rand((5, 7), 1, dtype), _rand((7, 3), 2, dtype)
  r = R.reference_matmul(a, b)
  assert r.dtype == np.float64
  want = a.astype(np.float64) @ b.astype(np.float64)
  np.testing.assert_allclose(r, want, rtol=1e-14, atol=1e-14)
  assert not jax.config.jax_enable_x64  # the scope did not leak


def test_dot_general_and_conv():
  a, b = _rand((2, 4, 6), 3), _rand((2, 6, 5), 4)
  r = R.reference_dot_general(a, b, (((2,), (1,)), ((0,), (0,))))
  np.testing.assert_allclose(
      r, np.einsum("bik,bkj->bij", a.astype(np.float64), b.astype(np.float64)),
      rtol=1e-14)
  x, w = _rand((1, 6, 6, 2), 5), _rand((3, 3, 2, 4), 6)
  r = R.reference_conv(x, w, (1, 1), "VALID",
                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
  x64, w64 = x.astype(np.float64), w.astype(np.float64)
  want = np.zeros((1, 4, 4, 4))
  for i in range(4):
    for j in range(4):
      want[0, i, j] = np.einsum("hwc,hwco->o", x64[0, i:i + 3, j:j + 3], w64)
  np.testing.assert_allclose(r, want, rtol=1e-13, atol=1e-13)


def test_softmax_layer_norm_gelu():
  x = _rand((4, 9), 7)
  x64 = x.astype(np.float64)
  sm = R.reference_softmax(x)
  e = np.exp(x64 - x64.max(-1, keepdims=True))
  np.testing.assert_allclose(sm, e / e.sum(-1, keepdims=True), rtol=1e-14)
  np.testing.assert_allclose(sm.sum(-1), 1.0, rtol=1e-15)
  scale, bias = _rand((9,), 8), _rand((9,), 9)
  ln = R.reference_layer_norm(x, scale, bias, eps=1e-5)
  mu = x64.mean(-1, keepdims=True)
  var = ((x64 - mu)**2).mean(-1, keepdims=True)
  np.testing.assert_allclose(
      ln, (x64 - mu) / np.sqrt(var + 1e-5) * scale + bias, rtol=1e-13,
      atol=1e-14)
  ge = R.reference_gelu(x)
  want = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(
      x64)
  np.testing.assert_allclose(ge, want, rtol=1e-14, atol=1e-15)
  ga = R.reference_gelu(x, approximate=True)
  want = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                  (x64 + 0.044715 * x64**3)))
  np.testing.assert_allclose(ga, want, rtol=1e-13, atol=1e-15)


def test_attention_matches_numpy():
  q, k, v = _rand((2, 3, 2, 4), 10), _rand((2, 5, 2, 4), 11), _rand(
      (2, 5, 2, 4), 12)
  mask = np.tril(np.ones((3, 5), bool))[None, None]
  r = R.reference_attention(q, k, v, mask=mask)
  q64, k64, v64 = (z.astype(np.float64) for z in (q, k, v))
  logits = np.einsum("bthd,bshd->bhts", q64, k64) / 2.0
  logits = np.where(mask, logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  np.testing.assert_allclose(r, np.einsum("bhts,bshd->bthd", w, v64),
                             rtol=1e-13, atol=1e-15)


def test_grouped_query_attention_matches_numpy():
  """Four query heads over two key/value heads: head j uses kv head j // 2,
  as jax.nn.dot_product_attention does (its float32 result agrees)."""
  q, k, v = _rand((2, 6, 4, 8), 20), _rand((2, 6, 2, 8), 21), _rand(
      (2, 6, 2, 8), 22)
  r = R.reference_attention(q, k, v, is_causal=True)
  q64, k64, v64 = (z.astype(np.float64) for z in (q, k, v))
  out = np.empty(q.shape)
  causal = np.tril(np.ones((6, 6), bool))
  for j in range(4):
    lg = np.einsum("btd,bsd->bts", q64[:, :, j], k64[:, :, j // 2]) / math.sqrt(8)
    lg = np.where(causal, lg, -np.inf)
    w = np.exp(lg - lg.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out[:, :, j] = np.einsum("bts,bsd->btd", w, v64[:, :, j // 2])
  np.testing.assert_allclose(r, out, rtol=1e-13, atol=1e-15)
  xla = np.asarray(jax.nn.dot_product_attention(q, k, v, is_causal=True))
  np.testing.assert_allclose(xla, out, rtol=0, atol=1e-5 * np.abs(out).max())
  with pytest.raises(PeatError, match="multiple of k's"):
    R.reference_attention(q, _rand((2, 6, 3, 8), 23), _rand((2, 6, 3, 8), 24))


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_rotates_halves_in_float64(theta):
  x = _rand((2, 5, 3, 8), 25)
  pos = np.arange(5, dtype=np.int32) + 3
  r = R.reference_rope(x, pos, theta)
  x64 = x.astype(np.float64)
  out = np.empty_like(x64)
  for i in range(4):
    ang = pos * theta ** (-2 * i / 8)
    c, s = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
    out[..., i] = x64[..., i] * c - x64[..., 4 + i] * s
    out[..., 4 + i] = x64[..., 4 + i] * c + x64[..., i] * s
  np.testing.assert_allclose(r, out, rtol=1e-12, atol=1e-14)
  # A rotation keeps each (i, i + D/2) pair's norm.
  np.testing.assert_allclose(np.hypot(r[..., :4], r[..., 4:]),
                             np.hypot(x64[..., :4], x64[..., 4:]), rtol=1e-13)
  with pytest.raises(PeatError, match="even head_dim"):
    R.reference_rope(_rand((2, 5, 3, 7), 26), pos, theta)
  with pytest.raises(PeatError, match="one per token"):
    R.reference_rope(x, pos[:4], theta)


def test_cross_entropy_forms():
  z = _rand((6, 10), 13)
  y = np.arange(6) % 10
  r = R.reference_cross_entropy(z, y)
  z64 = z.astype(np.float64)
  lse = np.log(np.exp(z64).sum(-1))
  np.testing.assert_allclose(r, lse - z64[np.arange(6), y], rtol=1e-14)
  onehot = np.eye(10, dtype=np.float32)[y]
  np.testing.assert_allclose(R.reference_cross_entropy(z, onehot), r,
                             rtol=1e-14)


def test_generic_reference_and_registry():
  out = R.reference(lambda x: jnp.sum(x * x), np.float32(0.1))
  assert out.dtype == np.float64
  assert out == np.float64(np.float32(0.1))**2
  for name in ("matmul", "conv", "softmax", "layer_norm", "attention",
               "gelu", "silu", "rope", "cross_entropy"):
    assert callable(R.REFERENCES[name])


@pytest.mark.parametrize("kind", ["matmul_shape", "complex", "attn_ndim",
                                  "ce_labels"])
def test_bad_input_raises(kind):
  with pytest.raises(PeatError) as err:
    if kind == "matmul_shape":
      R.reference_matmul(_rand((3, 4)), _rand((5, 2)))
    elif kind == "complex":
      R.reference_softmax(np.ones(3, np.complex64))
    elif kind == "attn_ndim":
      R.reference_attention(_rand((3, 4)), _rand((3, 4)), _rand((3, 4)))
    elif kind == "ce_labels":
      R.reference_cross_entropy(_rand((4, 3)), np.zeros((5,), np.int32))
  assert "expected" in str(err.value) and "Fix" in str(err.value)
