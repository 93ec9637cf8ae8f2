"""Composite kernels of the models, each marked as one peat_jax site.

These are the golden implementations (plain JAX). Marking them with
:func:`peat_jax.composite` lets the site machinery find and substitute each
call as one softmax / layer norm / attention / GELU / SiLU / RoPE /
cross-entropy site.

In a bf16 mixed-precision model (parameters float32, compute bfloat16) the
composites take and return bfloat16 and compute in float32 inside, rounding
once at the end, as XLA's and Flax's own normalizations do; on float32
inputs the cast is no operation (the same program as before).
"""

import jax
import jax.numpy as jnp
from flax import nnx

import peat_jax as peat


def _f32(x: jax.Array) -> jax.Array:
  """``x`` in float32 when it is a narrower float (else ``x`` itself)."""
  return x.astype(jnp.float32) if jnp.finfo(x.dtype).bits < 32 else x


@peat.composite("softmax")
def softmax(x: jax.Array) -> jax.Array:
  """Softmax over the last axis (float32 inside for 16-bit inputs)."""
  return jax.nn.softmax(_f32(x), axis=-1).astype(x.dtype)


@peat.composite("layer_norm")
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
               eps: float = 1e-6) -> jax.Array:
  """Layer norm over the last axis: ``(x - mean) / sqrt(var + eps) * s + b``.

  Statistics and the result in float32 for 16-bit inputs, rounded once to
  ``x``'s dtype.
  """
  xf = _f32(x)
  mean = jnp.mean(xf, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
  y = (xf - mean) * jax.lax.rsqrt(var + eps) * scale + bias
  return y.astype(x.dtype)


@peat.composite("gelu")
def gelu(x: jax.Array) -> jax.Array:
  """GELU with the exact erf form, ``x * Phi(x)`` (float32 inside)."""
  return jax.nn.gelu(_f32(x), approximate=False).astype(x.dtype)


@peat.composite("silu")
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
  """The SwiGLU activation ``silu(gate) * up`` (a ``silu`` site with two
  operands; float32 inside for 16-bit inputs, one rounding)."""
  return (jax.nn.silu(_f32(gate)) * _f32(up)).astype(gate.dtype)


@peat.composite("rope")
def rope(x: jax.Array, positions: jax.Array,
         theta: float = 10000.0) -> jax.Array:
  """Rotary position embedding of the two halves (GPT-NeoX / Llama layout).

  With ``h = D / 2``: ``inv_freq[i] = theta ** (-2 i / D)``, the angle of
  token ``t`` is ``positions[t] * inv_freq``, and
  ``out = [x1 cos - x2 sin, x2 cos + x1 sin]`` for ``x = [x1, x2]``, in
  float32 (tables too), rounded once to ``x``'s dtype.

  Args:
    x: ``[B, T, H, D]`` queries or keys, ``D`` even.
    positions: int32 ``[T]``, each token's position.
    theta: the rotary base.

  Returns:
    ``[B, T, H, D]`` in ``x``'s dtype.
  """
  d = x.shape[-1]
  h = d // 2
  inv_freq = theta ** (-jnp.arange(h, dtype=jnp.float32) * (2.0 / d))
  angle = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
  xf = x.astype(jnp.float32)
  x1, x2 = xf[..., :h], xf[..., h:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


@peat.composite("attention")
def attention(q: jax.Array, k: jax.Array, v: jax.Array,
              mask: jax.Array | None = None) -> jax.Array:
  """Scaled dot-product attention.

  Args:
    q: ``[B, T, H, D]`` queries.
    k: ``[B, S, H, D]`` keys.
    v: ``[B, S, H, D]`` values.
    mask: boolean, broadcastable to ``[B, H, T, S]``; True keeps a position.

  Returns:
    ``[B, T, H, D]``.
  """
  scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(
      jnp.asarray(q.shape[-1], q.dtype))
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
  weights = softmax(scores)
  return jnp.einsum("bhts,bshd->bthd", weights, v)


@peat.composite("cross_entropy")
def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of integer ``labels`` under ``logits``."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


class LayerNorm(nnx.Module):
  """Layer norm module (parameters ``scale`` and ``bias``, as nnx.LayerNorm)."""

  def __init__(self, features: int, *, rngs: nnx.Rngs, eps: float = 1e-6):
    del rngs  # deterministic init; kept for the nnx constructor convention
    self.scale = nnx.Param(jnp.ones((features,), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((features,), jnp.float32))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    return layer_norm(x, self.scale[...], self.bias[...], self.eps)


class MultiHeadAttention(nnx.Module):
  """Self-attention with a fused QKV projection (``qkv``: [d, 3d])."""

  def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs,
               dtype: jnp.dtype | None = None):
    if dim % heads:
      raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
    self.heads = heads
    self.qkv = nnx.Linear(dim, 3 * dim, dtype=dtype, rngs=rngs)
    self.out = nnx.Linear(dim, dim, dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    b, t, d = x.shape
    qkv = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads)
    y = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask)
    return self.out(y.reshape(b, t, d))


class Mlp(nnx.Module):
  """Two dense layers with a GELU between them."""

  def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs,
               dtype: jnp.dtype | None = None):
    self.fc1 = nnx.Linear(dim, hidden, dtype=dtype, rngs=rngs)
    self.fc2 = nnx.Linear(hidden, dim, dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.fc2(gelu(self.fc1(x)))


class Block(nnx.Module):
  """Pre-LN transformer block: ``x + Attn(LN(x))``, then ``x + Mlp(LN(x))``.

  ``dtype``: the dense layers' compute dtype (None: their inputs'); the
  parameters stay float32.
  """

  def __init__(self, dim: int, heads: int, mlp_ratio: int, *,
               rngs: nnx.Rngs, dtype: jnp.dtype | None = None):
    self.ln1 = LayerNorm(dim, rngs=rngs)
    self.attn = MultiHeadAttention(dim, heads, rngs=rngs, dtype=dtype)
    self.ln2 = LayerNorm(dim, rngs=rngs)
    self.mlp = Mlp(dim, mlp_ratio * dim, rngs=rngs, dtype=dtype)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    x = x + self.attn(self.ln1(x), mask)
    return x + self.mlp(self.ln2(x))
