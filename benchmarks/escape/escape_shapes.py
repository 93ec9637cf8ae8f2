"""The escape suite's shape-gated JAX kernels under test, and their fixes.

Each is a ``py:`` KUT (docs/kernels.md, "Your own kernels") with its site
kernel's KUT signature, computed as ``models/layers.py`` computes (float32
inside for 16-bit inputs, one rounding at the end), whose bug lives only
on shapes that the small training runs (``gpt``: batch 2, context 40,
d_model 128, 4 heads of 32, vocabulary 256; ``cnn``, ``vit_bf16``) never
take: played back there it is golden to rounding noise. Each has a
``<name>_fixed`` twin, the same code with the bug removed, right on
every shape.

| function | site kernel | right on (gpt) | wrong on | the slip (precedent) |
| --- | --- | --- | --- | --- |
| ``softmax_tail64`` | ``softmax`` | rows of L = 40 | rows of L % 128 == 64 (64, 192, ...) | the row is reduced in 128-lane vectors; a half-full last vector (64 values) is loaded into both halves of the register instead of its high half being filled with -inf, so the tail's exponentials are counted twice in the normalizing sum (tenstorrent/tt-metal issue 4599 and PR 20008: softmax over padding that was not -inf) |
| ``softmax_tail64_long`` | ``softmax`` | rows of L = 40, and of L = 64 (one half vector) | rows of L % 128 == 64 longer than 64 (192, 320, ...) | the row loop sums the full 128-lane vectors and handles a partial last vector only when there is no full one: the last 64 columns of a longer row are left out of the normalizing sum (the ``% 128 == 64`` lengths of pytorch issue 196678) |
| ``matmul_gemv`` | ``dot_general`` | every site has 32 or more lhs rows | one lhs row (batch 1, one token: a decode step) | an M == 1 fast path calls a column-major GEMV on the row-major ``[K, N]`` operand with the transpose flag and leading dimension of the other layout: it reads the buffer as ``[N, K]`` (alibaba/BladeDISC PR 243: a GEMM with m == 1 diverted to a GEMV path wrong for what it was given) |
| ``matmul_ntail7`` | ``dot_general`` | every output width N of the training (32, 40, 128, 256, 384, 512: N % 8 == 0) | N % 8 == 7 (7, 15, ..., 383) | the epilogue stores the output row in 8-lane vectors; a last vector one lane short of full takes its last lane from the lane before: the last output column repeats the one before (a vector-tail slip in a GEMM epilogue) |
| ``matmul_corner`` | ``dot_general`` | every GEMM (M and N multiples of 8), and every variant that changes M or N alone | both M % 8 and N % 8 nonzero (M = 7 and N = 1, ...) | the corner tile, partial in rows and columns, is never stored: its store predicate tests the full blocks' bounds with ``or`` (a predicated GEMM epilogue's corner-tile slip; two axes together gate it) |
| ``gelu_flat_tail`` | ``gelu`` | every activation (its element count a multiple of 8), and every variant that changes one axis alone | element counts with ``size % 8 != 0`` | the flattened input is activated in 8-lane vectors and the remainder loop indexes from the buffer's start: the last ``size % 8`` outputs are those of the first elements (a vectorized elementwise kernel's scalar epilogue missing its offset; gated on the element count, not on any one axis) |
| ``attention_causal_topleft`` | ``attention`` | the causal mask ``tril[1, 1, 40, 40]`` (q_len == kv_len) | q_len != kv_len with a bottom-right-aligned causal mask (a KV cache, chunked prefill), packed sequences, any non-causal mask | the port maps "a mask is given" to the fused kernel's ``causal=True`` and drops the mask; its causal triangle is aligned top-left (``s <= t``) (Dao-AILab/flash-attention issue 517 and its 2.1 change: top-left vs bottom-right alignment once seqlen_q != seqlen_k) |
| ``attention_gqa_modulo`` | ``attention`` | H == Hk == 4 | fewer kv heads than query heads (grouped-query attention) | query head ``j`` given kv head ``j % Hk`` (kv heads tiled) instead of ``j // (H / Hk)`` (repeated) (onnx/onnx PR 7274: GQA expanded with Tile instead of repeat_interleave; ekzhang/jax-js PR 180) |
| ``layer_norm_wide`` | ``layer_norm`` | F = 128 | rows of F > 4096 features | the row is reduced in blocks of 4096; the sum of squared deviations is divided by the block's width, which is the row length only while the row fits in one block (vllm-project/vllm PR 44692: a fused norm validated at hidden size 4096 only; bytedance/lightseq PR 137: layer-norm kernels limited to hidden sizes below 4096) |
| ``reduce_max_two_pass`` | ``reduce_max`` | 40 (softmax) and 256 (cross-entropy) elements a reduction | more than 2**14 elements a reduction | past one pass of 2**14 elements the maxima of the blocks are combined by a second pass instantiated with the reduction template's default combiner (a sum from 0), not max: the block maxima are added, wrong on any signs (jax-ml/jax issue 18573, openxla/xla issue 7112: a min reduction right at 16,384 elements and wrong at 16,385, its split path's second level combining from the wrong start) |

The products (``matmul_gemv``'s rows, the attentions' batch elements) are
computed one at a time (``lax.map``), each at the same shape whatever the
batch: a row's result does not depend on the rest of the batch, so
``peat.validate(..., invariance=True)``'s probes (row 0 alone, half the
batch) see the same bits. One batched XLA dot would not: XLA's CPU dot
blocks a ``[1, 40, 128]`` and a ``[2, 40, 128]`` product differently, a
batch variance of rounding size that the Detector rightly warns about, and
not the bug these kernels carry.

Only ``attention_gqa_modulo`` is exposed by a repository scenario's
training: ``llama`` has 2 kv heads for 4 query heads. The same slip as a
port mismatch is ``peat_jax.kernels.ports.gqa_wrong_group``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

#: The vector width (lanes) of ``softmax_tail64``'s row loop.
SOFTMAX_LANES = 128
#: The block width of ``layer_norm_wide``'s row loop.
LAYER_NORM_BLOCK = 4096
#: The most elements ``reduce_max_two_pass`` reduces in one pass.
REDUCE_PASS = 1 << 14

_HIGHEST = lax.Precision.HIGHEST


def _f32(x: jax.Array) -> jax.Array:
  """``x`` in float32 when it is a narrower float (else ``x`` itself)."""
  return x.astype(jnp.float32) if jnp.finfo(x.dtype).bits < 32 else x


def _is_float(x) -> bool:
  return jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)


# ------------------------------------------------------------------ softmax


def _softmax(x: jax.Array, axis: int, bug: bool) -> jax.Array:
  """Softmax over ``axis``: the row's max and sum over 128-lane vectors."""
  xf = jnp.moveaxis(_f32(x), axis, -1)
  n = xf.shape[-1]
  full, rem = divmod(n, SOFTMAX_LANES)
  if bug and rem == SOFTMAX_LANES // 2:
    # The half-full last vector is loaded into both halves of the register.
    vec = jnp.concatenate([xf, xf[..., full * SOFTMAX_LANES:]], axis=-1)
  else:
    pad = (-n) % SOFTMAX_LANES
    vec = jnp.pad(xf, [(0, 0)] * (xf.ndim - 1) + [(0, pad)],
                  constant_values=-jnp.inf)
  vec = vec.reshape(xf.shape[:-1] + (-1, SOFTMAX_LANES))
  m = jnp.max(vec, axis=(-2, -1))[..., None]
  s = jnp.sum(jnp.exp(vec - m[..., None]), axis=(-2, -1))[..., None]
  y = jnp.exp(xf - m) / s
  return jnp.moveaxis(y, -1, axis).astype(x.dtype)


