"""What the native matmul's backward computes, and why backward sites run
the KUT's VJP rather than the KUT's forward on the transposed products.

``peat_matmul_bwd`` (csrc/matmul.cc) packs ``dC`` and ``B`` transposed by
strides and runs the same GEMM core as the forward (``dA = dC B^T``,
``dB = A^T dC``): bitwise the forward kernel on the transposed operands,
for every deterministic variant. JAX's transposition makes other products:
the weight cotangent of ``x @ W`` is computed as ``dW^T = dY^T x`` (rows and
columns swapped), so the forward kernel at that backward site is another
computation wherever rows and columns are not symmetric in the kernel (the
unwritten edge tile of ``tile_edge_bug`` falls on the other dimension).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.kernels import kut as K
from peat_jax.kernels import native

VARIANTS = [v for v in native.variants("matmul") if v not in
            native.NONDETERMINISTIC]
M, KD, N, TILE = 24, 40, 36, 8
DX = (((1,), (1,)), ((), ()))  # JAX's dx site: dot_general(dY, W) -> (M, K)
DW = (((0,), (0,)), ((), ()))  # JAX's dW site: dot_general(dY, x) -> (N, K)


@pytest.fixture(scope="module")
def operands():
  rng = np.random.default_rng(7)
  return tuple(jnp.asarray(rng.standard_normal(s), jnp.float32)
               for s in ((M, KD), (KD, N), (M, N)))


def _vjp(variant, a, b, dc):
  mm = lambda x, y: native.matmul(x, y, variant=variant, tile=TILE)
  return jax.jit(lambda a, b, dc: jax.vjp(mm, a, b)[1](dc))(a, b, dc)


@pytest.mark.parametrize("variant", VARIANTS)
def test_backward_target_is_the_forward_kernel_on_transposed_operands(
    variant, operands):
  a, b, dc = operands
  da, db = _vjp(variant, a, b, dc)
  fwd = jax.jit(lambda x, y: native.matmul(x, y, variant=variant, tile=TILE))
  np.testing.assert_array_equal(np.asarray(da), np.asarray(fwd(dc, b.T)))
  np.testing.assert_array_equal(np.asarray(db), np.asarray(fwd(a.T, dc)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_kernel_at_jaxs_transposed_sites(variant, operands):
  """At dx the forward kernel on JAX's product equals the VJP; at dW it
  does for every variant but the one whose error depends on the layout."""
  a, b, dc = operands
  da, db = _vjp(variant, a, b, dc)
  at = lambda l, r, dn: np.asarray(K.dot_general_adapter(
      l, r, dimension_numbers=dn, variant=variant, tile=TILE))
  np.testing.assert_array_equal(at(dc, b, DX), np.asarray(da))
  dw = at(dc, a, DW).T
  if variant == "tile_edge_bug":
    assert np.abs(dw - np.asarray(db)).max() > 1.0  # other elements broken
  else:
    np.testing.assert_array_equal(dw, np.asarray(db))
