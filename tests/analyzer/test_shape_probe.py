"""Shape-gated slips named from the call's own inputs.

``peat.analyzer.shape_probe`` on kernels that slip the way shape-gated
bugs do (a GEMV that drops the last term of its contraction, a GEMM
epilogue whose last column repeats the one before, a sum kept in fp16 in
order past 2^11 terms, a layer norm whose wide rows skip a block of the
mean, a softmax whose row sum drops or doubles its last 64 terms), in
float32 and bf16: each is explained by its own hypothesis,
``peat.detector.named_by_inputs`` names the record after it and fails it;
correct kernels (the golden kernel computed another way) leave the
probe silent. Seeded inputs, float64 references.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import peat_jax as peat

_DN = (((1,), (0,)), ((), ()))
DTYPES = (np.float32, ml_dtypes.bfloat16)


def _rng(seed):
  return np.random.default_rng(seed)


def _gemm(m, k, n, dtype, seed=0):
  r = _rng(seed)
  x = (r.standard_normal((m, k)) + 0.1).astype(dtype)
  w = (r.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
  ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  return x, w, np.asarray(lax.dot_general(x, w, _DN)), ref


def _gemv_drop_last(x, w):
  return np.asarray(lax.dot_general(x[:, :-1], w[:-1], _DN))


def _gemv_other_layout(x, w):
  k, n = w.shape
  return (np.asarray(x, np.float32) @ np.asarray(w, np.float32).reshape(
      n, k).T).astype(x.dtype)


def _epilogue_repeat(x, w):
  out = np.asarray(lax.dot_general(x, w, _DN)).copy()
  out[:, -1] = out[:, -2]
  return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,slip,name", [
    (1, 384, _gemv_drop_last, "dropped_last_term"),
    (1, 96, _gemv_other_layout, "rhs_other_layout"),
    (32, 127, _epilogue_repeat, "repeated_last_column")])
def test_a_gemm_slip_is_named_from_its_inputs(dtype, m, n, slip, name):
  x, w, golden, ref = _gemm(m, 2048, n, dtype)
  found = peat.analyzer.shape_probe(
      "dot_general", (x, w), {"dimension_numbers": _DN}, slip(x, w), golden,
      ref)
  assert found["explains"] and found["name"] == name
  assert found["model"] == "indexing" and found["ratio"] < 0.05
  diag = peat.detector.named_by_inputs(
      {"model": "precision:fp8_e5m2", "verdict": "warn", "evidence": "-"},
      found)
  assert (diag["model"], diag["verdict"]) == ("indexing", "fail")
  assert diag["signature_model"] == "precision:fp8_e5m2"
  assert "fitted on the call's own inputs" in diag["evidence"]


def test_a_sum_kept_in_fp16_is_a_narrow_accumulator():
  x = np.abs(_rng(1).standard_normal((4, 1 << 15))).astype(np.float32)
  acc = np.zeros(4, np.float16)
  for i in range(x.shape[1]):  # the kernel under test: an fp16 running sum
    acc = (acc + x[:, i].astype(np.float16)).astype(np.float16)
  found = peat.analyzer.shape_probe(
      "reduce_sum", (x,), {"axes": (1,)}, acc.astype(np.float32),
      np.asarray(jnp.sum(x, -1)), x.astype(np.float64).sum(-1))
  assert found["explains"] and found["model"] == "accumulation:fp16"


def _ln64(x, skip=0):
  x = np.asarray(x, np.float64)
  part = np.concatenate([x[:, :1024], x[:, 1024 + skip:]], -1)
  m = part.sum(-1, keepdims=True) / x.shape[-1]
  v = np.square(x - m).mean(-1, keepdims=True)
  return (x - m) / np.sqrt(v + 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_layer_norm_that_skips_a_block_of_the_mean(dtype):
  c = 4096
  x = (_rng(2).standard_normal((16, c)) + 0.5).astype(dtype)
  golden = np.asarray(jax.nn.standardize(jnp.asarray(x, jnp.float32), axis=-1,
                                         epsilon=1e-6)).astype(dtype)
  test = _ln64(x, skip=128).astype(dtype)
  found = peat.analyzer.shape_probe(
      "layer_norm", (x, np.ones(c, dtype), np.zeros(c, dtype)),
      {"eps": 1e-6}, test, golden, _ln64(x))
  assert found["explains"] and found["name"] == "row_mean"
  assert found["model"] == "indexing"


def _softmax64(x, drop=0, twice=0):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  n = x.shape[-1]
  s = e[..., :n - drop].sum(-1, keepdims=True)
  if twice:
    s = s + e[..., n - twice:].sum(-1, keepdims=True)
  return e / s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("drop,twice,name", [
    (64, 0, "sum_without_last_64"), (0, 64, "sum_with_last_64_twice")])
def test_a_softmax_whose_sum_mishandles_its_tail(dtype, drop, twice, name):
  x = (_rng(4).standard_normal((24, 192)) * 2).astype(dtype)
  golden = np.asarray(jax.nn.softmax(jnp.asarray(x, jnp.float32))).astype(
      dtype)
  test = _softmax64(x, drop, twice).astype(dtype)
  found = peat.analyzer.shape_probe("softmax", (x,), {}, test, golden,
                                    _softmax64(x))
  assert found["explains"] and found["name"] == name
  assert found["model"] == "scale"


@pytest.mark.parametrize("dtype", DTYPES)
def test_correct_kernels_leave_the_probe_silent(dtype):
  x, w, golden, ref = _gemm(8, 512, 96, dtype, seed=3)
  # Another correct order: float64 products rounded once to the dtype.
  other = ref.astype(np.float32).astype(dtype)
  assert peat.analyzer.shape_probe(
      "dot_general", (x, w), {"dimension_numbers": _DN}, other, golden,
      ref) is None
  diag = {"model": "reordering", "verdict": "pass", "evidence": "-"}
  assert peat.detector.named_by_inputs(diag, None) == diag


def test_a_port_probe_that_explains_better_keeps_its_name():
  found = {"model": "indexing", "name": "repeated_last_column",
           "explains": True, "ratio": 0.2, "evidence": "e"}
  diag = {"model": "parameter", "verdict": "fail", "evidence": "eps"}
  port = {"model": "parameter", "explains": True, "ratio": 0.01}
  assert peat.detector.named_by_inputs(diag, found, port) == diag
  assert peat.detector.named_by_inputs(diag, found)["model"] == "indexing"
