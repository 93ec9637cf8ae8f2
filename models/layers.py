"""Composite kernels of the models, each marked as one peat_jax site.

These are the golden implementations (plain JAX). Marking them with
:func:`peat_jax.composite` lets the site machinery find and substitute each
call as one softmax / layer norm / attention / GELU / cross-entropy site.
"""

import jax
import jax.numpy as jnp
from flax import nnx

import peat_jax as peat


@peat.composite("softmax")
def softmax(x: jax.Array) -> jax.Array:
  """Softmax over the last axis."""
  return jax.nn.softmax(x, axis=-1)


@peat.composite("layer_norm")
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
               eps: float = 1e-6) -> jax.Array:
  """Layer norm over the last axis: ``(x - mean) / sqrt(var + eps) * s + b``."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


@peat.composite("gelu")
def gelu(x: jax.Array) -> jax.Array:
  """GELU with the exact erf form, ``x * Phi(x)``."""
  return jax.nn.gelu(x, approximate=False)


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

  def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs):
    if dim % heads:
      raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
    self.heads = heads
    self.qkv = nnx.Linear(dim, 3 * dim, rngs=rngs)
    self.out = nnx.Linear(dim, dim, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    b, t, d = x.shape
    qkv = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads)
    y = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask)
    return self.out(y.reshape(b, t, d))


class Mlp(nnx.Module):
  """Two dense layers with a GELU between them."""

  def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):
    self.fc1 = nnx.Linear(dim, hidden, rngs=rngs)
    self.fc2 = nnx.Linear(hidden, dim, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.fc2(gelu(self.fc1(x)))


class Block(nnx.Module):
  """Pre-LN transformer block: ``x + Attn(LN(x))``, then ``x + Mlp(LN(x))``."""

  def __init__(self, dim: int, heads: int, mlp_ratio: int, *,
               rngs: nnx.Rngs):
    self.ln1 = LayerNorm(dim, rngs=rngs)
    self.attn = MultiHeadAttention(dim, heads, rngs=rngs)
    self.ln2 = LayerNorm(dim, rngs=rngs)
    self.mlp = Mlp(dim, mlp_ratio * dim, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    x = x + self.attn(self.ln1(x), mask)
    return x + self.mlp(self.ln2(x))