def softmax_tail64(x: jax.Array, axis: int = -1) -> jax.Array:
  """Softmax whose rows of ``L % 128 == 64`` count their tail twice.

  The row is reduced in vectors of 128 lanes, a partial last vector
  filled with -inf, except a half-full one (64 values), which the port
  loads into both halves of the register: the normalizing sum holds the
  tail's exponentials twice and every output of such a row is too small
  by the same factor (exactly 1/2 at L = 64).
  """
  return _softmax(x, axis, bug=True)


def softmax_tail64_fixed(x: jax.Array, axis: int = -1) -> jax.Array:
  """``softmax_tail64`` with every partial last vector filled with -inf."""
  return _softmax(x, axis, bug=False)


def softmax_tail64_long(x: jax.Array, axis: int = -1) -> jax.Array:
  """Softmax whose rows of ``L % 128 == 64``, ``L > 64``, drop their tail
  from the normalizing sum.

  The row loop sums the exponentials of its full 128-lane vectors and
  takes a partial last vector only when the row has no full one: on a
  row of 192, 320, ... values the last 64 are left out of the sum, so
  every output of the row is too large by the same factor (its maximum
  is taken over the whole row). Right on rows shorter than 128 and on
  every other remainder.
  """
  xf = jnp.moveaxis(_f32(x), axis, -1)
  n = xf.shape[-1]
  full, rem = divmod(n, SOFTMAX_LANES)
  if not (rem == SOFTMAX_LANES // 2 and full >= 1):
    return _softmax(x, axis, bug=False)
  m = jnp.max(xf, axis=-1, keepdims=True)
  e = jnp.exp(xf - m)
  s = jnp.sum(e[..., :full * SOFTMAX_LANES], axis=-1, keepdims=True)
  return jnp.moveaxis(e / s, -1, axis).astype(x.dtype)


def softmax_tail64_long_fixed(x: jax.Array, axis: int = -1) -> jax.Array:
  """``softmax_tail64_long`` summing its partial last vector too."""
  return _softmax(x, axis, bug=False)


# -------------------------------------------------------------- dot_general


def _dot_general(lhs, rhs, dimension_numbers, precision,
                 preferred_element_type, bug: bool) -> jax.Array:
  """``dot_general`` as batched ``[M, K] x [K, N]`` products in float32."""
  want = jax.eval_shape(
      lambda a, b: lax.dot_general(
          a, b, dimension_numbers, precision=precision,
          preferred_element_type=preferred_element_type),
      jax.ShapeDtypeStruct(lhs.shape, lhs.dtype),
      jax.ShapeDtypeStruct(rhs.shape, rhs.dtype))
  if not (_is_float(lhs) and _is_float(rhs)):
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)
  (lc, rc), (lb, rb) = dimension_numbers
  lc, rc, lb, rb = (tuple(int(d) for d in ds) for ds in (lc, rc, lb, rb))
  lf = tuple(d for d in range(lhs.ndim) if d not in lc + lb)
  rf = tuple(d for d in range(rhs.ndim) if d not in rc + rb)
  size = lambda shape, dims: math.prod(int(shape[d]) for d in dims)
  nb, m, k = size(lhs.shape, lb), size(lhs.shape, lf), size(lhs.shape, lc)
  n = size(rhs.shape, rf)
  a = jnp.transpose(lhs, lb + lf + lc).reshape(nb, m, k).astype(jnp.float32)
  b = jnp.transpose(rhs, rb + rc + rf).reshape(nb, k, n).astype(jnp.float32)
  if bug and m == 1:
    # The GEMV path: the row-major [K, N] buffer read as if it were [N, K].
    row = lambda x, y: jnp.einsum("mk,nk->mn", x, y.reshape(n, k),
                                  precision=_HIGHEST)
    batched = lambda x, y: jnp.einsum("bmk,bnk->bmn", x,
                                      y.reshape(nb, n, k),
                                      precision=_HIGHEST)
  else:
    row = lambda x, y: jnp.einsum("mk,kn->mn", x, y, precision=_HIGHEST)
    batched = lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y,
                                      precision=_HIGHEST)
  out = _by_row(row, batched, a, b)
  return out.reshape(want.shape).astype(want.dtype)


