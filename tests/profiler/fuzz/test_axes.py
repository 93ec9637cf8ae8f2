"""Every axis of every operand on the lattice, masks at softmax sites, and
the shrink to the smallest failing input.

Unit tests of ``peat_jax.profiler.fuzz._variants`` (the axes of each
kernel), ``_masks`` and ``_shrink`` on seeded inputs, no training run:
the axes a kernel has (a GEMM's N and M, a convolution's channels and
spatial dims, attention's heads, kv heads, head dim, q and kv lengths),
that each variant sets its axis and only cuts others to fit, that a mask
variant keeps real values and the mask's structure, and that a shrink
finds the smallest failing length of a shape-gated bug, rebuilt from its
name.
"""

import ml_dtypes
import numpy as np
import pytest
from jax import lax

from peat_jax.profiler.fuzz import _attention as A
from peat_jax.profiler.fuzz import _masks as M
from peat_jax.profiler.fuzz import _shrink as S
from peat_jax.profiler.fuzz import _variants as V

_DN = (((2,), (0,)), ((), ()))


def _x(shape, seed=0, dtype=np.float32):
  r = np.random.default_rng(seed)
  return (r.standard_normal(shape) * 2.0 + 0.25).astype(np.float32).astype(
      dtype)


def _names(plans):
  return {p.name: p for p in plans}


def _gemm(dtype=np.float32):
  return V.Call((_x((2, 40, 128), 1, dtype), _x((128, 384), 2, dtype)),
                {"dimension_numbers": _DN, "precision": None,
                 "preferred_element_type": None})


def _golden_dot(call):
  return lax.dot_general(*[np.asarray(a) for a in call.args],
                         call.kwargs["dimension_numbers"])


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_gemm_varies_batch_m_k_and_n(dtype):
  base = _gemm(dtype)
  axes = {a.name: a for a in V.primitive_axes("dot_general", base).axes()}
  assert {n: (a.family, a.size) for n, a in axes.items()} == {
      "batch": ("batch", 2), "m": ("rows", 40), "len": ("length", 128),
      "n": ("features", 384)}
  plans = _names(V.primitive_plans("dot_general", base, _golden_dot))
  for name, lhs, rhs in (("n=7", (2, 40, 128), (128, 7)),
                         ("n=192", (2, 40, 128), (128, 192)),
                         ("m=1", (2, 1, 128), (128, 384)),
                         ("len=129", (2, 40, 129), (129, 384))):
    call = plans[name].make(np.random.default_rng(0))
    assert (call.args[0].shape, call.args[1].shape) == (lhs, rhs), name
    assert call.args[0].dtype == dtype
  # A wide N cuts the contraction (last) only after the rows to fit.
  wide = plans["n=98304"].make(np.random.default_rng(0))
  assert wide.args[1].shape[1] == 98304
  assert max(x.size for x in wide.args) <= V.MAX_ELEMENTS


def test_a_convolution_varies_channels_and_spatial_dims():
  dn = lax.conv_dimension_numbers((2, 3, 16, 16), (8, 3, 3, 3),
                                  ("NCHW", "OIHW", "NCHW"))
  base = V.Call((_x((2, 3, 16, 16)), _x((8, 3, 3, 3), 1)),
                {"dimension_numbers": dn, "window_strides": (1, 1),
                 "padding": ((1, 1), (1, 1)), "feature_group_count": 1})
  names = {a.name: a.family for a in V.primitive_axes(
      "conv_general_dilated", base).axes()}
  assert names == {"batch": "batch", "len": "length",
                   "channels": "features", "spatial0": "spatial",
                   "window0": "spatial", "spatial1": "spatial",
                   "window1": "spatial"}
  plans = _names(V.primitive_plans("conv_general_dilated", base,
                                   lambda c: np.zeros(1)))
  out = plans["channels=7"].make(np.random.default_rng(0))
  assert out.args[1].shape == (7, 3, 3, 3)
  wide = plans["spatial1=65"].make(np.random.default_rng(0))
  assert wide.args[0].shape == (2, 3, 16, 65)


def _attention_call(h=4, hk=4):
  b, t, d = 2, 40, 32
  q, k, v = _x((b, t, h, d), 1), _x((b, t, hk, d), 2), _x((b, t, hk, d), 3)
  return V.Call((q, k, v, np.broadcast_to(A.causal(t, t), (1, 1, t, t))
                 .copy()), {})


