"""A small Vision Transformer for 8x8 digits (2x2 patches, class token)."""

import jax
import jax.numpy as jnp
from flax import nnx

from peat_jax.models import layers


class Vit(nnx.Module):
  """Patch embedding, learned positions, pre-LN blocks, class-token head.

  An 8x8 image is cut into 16 patches of 2x2 pixels; a class token is
  prepended; ``depth`` blocks of multi-head attention and a GELU MLP follow;
  the final layer norm of the class token feeds a linear head. With
  ``dtype="bfloat16"`` it trains in bf16 mixed precision: parameters
  float32, every dense layer, attention, norm and activation computing on
  bfloat16 activations (the composites float32 inside), the logits
  bfloat16 (the loss casts them to float32).
  """

  def __init__(self, classes: int = 10, dim: int = 64, depth: int = 2,
               heads: int = 4, mlp_ratio: int = 2, patch: int = 2, *,
               rngs: nnx.Rngs, dtype: str | None = None):
    self.patch = patch
    self.dtype = None if dtype is None else jnp.dtype(dtype)
    tokens = (8 // patch) ** 2
    self.embed = nnx.Linear(patch * patch, dim, dtype=self.dtype, rngs=rngs)
    self.cls = nnx.Param(jnp.zeros((1, 1, dim), jnp.float32))
    self.pos = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (1, tokens + 1, dim)))
    self.blocks = nnx.List([
        layers.Block(dim, heads, mlp_ratio, rngs=rngs, dtype=self.dtype)
        for _ in range(depth)])
    self.ln = layers.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, classes, dtype=self.dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    b, h, w, _ = x.shape
    p = self.patch
    x = x.reshape(b, h // p, p, w // p, p).transpose(0, 1, 3, 2, 4)
    x = self.embed(x.reshape(b, (h // p) * (w // p), p * p))
    cls = jnp.broadcast_to(self.cls[...], (b, 1, x.shape[-1])).astype(x.dtype)
    x = jnp.concatenate([cls, x], axis=1) + self.pos[...].astype(x.dtype)
    for block in self.blocks:
      x = block(x)
    return self.head(self.ln(x[:, 0]))