def _by_row(row, batched, a: jax.Array, b: jax.Array) -> jax.Array:
  """``row(a[i, j][None], b[i])`` for every batch ``i`` and row ``j``,
  one row at a time: the same ``[1, K] x [K, N]`` product whatever the
  batch and the number of rows (batch invariant). Its gradients are those
  of ``batched`` (the same product as one batched einsum): a scan's
  transpose would add the rows' contributions to ``b``'s gradient one
  after the other."""

  @jax.custom_vjp
  def product(x, y):
    if not (x.size and y.size):
      return batched(x, y)
    return lax.map(lambda xy: lax.map(
        lambda r: row(r[None], xy[1])[0], xy[0]), (x, y))

  def fwd(x, y):
    return product(x, y), (x, y)

  def bwd(res, ct):
    return jax.vjp(batched, *res)[1](ct)

  product.defvjp(fwd, bwd)
  return product(a, b)


#: The epilogue's vector width (lanes) of ``matmul_ntail7``.
NTAIL_LANES = 8


def matmul_ntail7(lhs, rhs, *, dimension_numbers, precision=None,
                  preferred_element_type=None, out_sharding=None):
  """``lax.dot_general`` whose last output column repeats the one before
  when the output width ``N % 8 == 7``.

  The products are those of ``matmul_gemv_fixed`` (right on every
  shape); the epilogue writes each output row in vectors of 8 lanes, and
  a last vector one lane short of full takes its last lane from the lane
  before. Right on every N that is not 7 past a multiple of 8 (and on
  N = 1... 6 past it).
  """
  del out_sharding
  out = _dot_general(lhs, rhs, dimension_numbers, precision,
                     preferred_element_type, bug=False)
  (_, rc), (_, rb) = dimension_numbers
  rf = [d for d in range(rhs.ndim) if d not in tuple(rc) + tuple(rb)]
  n = math.prod(int(rhs.shape[d]) for d in rf)
  if n % NTAIL_LANES != NTAIL_LANES - 1 or n < 2 or not _is_float(out):
    return out
  flat = out.reshape(out.shape[:out.ndim - len(rf)] + (n,))
  flat = flat.at[..., n - 1].set(flat[..., n - 2])
  return flat.reshape(out.shape)


