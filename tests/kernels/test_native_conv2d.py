"""Native conv2d KUT (im2col + GEMM): variants x dtypes vs float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.kernels import native
from peat_jax.kernels.checks import DTYPES, conv_abs, conv_golden, conv_ref
from peat_jax.kernels.checks import f64, gemm_rel_tol, randn, rng_for

VARIANTS = native.variants("conv2d")
TILE = 16
# (x shape, w shape, strides, padding); O = 20 is not a multiple of the tile.
CASES = [((2, 9, 7, 3), (3, 3, 3, 20), (1, 1), "SAME"),
         ((1, 8, 10, 4), (2, 3, 4, 16), (2, 1), ((1, 0), (2, 1)))]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_conv2d_matches_float64_reference(variant, dtype, case):
  xs, ws, strides, padding = CASES[case]
  rng = rng_for("conv", variant, dtype, case)
  x, w = randn(rng, xs, dtype), randn(rng, ws, dtype)
  out = jax.jit(lambda x, w: native.conv2d(x, w, strides, padding,
                                           variant=variant, tile=TILE))(x, w)
  ref = conv_ref(x, w, strides, padding)
  assert out.shape == ref.shape and out.dtype == x.dtype
  k = ws[0] * ws[1] * ws[2]
  ok = np.abs(f64(out) - ref) <= (
      gemm_rel_tol(variant, k, dtype) * conv_abs(x, w, strides, padding) +
      1e-30)
  o = ws[3]
  if variant == "tile_edge_bug" and o % TILE:
    edge = (o // TILE) * TILE  # output channels of the buggy edge tile
    assert ok[..., :edge].all() and not ok[..., edge:].all()
  else:
    assert ok.all(), float((~ok).mean())


_GRAD_TOL = {"in_tf32": 1e-2, "in_fp16": 1e-2, "in_bf16": 1e-1,
             "acc_fp16": 5e-2, "acc_bf16": 3e-1}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_conv2d_gradients_match_golden(variant, case):
  xs, ws, strides, padding = CASES[case]
  rng = rng_for("conv-grad", variant, case)
  x, w = randn(rng, xs, "float32"), randn(rng, ws, "float32")
  y = conv_golden(x, w, strides, padding)
  g = randn(rng, y.shape, "float32")
  lk = lambda x, w: jnp.sum(native.conv2d(x, w, strides, padding,
                                          variant=variant) * g)
  lg = lambda x, w: jnp.sum(conv_golden(x, w, strides, padding) * g)
  gk = jax.jit(jax.grad(lk, argnums=(0, 1)))(x, w)
  gg = jax.grad(lg, argnums=(0, 1))(x, w)
  tol = _GRAD_TOL.get(variant, 1e-4)
  for p, q in zip(gk, gg):
    np.testing.assert_allclose(p, q, rtol=tol, atol=tol * 10)


def test_conv2d_determinism_and_vmap():
  rng = rng_for("conv-det")
  x, w = randn(rng, (3, 2, 6, 6, 2), "float32"), randn(rng, (3, 3, 2, 5),
                                                       "float32")
  for variant in VARIANTS:
    if variant in native.NONDETERMINISTIC:
      continue
    f = jax.jit(lambda x: native.conv2d(x, w, variant=variant, tile=TILE))
    first = np.asarray(f(x[0])).tobytes()
    assert np.asarray(f(x[0])).tobytes() == first, variant
  out_v = jax.vmap(lambda x: native.conv2d(x, w))(x)
  np.testing.assert_allclose(
      out_v, jnp.stack([conv_golden(xi, w) for xi in x]), rtol=1e-5, atol=1e-5)
