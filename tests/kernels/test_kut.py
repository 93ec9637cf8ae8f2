"""Tests of the KUT registry (peat_jax/kernels/kut.py)."""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import models
from peat_jax.kernels import kut as K


@pytest.fixture(scope="module")
def cnn():
  task = models.get_task("cnn", batch_size=16)
  return task, task.init_state(0), task.batch_at(0)


def test_unknown_spec_lists_known():
  with pytest.raises(peat.PeatError, match="native:matmul:acc_bf16"):
    K.resolve_kut("native:matmul:nope")
  with pytest.raises(peat.PeatError, match="known specs"):
    K.resolve_kut("cuda:matmul")
  with pytest.raises(peat.PeatError, match="tile"):
    K.resolve_kut("native:matmul:default@0")


def test_parse():
  s = K.parse_kut("native:matmul:tile_edge_bug@24")
  assert (s.kernel, s.variant, s.tile, s.site_kernel) == (
      "matmul", "tile_edge_bug", 24, "dot_general")
  sub, = K.resolve_kut("native:layer_norm:in_bf16")
  assert (sub.kernel, sub.phase, sub.backward) == ("layer_norm", "fwd",
                                                   "golden")
  assert K.resolve_kut("golden")[0].kut == peat.GOLDEN
  assert "golden" in K.known_specs()


def test_golden_spec_bitwise(cnn):
  task, state, batch = cnn
  step = jax.jit(peat.substitute(task.step_fn, *K.resolve_kut("golden")))
  (s1, m1), (s2, m2) = task.train_step(state, batch), step(state, batch)
  for a, b in zip(jax.tree.leaves((s1, m1)), jax.tree.leaves((s2, m2))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dn,ls,rs", [
    ((((1,), (0,)), ((), ())), (5, 7), (7, 3)),
    ((((0,), (0,)), ((), ())), (7, 5), (7, 3)),
    ((((1,), (1,)), ((), ())), (5, 7), (3, 7)),
    ((((2,), (1,)), ((0,), (0,))), (2, 5, 7), (2, 7, 3)),
    ((((3,), (3,)), ((0, 2), (0, 2))), (2, 4, 3, 6), (2, 5, 3, 6)),
    ((((1, 2), (0, 1)), ((), ())), (4, 3, 5), (3, 5, 6)),
    ((((2,), (0,)), ((), ())), (2, 3, 8), (8, 4, 2)),
])
def test_adapter_matches_dot_general(dn, ls, rs):
  k1, k2 = jax.random.split(jax.random.key(0))
  lhs = jax.random.normal(k1, ls, jnp.float32)
  rhs = jax.random.normal(k2, rs, jnp.float32)
  got = K.dot_general_adapter(lhs, rhs, dimension_numbers=dn)
  want = lax.dot_general(lhs, rhs, dn)
  ref = peat.reference_dot_general(lhs, rhs, dn)
  assert got.shape == want.shape and got.dtype == want.dtype
  # Within float32 rounding of the float64 reference, like the golden kernel.
  kred = K.dot_general_reduction((ls, rs), dn)
  tol = 4 * kred * np.finfo(np.float32).eps * np.abs(ref).max()
  assert np.abs(np.asarray(got, np.float64) - ref).max() <= tol
  assert np.abs(np.asarray(want, np.float64) - ref).max() <= tol


def test_native_matmul_vit_within_noise():
  task = models.get_task("vit", batch_size=8,
                         model_kwargs=dict(classes=10, dim=32, depth=1))
  state, batch = task.init_state(0), task.batch_at(0)
  tapped = jax.jit(peat.tap(task.step_fn,
                            *K.resolve_kut("native:matmul:default")))
  (_, metrics), taps = tapped(state, batch)
  assert taps and all(n.startswith("fwd/") for n in taps)
  assert np.isfinite(float(metrics["loss"]))
  for name, t in taps.items():
    g = np.asarray(t.golden, np.float64)
    d = np.abs(np.asarray(t.kut, np.float64) - g).max()
    k = t.inputs[0].shape[-1]
    assert d <= 8 * k * np.finfo(np.float32).eps * max(np.abs(g).max(), 1e-30), name


def test_conv_adapter_rejects_dilation():
  x = jnp.ones((1, 8, 8, 2)); w = jnp.ones((3, 3, 2, 4))
  dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
  with pytest.raises(peat.PeatError, match="site 'fwd/X/conv:0'.*dilation"):
    K.conv_adapter(x, w, window_strides=(1, 1), padding=((1, 1), (1, 1)),
                   lhs_dilation=(1, 1), rhs_dilation=(2, 2),
                   dimension_numbers=dn, feature_group_count=1,
                   batch_group_count=1, site="fwd/X/conv:0")
  got = K.conv_adapter(x, w, window_strides=(1, 1), padding=((1, 1), (1, 1)),
                       lhs_dilation=(1, 1), rhs_dilation=(1, 1),
                       dimension_numbers=dn, feature_group_count=1,
                       batch_group_count=1)
  want = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                  dimension_numbers=dn)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_composite_specs_run(cnn):
  task = models.get_task("vit", batch_size=4,
                         model_kwargs=dict(classes=10, dim=32, depth=1))
  state, batch = task.init_state(0), task.batch_at(0)
  for spec in ("native:softmax:default", "native:layer_norm:default"):
    step = jax.jit(peat.substitute(task.step_fn, *K.resolve_kut(spec)))
    _, m = step(state, batch)
    _, g = task.train_step(state, batch)
    assert abs(float(m["loss"]) - float(g["loss"])) < 1e-4, spec