def matmul_ntail7_fixed(lhs, rhs, *, dimension_numbers, precision=None,
                        preferred_element_type=None, out_sharding=None):
  """``matmul_ntail7`` whose epilogue writes its last lane from its own."""
  del out_sharding
  return _dot_general(lhs, rhs, dimension_numbers, precision,
                      preferred_element_type, bug=False)


def matmul_gemv(lhs, rhs, *, dimension_numbers, precision=None,
                preferred_element_type=None, out_sharding=None):
  """``lax.dot_general`` whose one-row (GEMV) path reads ``rhs`` transposed.

  The port brings the operands to ``[batch, M, K] x [batch, K, N]``
  (row-major) and, when the product of the left operand's free dims
  ``M`` is 1, hands each batch to a column-major GEMV with the transpose
  flag and leading dimension of the other layout: ``out[n] = sum_k a[k] *
  B.flat[n * K + k]``. Right for ``M > 1`` (and where ``K`` or ``N`` is
  1); wrong on one row whatever ``K``.
  """
  del out_sharding
  return _dot_general(lhs, rhs, dimension_numbers, precision,
                      preferred_element_type, bug=True)


def matmul_gemv_fixed(lhs, rhs, *, dimension_numbers, precision=None,
                      preferred_element_type=None, out_sharding=None):
  """``matmul_gemv`` whose GEMV path reads ``rhs`` as ``[K, N]``."""
  del out_sharding
  return _dot_general(lhs, rhs, dimension_numbers, precision,
                      preferred_element_type, bug=False)