def test_attention_varies_heads_kv_heads_head_dim_and_each_length():
  base = _attention_call(h=4, hk=2)
  axes = {a.name: a for a in A.axes(base)}
  assert set(axes) == {"batch", "len", "q_len", "kv_len", "heads",
                       "kv_heads", "head_dim"}
  assert axes["kv_heads"].sizes() == [1, 4]  # the divisors of H
  assert all(n % 2 == 0 for n in axes["heads"].sizes())  # multiples of Hk
  plans = _names(A.plans(base, None))
  kv = plans["kv_len=192"].make(np.random.default_rng(0))
  assert kv.args[0].shape[1] == 40 and kv.args[1].shape[1] == 192
  # Causal, q_len < kv_len: aligned bottom-right.
  np.testing.assert_array_equal(kv.args[3][0, 0], A.causal(40, 192, 152))
  heads = plans["heads=8"].make(np.random.default_rng(0))
  assert heads.args[0].shape[2] == 8 and heads.args[1].shape[2] == 2
  mha = _names(A.plans(_attention_call(), None))["heads=3"].make(
      np.random.default_rng(0))
  assert {a.shape[2] for a in mha.args[:3]} == {3}
  pad = plans["mask=padding"].make(np.random.default_rng(0)).args[3]
  assert pad.shape == (2, 1, 40, 40)
  kept = pad[:, 0].any(1).sum(-1)  # keys any query of a row keeps
  assert 39 in kept and (pad[:, 0] <= A.causal(40, 40)).all()
  # Every length keeps the golden kernel's scores bounded.
  big = plans["len=2047"].make(np.random.default_rng(0))
  b, t, h = big.args[0].shape[:3]
  assert b * h * t * big.args[1].shape[1] <= A.SCORES


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_softmax_masks_keep_real_values_and_their_structure(dtype):
  fill = float(ml_dtypes.finfo(dtype).min)
  x = _x((2, 3, 8, 8), 4, dtype)
  x[..., ~A.causal(8, 8)] = fill  # the model's causal scores
  real = set(np.asarray(x, np.float64).ravel().tolist())
  plans = _names(M.plans(V.Call((x,), {})))
  assert set(plans) == {"mask=padding", "mask=rows", "mask=causal_q<kv",
                        "mask=causal_q>kv"}
  rng = np.random.default_rng(0)
  for name, p in plans.items():
    y = p.make(rng).args[0]
    assert y.dtype == x.dtype, name
    assert set(np.asarray(y, np.float64).ravel().tolist()) <= real, name
  rows = plans["mask=rows"].make(rng).args[0].reshape(-1, 8)
  assert 1 <= (rows == fill).all(-1).sum() <= 6
  pad = plans["mask=padding"].make(rng).args[0]
  assert ((pad == fill) >= (x == fill)).all()  # on top of the causal mask
  short = plans["mask=causal_q<kv"].make(rng).args[0]
  assert short.shape == (2, 3, 4, 8)
  np.testing.assert_array_equal(short[0, 0] != fill, A.causal(4, 8, 4))
  long = plans["mask=causal_q>kv"].make(rng).args[0]
  np.testing.assert_array_equal(long[0, 0] != fill, A.causal(8, 4))


def _tail64_softmax(x):
  """Rows whose length is 64 past a multiple of 128 (and longer than 64)
  leave their last 64 columns out of the sum."""
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  n = x.shape[-1]
  stop = n - 64 if n % 128 == 64 and n > 64 else n
  return e / e[..., :stop].sum(-1, keepdims=True)


def _fails(call):
  ref = np.exp(call.args[0] - call.args[0].max(-1, keepdims=True))
  ref = ref / ref.sum(-1, keepdims=True)
  return not np.allclose(_tail64_softmax(call.args[0]), ref, rtol=1e-5)


def test_shrink_finds_the_smallest_failing_shape_and_rebuilds_it():
  base = V.Call((_x((4, 6, 320), 7),), {})
  axes = V.composite_axes("softmax", base).axes()
  wide = next(a for a in axes if a.name == "len").set(
      base, 4160, np.random.default_rng(1))  # 4160 % 128 == 64
  first = {"kind": "site", "diagnosis": {"verdict": "fail",
                                         "model": "truncation"}}
  runs = []

  def run(name, call):
    runs.append(name)
    return dict(first) if _fails(call) else {
        "kind": "site", "diagnosis": {"verdict": "pass", "model": "exact"}}
  got = S.shrink("softmax", True, "fwd/site:0", wide, "len=4160", first, run,
                 seed=3)
  assert got.name.startswith("min:len=4160:")
  call = S.rebuild("softmax", True, "fwd/site:0", wide, got.name, 3)
  assert call.args[0].shape == (1, 1, 192)  # the smallest L % 128 == 64 > 64
  assert _fails(call) and got.tries == len(runs) <= S.MAX_TRIES
  # Cut from the failing input: its own values, nothing drawn.
  assert set(call.args[0].ravel().tolist()) <= set(
      wide.args[0].ravel().tolist())


def test_a_failure_of_another_kind_does_not_count():
  first = {"kind": "site", "diagnosis": {"verdict": "fail",
                                         "model": "indexing:repeated"}}
  assert S.same_failure(first, first)
  assert not S.same_failure(first, {"kind": "site", "diagnosis": {
      "verdict": "warn", "model": "indexing:repeated"}})
  # One bug, named by its shape: still wrong values, the same failure.
  assert S.same_failure(first, {"kind": "site", "diagnosis": {
      "verdict": "fail", "model": "scale"}})
  for model in ("precision:fp16", "accumulation:bf16", "nan"):
    assert not S.same_failure(first, {"kind": "site", "diagnosis": {
        "verdict": "fail", "model": model}}), model
  err = {"kind": "fuzz_error", "error": "the KUT raised ValueError: bad"}
  assert S.same_failure(err, dict(err, error="the KUT raised ValueError: x"))
  assert not S.same_failure(err, dict(err, error="the KUT raised KeyError"))
  assert not S.same_failure(first, None)


def test_a_shrunk_name_is_checked():
  assert S.parse("min:len=4160:len=192,batch=1") == (
      "len=4160", [("len", 192), ("batch", 1)])
  for bad in ("len=4160", "min:len=4160:len=0", "min:len=4160:=3"):
    with pytest.raises(Exception, match="shrunk variant"):
      S.parse(bad)
