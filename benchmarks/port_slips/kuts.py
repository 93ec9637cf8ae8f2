"""Kernel ports with one slip each, and their correct twins, as ``py:`` KUTs.

Each function has the KUT signature of its site kernel (docs/kernels.md,
"The KUT signature of each site kernel") and is written the way a kernel
engineer writes a port: its own loops, tiles and formulas, computed in
float32 and rounded once to the site's dtype. None of them calls the
golden kernel and perturbs its output: the slip is in the port's code.

| function | site kernel | what it does | the slip a kernel engineer would name |
| --- | --- | --- | --- |
| ``conv_im2col`` | conv_general_dilated | im2col patches times the filter reshaped to a matrix | none (control) |
| ``conv_im2col_flipped`` | conv_general_dilated | the same with the filter read ``w[KH-1-i, KW-1-j]`` (a true convolution where the model cross-correlates) | ``indexing`` |
| ``layer_norm_two_pass`` | layer_norm | mean, then the variance of the centred row, ``y * scale + bias`` | none (control) |
| ``layer_norm_swapped_affine`` | layer_norm | the same with ``y * bias + scale`` (scale and bias swapped) | ``indexing`` |
| ``gemm_tiled`` | dot_general | operands to ``[B, M, K] x [B, K, N]``, a loop over K tiles of 32 accumulating in float32 | none (control) |
| ``gemm_drop_last_k`` | dot_general | the same loop whose last tile stops at ``K - 1`` (the last product of every dot left out) | ``indexing`` |
| ``flash_attention`` | attention | blocks of 16 keys, running max, running sum and running output, both rescaled by ``exp(m_old - m_new)`` | none (control) |
| ``flash_attention_stale_sum`` | attention | the same, the running sum not rescaled when the max grows (the output is) | ``scale`` |
| ``attention_causal_off_by_one`` | attention | plain softmax attention whose causal mask keeps ``k <= q + 1`` | ``indexing`` |
| ``cross_entropy_logsumexp`` | cross_entropy | ``logsumexp(z) - z[label]`` | none (control) |
| ``cross_entropy_smoothed`` | cross_entropy | label smoothing 0.1 (``(1 - 0.1) z[label] + 0.1 mean(z)``) where the model has none | ``parameter`` |
| ``softmax_vjp`` | softmax | max-subtracted softmax; ``custom_vjp`` backward ``y * (dy - sum(dy * y))`` | none (control) |
| ``softmax_vjp_no_diag`` | softmax | the same forward; backward ``-y * sum(dy * y)`` (the Jacobian's diagonal ``diag(y)`` dropped) | a wrong formula: ``unknown`` |
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


def _f32(x):
  return x.astype(F32)


# --------------------------------------------------------------------------
# Convolution: im2col + matmul
# --------------------------------------------------------------------------


def _conv_im2col(lhs, rhs, *, window_strides, padding, lhs_dilation,
                 rhs_dilation, dimension_numbers, feature_group_count,
                 batch_group_count, flip, **unused):
  del unused
  if feature_group_count != 1 or batch_group_count != 1:
    raise NotImplementedError("conv_im2col: one group only")
  if any(d != 1 for d in (lhs_dilation or ())) or any(
      d != 1 for d in (rhs_dilation or ())):
    raise NotImplementedError("conv_im2col: no dilation")
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  if len(lhs_spec) != 4:
    raise NotImplementedError("conv_im2col: two spatial dims only")
  # lhs_spec = (batch, feature, spatial...) positions in lhs's layout.
  x = jnp.transpose(_f32(lhs), (lhs_spec[0], lhs_spec[2], lhs_spec[3],
                                lhs_spec[1]))             # N H W C
  # rhs_spec = (out feature, in feature, spatial...).
  w = jnp.transpose(_f32(rhs), (rhs_spec[2], rhs_spec[3], rhs_spec[1],
                                rhs_spec[0]))             # KH KW C O
  if flip:
    # The slip: the textbook convolution (filter rotated by 180 degrees)
    # where the framework's conv is a cross-correlation.
    w = w[::-1, ::-1]
  n, h, wd, c = x.shape
  kh, kw, _, o = w.shape
  sh, sw = window_strides
  (pt, pb), (pl, pr) = padding
  xp = jnp.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
  oh = (h + pt + pb - kh) // sh + 1
  ow = (wd + pl + pr - kw) // sw + 1
  cols = []
  for i in range(kh):
    for j in range(kw):
      cols.append(xp[:, i:i + sh * (oh - 1) + 1:sh,
                     j:j + sw * (ow - 1) + 1:sw, :])
  patches = jnp.concatenate(cols, axis=-1)                # N OH OW KH*KW*C
  wm = w.reshape(kh * kw * c, o)
  y = jnp.matmul(patches.reshape(n * oh * ow, kh * kw * c), wm,
                 precision=lax.Precision.HIGHEST).reshape(n, oh, ow, o)
  # Back to the site's output layout: out_spec = (batch, feature, spatial...).
  inv = [0] * 4
  for src, dst in enumerate((out_spec[0], out_spec[2], out_spec[3],
                             out_spec[1])):
    inv[dst] = src
  y = jnp.transpose(y, inv)
  return y.astype(lhs.dtype)


def conv_im2col(lhs, rhs, **params):
  """A correct convolution port: im2col patches times the filter matrix."""
  return _conv_im2col(lhs, rhs, flip=False, **params)


def conv_im2col_flipped(lhs, rhs, **params):
  """im2col convolution that rotates the filter by 180 degrees."""
  return _conv_im2col(lhs, rhs, flip=True, **params)


# --------------------------------------------------------------------------
# Layer norm
# --------------------------------------------------------------------------


def _layer_norm(x, scale, bias, eps, swapped):
  xf = _f32(x)
  d = xf.shape[-1]
  mean = jnp.sum(xf, axis=-1, keepdims=True) / d          # pass 1
  xc = xf - mean
  var = jnp.sum(xc * xc, axis=-1, keepdims=True) / d      # pass 2
  y = xc * lax.rsqrt(var + eps)
  s = _f32(scale) if scale is not None else None
  b = _f32(bias) if bias is not None else None
  if swapped:
    # The slip: the affine parameters read in the wrong order.
    s, b = b, s
  if s is not None:
    y = y * s
  if b is not None:
    y = y + b
  return y.astype(x.dtype)


def layer_norm_two_pass(x, scale, bias, eps=1e-6):
  """A correct layer norm: mean first, then the centred variance."""
  return _layer_norm(x, scale, bias, eps, swapped=False)


def layer_norm_swapped_affine(x, scale, bias, eps=1e-6):
  """Two-pass layer norm computing ``y * bias + scale``."""
  return _layer_norm(x, scale, bias, eps, swapped=True)


# --------------------------------------------------------------------------
# GEMM (dot_general): a K-tiled loop
# --------------------------------------------------------------------------

K_TILE = 32


def _gemm(lhs, rhs, dimension_numbers, preferred_element_type, drop_last):
  (lc, rc), (lb, rb) = dimension_numbers
  lc, rc, lb, rb = map(tuple, (lc, rc, lb, rb))
  lf = tuple(i for i in range(lhs.ndim) if i not in lc + lb)
  rf = tuple(i for i in range(rhs.ndim) if i not in rc + rb)
  batch_shape = tuple(lhs.shape[i] for i in lb)
  m_shape = tuple(lhs.shape[i] for i in lf)
  n_shape = tuple(rhs.shape[i] for i in rf)
  bsz = math.prod(batch_shape)
  m = math.prod(m_shape)
  n = math.prod(n_shape)
  k = math.prod(lhs.shape[i] for i in lc)
  a = jnp.transpose(_f32(lhs), lb + lf + lc).reshape(bsz, m, k)
  b = jnp.transpose(_f32(rhs), rb + rc + rf).reshape(bsz, k, n)
  acc = jnp.zeros((bsz, m, n), F32)
  for k0 in range(0, k, K_TILE):
    k1 = min(k0 + K_TILE, k)
    if drop_last and k1 == k:
      k1 = k - 1        # the slip: the tail loop's bound is off by one
    if k1 <= k0:
      continue
    acc = acc + jnp.matmul(a[:, :, k0:k1], b[:, k0:k1, :],
                           precision=lax.Precision.HIGHEST)
  out_dtype = (preferred_element_type if preferred_element_type is not None
               else jnp.result_type(lhs.dtype, rhs.dtype))
  return acc.reshape(batch_shape + m_shape + n_shape).astype(out_dtype)


def gemm_tiled(lhs, rhs, *, dimension_numbers, precision=None,
               preferred_element_type=None, **unused):
  """A correct GEMM port: K tiles of 32 added into a float32 accumulator."""
  del precision, unused
  return _gemm(lhs, rhs, dimension_numbers, preferred_element_type, False)


def gemm_drop_last_k(lhs, rhs, *, dimension_numbers, precision=None,
                     preferred_element_type=None, **unused):
  """K-tiled GEMM whose last tile ends one short: ``sum_{k < K-1}``."""
  del precision, unused
  return _gemm(lhs, rhs, dimension_numbers, preferred_element_type, True)


# --------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------

KV_BLOCK = 16
#: The masked logit (finite, so that ``s - m`` never makes inf - inf).
MASKED = -1e30


def _repeat_kv(q, k, v):
  """Grouped-query attention: kv head ``j // (H / Hk)`` for query head j."""
  h, hk = q.shape[2], k.shape[2]
  if hk != h:
    k = jnp.repeat(k, h // hk, axis=2)
    v = jnp.repeat(v, h // hk, axis=2)
  return k, v


def _keep(mask, is_causal, b, h, t, s):
  """The keep mask ``[B, H, T, S]`` (bool), or None when nothing is masked."""
  keep = None
  if mask is not None:
    keep = jnp.broadcast_to(jnp.asarray(mask, bool), (b, h, t, s))
  if is_causal:
    qi = jnp.arange(t)[:, None]
    kj = jnp.arange(s)[None, :]
    tri = kj <= qi
    keep = tri if keep is None else keep & tri
  return keep


def _flash(q, k, v, mask, bias, scale, is_causal, rescale_sum):
  b, t, h, d = q.shape
  k, v = _repeat_kv(q, k, v)
  s_len = k.shape[1]
  if scale is None:
    scale = 1.0 / math.sqrt(d)
  keep = _keep(mask, is_causal, b, h, t, s_len)
  qf, kf, vf = _f32(q), _f32(k), _f32(v)
  m_run = jnp.full((b, h, t), -jnp.inf, F32)   # running max
  l_run = jnp.zeros((b, h, t), F32)            # running sum of exp
  o_run = jnp.zeros((b, h, t, v.shape[-1]), F32)  # running output
  for s0 in range(0, s_len, KV_BLOCK):
    s1 = min(s0 + KV_BLOCK, s_len)
    sc = jnp.einsum("bthd,bshd->bhts", qf, kf[:, s0:s1],
                    precision=lax.Precision.HIGHEST) * scale
    if bias is not None:
      sc = sc + jnp.broadcast_to(_f32(bias), (b, h, t, s_len))[..., s0:s1]
    if keep is not None:
      sc = jnp.where(keep[..., s0:s1], sc, MASKED)
    m_new = jnp.maximum(m_run, jnp.max(sc, axis=-1))
    p = jnp.exp(sc - m_new[..., None])
    corr = jnp.exp(m_run - m_new)
    if rescale_sum:
      l_run = l_run * corr + jnp.sum(p, axis=-1)
    else:
      # The slip: the running sum kept as it was when the max grew.
      l_run = l_run + jnp.sum(p, axis=-1)
    o_run = o_run * corr[..., None] + jnp.einsum(
        "bhts,bshd->bhtd", p, vf[:, s0:s1], precision=lax.Precision.HIGHEST)
    m_run = m_new
  out = o_run / l_run[..., None]
  return jnp.transpose(out, (0, 2, 1, 3)).astype(q.dtype)


def flash_attention(q, k, v, mask=None, *, bias=None, scale=None,
                    is_causal=False, **unused):
  """A correct flash-style attention: key blocks, online softmax."""
  del unused
  return _flash(q, k, v, mask, bias, scale, is_causal, rescale_sum=True)


def flash_attention_stale_sum(q, k, v, mask=None, *, bias=None, scale=None,
                              is_causal=False, **unused):
  """Flash attention whose running sum misses the ``exp(m_old - m_new)``."""
  del unused
  return _flash(q, k, v, mask, bias, scale, is_causal, rescale_sum=False)


def attention_causal_off_by_one(q, k, v, mask=None, *, bias=None,
                                scale=None, is_causal=False, **unused):
  """Softmax attention with its own causal mask, one key too many.

  Like a fused kernel with an ``is_causal`` flag, the port takes the
  model's mask for a causal one (GPT passes the causal ``tril`` as a
  boolean mask; Llama passes ``is_causal=True``) and builds the triangle
  from positions, keeping key ``j`` for query ``i`` when ``j <= i + 1``
  (the bound should be ``j <= i``): every query but the last sees one
  future key.
  """
  del unused
  b, t, h, d = q.shape
  k, v = _repeat_kv(q, k, v)
  s_len = k.shape[1]
  if scale is None:
    scale = 1.0 / math.sqrt(d)
  sc = jnp.einsum("bthd,bshd->bhts", _f32(q), _f32(k),
                  precision=lax.Precision.HIGHEST) * scale
  if bias is not None:
    sc = sc + _f32(bias)
  if is_causal or mask is not None:
    qi = jnp.arange(t)[:, None]
    kj = jnp.arange(s_len)[None, :]
    sc = jnp.where(kj <= qi + 1, sc, MASKED)   # the slip: should be kj <= qi
  p = jnp.exp(sc - jnp.max(sc, axis=-1, keepdims=True))
  p = p / jnp.sum(p, axis=-1, keepdims=True)
  out = jnp.einsum("bhts,bshd->bthd", p, _f32(v),
                   precision=lax.Precision.HIGHEST)
  return out.astype(q.dtype)


# --------------------------------------------------------------------------
# Cross-entropy
# --------------------------------------------------------------------------

LABEL_SMOOTHING = 0.1


def _cross_entropy(logits, labels, reduction, smoothing):
  z = _f32(logits)
  m = jnp.max(z, axis=-1, keepdims=True)
  lse = (m + jnp.log(jnp.sum(jnp.exp(z - m), axis=-1, keepdims=True)))[..., 0]
  zy = jnp.take_along_axis(z, labels[..., None].astype(jnp.int32),
                           axis=-1)[..., 0]
  if smoothing:
    # The slip: the training recipe's label smoothing baked into the kernel.
    target = (1.0 - smoothing) * zy + smoothing * jnp.mean(z, axis=-1)
  else:
    target = zy
  losses = lse - target
  if reduction == "none":
    return losses.astype(logits.dtype)
  return jnp.mean(losses).astype(logits.dtype)


def cross_entropy_logsumexp(logits, labels, reduction="mean"):
  """A correct cross-entropy: ``logsumexp(z) - z[label]``."""
  return _cross_entropy(logits, labels, reduction, 0.0)


def cross_entropy_smoothed(logits, labels, reduction="mean"):
  """Cross-entropy with label smoothing 0.1 where the model has none."""
  return _cross_entropy(logits, labels, reduction, LABEL_SMOOTHING)


# --------------------------------------------------------------------------
# Softmax with a hand-written backward
# --------------------------------------------------------------------------


def _softmax_fwd_math(x, axis):
  xf = _f32(x)
  e = jnp.exp(xf - jnp.max(xf, axis=axis, keepdims=True))
  return e / jnp.sum(e, axis=axis, keepdims=True)


def _make_softmax(drop_diag: bool):

  @functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
  def sm(x, axis):
    return _softmax_fwd_math(x, axis).astype(x.dtype)

  def fwd(x, axis):
    y = _softmax_fwd_math(x, axis)
    return y.astype(x.dtype), y

  def bwd(axis, res, dy):
    y = res
    dyf = _f32(dy)
    dot = jnp.sum(dyf * y, axis=axis, keepdims=True)
    if drop_diag:
      # The slip: J = diag(y) - y y^T with its diag(y) term left out.
      dx = -y * dot
    else:
      dx = y * (dyf - dot)
    return (dx.astype(dy.dtype),)   # dy has the output's (= x's) dtype

  sm.defvjp(fwd, bwd)
  return sm


_SOFTMAX = _make_softmax(False)
_SOFTMAX_NO_DIAG = _make_softmax(True)


def softmax_vjp(x, axis=-1):
  """A correct softmax with its own VJP ``y * (dy - <dy, y>)``."""
  return _SOFTMAX(x, axis)


def softmax_vjp_no_diag(x, axis=-1):
  """Softmax whose VJP drops the Jacobian's diagonal: ``-y <dy, y>``."""
  return _SOFTMAX_NO_DIAG(x, axis)