#: The tile (rows and columns) of ``matmul_corner``'s output blocks.
CORNER_TILE = 8


def matmul_corner(lhs, rhs, *, dimension_numbers, precision=None,
                  preferred_element_type=None, out_sharding=None):
  """``lax.dot_general`` whose output corner tile is never stored when
  both ``M % 8`` and ``N % 8`` are nonzero.

  The products are those of ``matmul_gemv_fixed``; the output is stored
  in 8 x 8 tiles, and the store predicate of the tile that is partial in
  both rows and columns tests ``row < M_full or col < N_full`` (the full
  blocks' bounds) where it means ``and`` of the true bounds: nothing of
  that corner is written, and it keeps the zeros the buffer was cleared
  with. Right wherever M or N is a multiple of 8 (every GEMM of the
  training run, and every variant that changes one of them alone); wrong
  in ``(M % 8) * (N % 8)`` outputs of every other product (a predicated
  epilogue's corner-tile slip).
  """
  del out_sharding
  out = _dot_general(lhs, rhs, dimension_numbers, precision,
                     preferred_element_type, bug=False)
  (lc, rc), (lb, rb) = dimension_numbers
  lf = [d for d in range(lhs.ndim) if d not in tuple(lc) + tuple(lb)]
  rf = [d for d in range(rhs.ndim) if d not in tuple(rc) + tuple(rb)]
  m = math.prod(int(lhs.shape[d]) for d in lf)
  n = math.prod(int(rhs.shape[d]) for d in rf)
  if not (m % CORNER_TILE and n % CORNER_TILE) or not _is_float(out):
    return out
  lead = out.shape[:out.ndim - len(lf) - len(rf)]
  tiles = out.reshape(lead + (m, n))
  m0, n0 = m - m % CORNER_TILE, n - n % CORNER_TILE
  tiles = tiles.at[..., m0:, n0:].set(0)
  return tiles.reshape(out.shape)


def matmul_corner_fixed(lhs, rhs, *, dimension_numbers, precision=None,
                        preferred_element_type=None, out_sharding=None):
  """``matmul_corner`` storing its corner tile."""
  del out_sharding
  return _dot_general(lhs, rhs, dimension_numbers, precision,
                      preferred_element_type, bug=False)


# --------------------------------------------------------------------- gelu

#: The vector width (lanes) of ``gelu_flat_tail``'s loop.
GELU_LANES = 8


def _gelu(x: jax.Array) -> jax.Array:
  return jax.nn.gelu(_f32(x), approximate=False).astype(x.dtype)


def gelu_flat_tail(x, *, approximate=False):
  """GELU over the flattened input in 8-lane vectors whose remainder
  loop indexes from the start of the buffer: the last ``t = size % 8``
  outputs of the flattened input are ``gelu(x[0]) ... gelu(x[t - 1])``
  (``i`` where ``size - t + i`` was meant).

  Right on every input whose element count is a multiple of 8 (every
  activation of the training run: its batch, tokens and features all
  are, so is every variant that changes one axis alone); wrong on the
  tail of every other (a vectorized elementwise kernel's scalar epilogue
  missing its offset).
  """
  if approximate:  # the tanh form is not what this port implements
    return jax.nn.gelu(x, approximate=True)
  y = _gelu(x)
  tail = x.size % GELU_LANES
  if not tail or not _is_float(x):
    return y
  flat = y.reshape(-1)
  flat = flat.at[x.size - tail:].set(flat[:tail])
  return flat.reshape(x.shape)


def gelu_flat_tail_fixed(x, *, approximate=False):
  """``gelu_flat_tail`` with its remainder loop."""
  if approximate:
    return jax.nn.gelu(x, approximate=True)
  return _gelu(x)


