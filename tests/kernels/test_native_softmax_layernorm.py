"""Native softmax and layer norm KUTs: variants x dtypes vs float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.kernels import native
from peat_jax.kernels.checks import DTYPES, OUT_TINY, OUT_U, f64
from peat_jax.kernels.checks import layer_norm_golden, layer_norm_ref
from peat_jax.kernels.checks import randn, rng_for, softmax_ref

SM_VARIANTS = native.variants("softmax")
LN_VARIANTS = native.variants("layer_norm")
TILE = 8
# Row lengths not divisible by the tile (8) and one divisible.
ROWS = [(6, 37), (3, 4, 20), (5, 64)]

# Relative error bound of each variant's float computation of one row of
# length d (before the output rounding): recursive sums (d u), an exp with
# relative error e, inputs rounded with u_in (the error of exp(x - max) is
# then about |x - max| u_in).
def _sm_rtol(variant, d, spread):
  u = 2.0**-24
  base = 4 * (d * u + 8 * u)
  return {
      "fast_exp": base + 2 * 1.7e-4,
      "acc_bf16": base + d * 2.0**-8,
      "in_bf16": base + 2 * spread * 2.0**-8,
  }.get(variant, base)


@pytest.mark.parametrize("shape", ROWS, ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", SM_VARIANTS)
def test_softmax_matches_float64_reference(variant, dtype, shape):
  rng = rng_for("sm", variant, dtype, shape)
  x = randn(rng, shape, dtype, scale=2.0)
  out = jax.jit(lambda x: native.softmax(x, variant=variant, tile=TILE))(x)
  assert out.shape == x.shape and out.dtype == x.dtype
  ref = softmax_ref(x)
  xs = f64(x)
  spread = (xs.max(-1) - xs.min(-1)).max()
  rtol = _sm_rtol(variant, shape[-1], spread) + 2 * OUT_U[dtype] * (
      2 if variant == "rtz" else 1)
  err = np.abs(f64(out) - ref)
  assert (err <= rtol * ref + OUT_TINY[dtype]).all(), err.max()


def test_softmax_axis_and_vmap():
  rng = rng_for("sm-axis")
  x = randn(rng, (5, 7, 9), "float32")
  out = native.softmax(x, axis=1)
  np.testing.assert_allclose(out, jax.nn.softmax(x, axis=1), rtol=1e-5,
                             atol=1e-7)
  out_v = jax.vmap(lambda r: native.softmax(r, variant="tiled"))(x)
  np.testing.assert_array_equal(out_v, native.softmax(x, variant="tiled"))


def _ln_rtol(variant, d, dtype):
  u = 2.0**-24
  base = 8 * d * u
  extra = {"acc_bf16": d * 2.0**-8, "in_bf16": 8 * 2.0**-8,
           "naive_var": 1e-4}.get(variant, 0.0)
  return base + extra + 4 * OUT_U[dtype]


@pytest.mark.parametrize("shape", ROWS, ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", LN_VARIANTS)
def test_layer_norm_matches_float64_reference(variant, dtype, shape):
  rng = rng_for("ln", variant, dtype, shape)
  d = shape[-1]
  x = randn(rng, shape, dtype, scale=1.5, shift=0.5)
  scale = randn(rng, (d,), dtype, shift=1.0)
  bias = randn(rng, (d,), dtype, scale=0.5)
  out = jax.jit(lambda x, s, b: native.layer_norm(x, s, b, 1e-5,
                                                  variant=variant))(x, scale,
                                                                    bias)
  assert out.shape == x.shape and out.dtype == x.dtype
  ref = layer_norm_ref(x, scale, bias, 1e-5)
  # Errors scale with |xhat * scale| + |bias| (xhat is O(1)).
  mag = np.abs(layer_norm_ref(x, np.abs(f64(scale)), 0 * f64(bias), 1e-5))
  mag += np.abs(f64(bias)) + 1.0
  err = np.abs(f64(out) - ref)
  assert (err <= _ln_rtol(variant, d, dtype) * mag).all(), err.max()


def test_layer_norm_naive_variance_cancels():
  """E[x^2] - E[x]^2 loses the variance when |mean| >> std."""
  rng = rng_for("ln-cancel")
  x = randn(rng, (8, 256), "float32", scale=1.0, shift=300.0)
  s, b = jnp.ones(256), jnp.zeros(256)
  ref = layer_norm_ref(x, s, b, 1e-6)
  err = {v: np.abs(f64(native.layer_norm(x, s, b, variant=v)) - ref).max()
         for v in ("default", "welford", "naive_var")}
  assert err["naive_var"] > 100 * max(err["default"], err["welford"])


@pytest.mark.parametrize("kernel,variant", [("softmax", "ftz"),
                                            ("layer_norm", "ftz")])
def test_ftz_flushes_subnormal_outputs(kernel, variant):
  """Subnormal outputs survive in default and are zero with ftz (XLA CPU's
  own arithmetic would flush them, the custom call's does not)."""
  if kernel == "softmax":
    x = jnp.asarray(np.array([[0.0, -95.0, -96.0, 1.0]], np.float32))
    run = lambda v: np.asarray(native.softmax(x, variant=v))
    idx = (0, slice(1, 3))
  else:
    x = jnp.asarray(np.array([[1.0, -1.0, 2.0, -2.0]], np.float32))
    s = jnp.asarray(np.full(4, 1e-39, np.float32))
    run = lambda v: np.asarray(native.layer_norm(x, s, jnp.zeros(4), 1e-6,
                                                 variant=v))
    idx = (0, slice(None))
  default, ftz = run("default"), run(variant)
  tiny = np.finfo(np.float32).tiny
  assert (np.abs(default[idx]) > 0).all()
  assert (np.abs(default[idx]) < tiny).all()
  assert (ftz[idx] == 0).all()


@pytest.mark.parametrize("kernel,variants", [("softmax", SM_VARIANTS),
                                             ("layer_norm", LN_VARIANTS)])
def test_softmax_layernorm_bitwise_determinism(kernel, variants):
  rng = rng_for("det", kernel)
  x = randn(rng, (16, 77), "float32")
  for variant in variants:
    if kernel == "softmax":
      f = jax.jit(lambda x: native.softmax(x, variant=variant, tile=TILE))
    else:
      f = jax.jit(lambda x: native.layer_norm(x, jnp.ones(77), jnp.zeros(77),
                                              variant=variant))
    first = np.asarray(f(x)).tobytes()
    assert all(np.asarray(f(x)).tobytes() == first for _ in range(3)), variant


_GRAD_TOL = {"fast_exp": 2e-3, "acc_bf16": 5e-2, "in_bf16": 5e-2,
             "naive_var": 1e-3}


@pytest.mark.parametrize("variant", SM_VARIANTS)
def test_softmax_gradient_matches_golden(variant):
  rng = rng_for("sm-grad", variant)
  x, w = randn(rng, (4, 30), "float32"), randn(rng, (4, 30), "float32")
  gk = jax.jit(jax.grad(lambda x: jnp.sum(
      native.softmax(x, variant=variant, tile=TILE) * w)))(x)
  gg = jax.grad(lambda x: jnp.sum(jax.nn.softmax(x) * w))(x)
  tol = _GRAD_TOL.get(variant, 1e-5)
  np.testing.assert_allclose(gk, gg, rtol=tol, atol=tol)


@pytest.mark.parametrize("variant", LN_VARIANTS)
def test_layer_norm_gradient_matches_golden(variant):
  rng = rng_for("ln-grad", variant)
  x, w = randn(rng, (6, 24), "float32"), randn(rng, (6, 24), "float32")
  s, b = randn(rng, (24,), "float32", shift=1.0), randn(rng, (24,), "float32")
  lk = lambda x, s, b: jnp.sum(native.layer_norm(x, s, b, variant=variant) * w)
  lg = lambda x, s, b: jnp.sum(layer_norm_golden(x, s, b) * w)
  gk = jax.jit(jax.grad(lk, argnums=(0, 1, 2)))(x, s, b)
  gg = jax.grad(lg, argnums=(0, 1, 2))(x, s, b)
  tol = _GRAD_TOL.get(variant, 1e-4)
  for p, q in zip(gk, gg):
    np.testing.assert_allclose(p, q, rtol=tol, atol=tol)


def test_layer_norm_vmap_with_grad():
  """vmap over x with unbatched scale/bias (broadcast_all scale rows), and a
  per-example gradient that sums the scale cotangent correctly."""
  rng = rng_for("ln-vmap")
  x = randn(rng, (3, 5, 16), "float32")
  s, b = randn(rng, (16,), "float32", shift=1.0), randn(rng, (16,), "float32")
  out_v = jax.vmap(lambda r: native.layer_norm(r, s, b))(x)
  np.testing.assert_array_equal(out_v, native.layer_norm(x, s, b))
  per_ex = jax.vmap(jax.grad(lambda r, s: jnp.sum(
      native.layer_norm(r, s, b) ** 2), argnums=1), in_axes=(0, None))(x, s)
  golden = jax.vmap(jax.grad(lambda r, s: jnp.sum(
      layer_norm_golden(r, s, b) ** 2), argnums=1), in_axes=(0, None))(x, s)
  np.testing.assert_allclose(per_ex, golden, rtol=1e-4, atol=1e-4)
  # Batched scale too.
  sb = jnp.stack([s, 2 * s, 3 * s])
  out_b = jax.vmap(lambda r, s: native.layer_norm(r, s, b))(x, sb)
  np.testing.assert_allclose(out_b[2], layer_norm_golden(x[2], 3 * s, b),
                             rtol=1e-5, atol=1e-5)


def test_layer_norm_takes_a_bf16_model_s_float32_parameters():
  """A bf16 model keeps float32 scale and bias (vit_bf16): the kernel gets
  them in x's dtype, bitwise as if cast by the caller; float32 x with bf16
  parameters is still refused (no silent widening)."""
  rng = np.random.default_rng(41)
  x = jnp.asarray(rng.standard_normal((6, 48)) * 2 + 0.5, jnp.bfloat16)
  scale = jnp.asarray(1 + 0.1 * rng.standard_normal(48), jnp.float32)
  bias = jnp.asarray(0.1 * rng.standard_normal(48), jnp.float32)
  got = native.layer_norm(x, scale, bias)
  want = native.layer_norm(x, scale.astype(jnp.bfloat16),
                           bias.astype(jnp.bfloat16))
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got, np.float32),
                                np.asarray(want, np.float32))
  with pytest.raises(peat.PeatError, match="share one dtype"):
    native.layer_norm(x.astype(jnp.float32), scale.astype(jnp.bfloat16),
                      bias)
