"""Site-kernel adapters: a site's call computed by a native kernel.

``lax.dot_general`` as the native batched matmul (any dimension numbers,
through a transpose and reshape to ``(B, M, K) @ (B, K, N)``) and
``conv_general_dilated`` (NHWC/HWIO) as the native conv2d. ``kut`` and the
``ffi:`` adapters (``_user_ffi``) share these layouts.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.core import PeatError


def _dg_layout(lhs_shape, rhs_shape, dimension_numbers):
  (lc, rc), (lb, rb) = dimension_numbers
  lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
  lf = tuple(d for d in range(len(lhs_shape)) if d not in lc + lb)
  rf = tuple(d for d in range(len(rhs_shape)) if d not in rc + rb)
  return lc, rc, lb, rb, lf, rf


def dot_general_adapter(lhs: jax.Array, rhs: jax.Array, *,
                        dimension_numbers, precision=None,
                        preferred_element_type=None, out_sharding=None,
                        variant: str = "default",
                        tile: int | None = None) -> jax.Array:
  """``lax.dot_general`` computed by the native batched matmul.

  lhs is transposed and reshaped to (batch, M, K), rhs to (batch, K, N)
  (M, N, K the products of the free and contracting dims), the native
  matmul runs, and the (batch, M, N) result is reshaped to dot_general's
  layout: batch dims, lhs free dims, rhs free dims.

  Args:
    lhs: left operand.
    rhs: right operand (same dtype).
    dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch,
      rhs_batch))`` as for ``lax.dot_general``.
    precision: ignored (the native kernel has its own precision).
    preferred_element_type: output dtype; wider than the operands, they
      are widened to it first (the kernel accumulates there).
    out_sharding: ignored.
    variant: native matmul variant.
    tile: native tile (None: the kernel's default).

  Returns:
    The dot_general result.
  """
  del precision, out_sharding
  dtype = preferred_element_type or lhs.dtype
  if jnp.dtype(dtype).itemsize > jnp.dtype(lhs.dtype).itemsize:
    # A wider result than the operands (a bf16 model's attention logits:
    # bf16 operands, float32 result): the kernel runs on the operands
    # widened (exactly) to it and accumulates there, as golden does, not
    # in bf16 with a rounded result cast up.
    lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
  lp, rp, (b, m, k, n), out_shape = batched_matmul_layout(
      lhs.shape, rhs.shape, dimension_numbers)
  a = jnp.transpose(lhs, lp).reshape(b, m, k)
  w = jnp.transpose(rhs, rp).reshape(b, k, n)
  from peat_jax.kernels import native  # loads the FFI library on first use
  opts = {} if tile is None else {"tile": tile}
  out = native.matmul(a, w, variant=variant, **opts).reshape(out_shape)
  return out.astype(dtype)


def batched_matmul_layout(lhs_shape, rhs_shape, dimension_numbers):
  """How a ``dot_general`` maps to a batched matmul ``(B, M, K) @ (B, K, N)``.

  Args:
    lhs_shape: the left operand's shape.
    rhs_shape: the right operand's shape.
    dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch,
      rhs_batch))``.

  Returns:
    ``(lhs permutation, rhs permutation, (B, M, K, N), result shape)``:
    ``transpose(lhs, perm).reshape(B, M, K)`` and likewise
    ``(B, K, N)`` for rhs; the ``(B, M, N)`` product reshaped to the result
    shape is dot_general's result (batch, lhs free, rhs free dims).
  """
  lc, rc, lb, rb, lf, rf = _dg_layout(lhs_shape, rhs_shape, dimension_numbers)
  size = lambda shape, dims: int(np.prod([shape[d] for d in dims],
                                         dtype=np.int64))
  bmkn = (size(lhs_shape, lb), size(lhs_shape, lf), size(lhs_shape, lc),
          size(rhs_shape, rf))
  out = (tuple(lhs_shape[d] for d in lb) + tuple(lhs_shape[d] for d in lf)
         + tuple(rhs_shape[d] for d in rf))
  return lb + lf + lc, rb + rc + rf, bmkn, out


def dot_general_reduction(in_shapes: Sequence[Sequence[int]],
                          dimension_numbers) -> int:
  """Reduction length K of a dot_general (product of contracting dims)."""
  (lc, _), _ = dimension_numbers
  return int(np.prod([in_shapes[0][d] for d in lc], dtype=np.int64))


def _conv_layout_ok(dn) -> bool:
  lhs, rhs, out = dn.lhs_spec, dn.rhs_spec, dn.out_spec
  # NHWC: batch 0, feature 3, spatial (1, 2); HWIO: out 3, in 2, spatial (0, 1)
  return (tuple(lhs) == (0, 3, 1, 2) and tuple(rhs) == (3, 2, 0, 1)
          and tuple(out) == (0, 3, 1, 2))


def conv_adapter(lhs: jax.Array, rhs: jax.Array, *, window_strides, padding,
                 lhs_dilation, rhs_dilation, dimension_numbers,
                 feature_group_count, batch_group_count, precision=None,
                 preferred_element_type=None, variant: str = "default",
                 tile: int | None = None, site: str = "?",
                 **unused) -> jax.Array:
  """``conv_general_dilated`` (NHWC/HWIO, no dilation, one group) by native conv2d.

  Raises:
    PeatError: a layout, dilation or grouping the native kernel lacks,
      naming the site.
  """
  del precision, unused
  why = []
  if len(window_strides) != 2:
    why.append(f"{len(window_strides)} spatial dims (expected 2)")
  elif not _conv_layout_ok(dimension_numbers):
    why.append(f"layout {dimension_numbers} (expected NHWC/HWIO/NHWC)")
  if any(d != 1 for d in tuple(lhs_dilation or ()) + tuple(rhs_dilation or ())):
    why.append(f"dilation lhs={lhs_dilation} rhs={rhs_dilation} (expected 1)")
  if feature_group_count != 1 or batch_group_count != 1:
    why.append(f"groups feature={feature_group_count} "
               f"batch={batch_group_count} (expected 1)")
  if why:
    raise PeatError(
        f"native conv2d cannot run at site {site!r}: " + "; ".join(why)
        + ". Fix: select other sites (select=/pattern) or use a KUT that "
        "supports this convolution.")
  from peat_jax.kernels import native  # loads the FFI library on first use
  opts = {} if tile is None else {"tile": tile}
  out = native.conv2d(lhs, rhs, tuple(int(s) for s in window_strides),
                      [tuple(int(v) for v in p) for p in padding],
                      variant=variant, **opts)
  return out.astype(preferred_element_type or lhs.dtype)