# ---------------------------------------------------------------- attention


def _attention(q, k, v, mask, bias, scale, is_causal, *, top_left: bool,
               modulo: bool) -> jax.Array:
  """Softmax attention in float32, one rounding to q's dtype.

  ``top_left``: the given mask replaced by a top-left causal triangle
  wherever there is one; ``modulo``: query head ``j`` on kv head ``j %
  Hk``.
  """
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"attention: q, k, v must be [batch, length, heads, "
                     f"head_dim]; got {q.shape}, {k.shape}, {v.shape}")
  h, hk = q.shape[2], k.shape[2]
  if hk == 0 or h % hk or v.shape[2] != hk:
    raise ValueError(f"attention: q's heads ({h}) must be a multiple of "
                     f"k's and v's ({hk}, {v.shape[2]})")
  heads = np.arange(h)
  idx = heads % hk if modulo else heads // (h // hk)
  kf, vf = _f32(k)[:, :, idx], _f32(v)[:, :, idx]
  d = q.shape[-1]
  scale = 1.0 / math.sqrt(d) if scale is None else scale
  # One batch element at a time (batch invariant, module docstring).
  s = lax.map(lambda qk: jnp.einsum("thd,shd->hts", *qk, precision=_HIGHEST),
              (_f32(q), kf)) * jnp.float32(scale)
  if bias is not None:
    s = s + _f32(jnp.asarray(bias))
  t, sk = s.shape[-2:]
  tril = jnp.tril(jnp.ones((t, sk), bool))
  fill = jnp.finfo(jnp.float32).min
  if top_left:
    if mask is not None or is_causal:  # any mask taken for causal=True
      s = jnp.where(tril, s, fill)
  else:
    if mask is not None:
      s = jnp.where(mask, s, fill)
    if is_causal:  # JAX's is_causal: top-left, as jax.nn.dot_product_attention
      s = jnp.where(tril, s, fill)
  p = jax.nn.softmax(s, axis=-1)
  out = lax.map(lambda pv: jnp.einsum("hts,shd->thd", *pv,
                                      precision=_HIGHEST), (p, vf))
  return out.astype(q.dtype)


def attention_causal_topleft(q, k, v, mask=None, *, bias=None, scale=None,
                             is_causal=False):
  """Attention that takes any mask for a top-left causal triangle.

  The port's fused kernel has a ``causal`` flag and no mask: it passes
  ``causal=True`` whenever a mask is given and drops the mask, and its
  triangle keeps ``s <= t`` (aligned top-left). Right for the usual causal
  mask when q_len == kv_len (and without a mask); wrong for a
  bottom-right-aligned causal mask (``s <= t + S - T``) when q_len !=
  kv_len, for packed sequences' block-diagonal masks and for any other
  mask.
  """
  return _attention(q, k, v, mask, bias, scale, is_causal, top_left=True,
                    modulo=False)


def attention_causal_topleft_fixed(q, k, v, mask=None, *, bias=None,
                                   scale=None, is_causal=False):
  """``attention_causal_topleft`` that applies the mask it is given."""
  return _attention(q, k, v, mask, bias, scale, is_causal, top_left=False,
                    modulo=False)


def attention_gqa_modulo(q, k, v, mask=None, *, bias=None, scale=None,
                         is_causal=False):
  """Grouped-query attention with the kv heads tiled, not repeated.

  Query head ``j`` attends with kv head ``j % Hk`` instead of ``j // (H /
  Hk)``: right when ``Hk == H`` (every site of ``gpt``) or ``Hk == 1``,
  the values of other heads' attention when ``1 < Hk < H``.
  """
  return _attention(q, k, v, mask, bias, scale, is_causal, top_left=False,
                    modulo=True)


def attention_gqa_modulo_fixed(q, k, v, mask=None, *, bias=None,
                               scale=None, is_causal=False):
  """``attention_gqa_modulo`` with query head ``j`` on kv head ``j // (H /
  Hk)``."""
  return _attention(q, k, v, mask, bias, scale, is_causal, top_left=False,
                    modulo=False)


# --------------------------------------------------------------- layer norm


def _layer_norm(x, scale, bias, eps, bug: bool) -> jax.Array:
  """Layer norm over the last axis, its statistics over blocks of 4096."""
  xf = _f32(x)
  n = xf.shape[-1]
  width = min(n, LAYER_NORM_BLOCK)
  pad = (-n) % width
  spread = [(0, 0)] * (xf.ndim - 1) + [(0, pad)]
  blocks = jnp.pad(xf, spread).reshape(xf.shape[:-1] + (-1, width))
  valid = jnp.pad(jnp.ones((n,), bool), (0, pad)).reshape(-1, width)
  mean = jnp.sum(blocks, axis=(-2, -1))[..., None, None] / n
  dev = jnp.where(valid, blocks - mean, 0.0)
  m2 = jnp.sum(jnp.square(dev), axis=(-2, -1))[..., None]
  var = m2 / (width if bug else n)  # the slip: the block's width
  y = (xf - mean[..., 0]) * lax.rsqrt(var + eps)
  if scale is not None:
    y = y * scale
  if bias is not None:
    y = y + bias
  return y.astype(x.dtype)


def layer_norm_wide(x, scale, bias, eps=1e-6):
  """Layer norm whose variance is divided by 4096 on rows of F > 4096.

  The row is reduced in blocks of 4096 features; the sum of squared
  deviations is divided by the block's width, the row length while the
  row fits in one block: past 4096 features the variance is ``F / 4096``
  times too large and the normalized values too small by ``sqrt(4096 /
  F)``.
  """
  return _layer_norm(x, scale, bias, eps, bug=True)


def layer_norm_wide_fixed(x, scale, bias, eps=1e-6):
  """``layer_norm_wide`` dividing by the row length ``F``."""
  return _layer_norm(x, scale, bias, eps, bug=False)


# --------------------------------------------------------------- reduce_max


def _reduce_max(x, axes, bug: bool) -> jax.Array:
  """``reduce_max`` in passes of at most 2**14 elements a reduction."""
  axes = tuple(sorted(int(a) % x.ndim for a in axes))
  n = math.prod(int(x.shape[a]) for a in axes)
  if n <= REDUCE_PASS or not _is_float(x):
    return lax.reduce_max(x, axes)
  keep = tuple(a for a in range(x.ndim) if a not in axes)
  rows = jnp.transpose(_f32(x), keep + axes).reshape(
      tuple(x.shape[a] for a in keep) + (n,))
  spread = [(0, 0)] * len(keep) + [(0, (-n) % REDUCE_PASS)]
  blocks = jnp.pad(rows, spread, constant_values=-jnp.inf).reshape(
      rows.shape[:-1] + (-1, REDUCE_PASS))
  partial = jnp.max(blocks, axis=-1)  # first pass: right
  if bug:  # second pass: the template's default combiner, a sum from 0
    out = jnp.sum(partial, axis=-1)
  else:
    out = jnp.max(partial, axis=-1)
  return out.astype(x.dtype)


def reduce_max_two_pass(x, *, axes, **params):
  """``lax.reduce_max`` whose second pass adds the blocks' maxima.

  Up to 2**14 elements a reduction take one pass (right); past it the
  blocks of 2**14 are reduced right and their maxima combined by a sum
  starting from 0: ``max(block 0) + max(block 1) + ...``. At 2**14 + 1
  elements the output is the max of the first 2**14 plus the last
  element, wrong on mixed-sign activations as on one-signed ones.
  """
  del params
  return _reduce_max(x, axes, bug=True)


def reduce_max_two_pass_fixed(x, *, axes, **params):
  """``reduce_max_two_pass`` combining the blocks' maxima by max."""
  del params
  return _reduce_max(x, axes, bug=False)
