"""A small GPT-style byte-level decoder (causal attention, pre-LN, GELU)."""

import jax
import jax.numpy as jnp
from flax import nnx

from peat_jax.models import layers

VOCAB = 256  # bytes


class Gpt(nnx.Module):
  """Token and position embeddings, causal pre-LN blocks, untied output head.

  Inputs are ``[B, T]`` int32 byte values; outputs ``[B, T, 256]`` logits of
  the next byte.
  """

  def __init__(self, dim: int = 128, depth: int = 2, heads: int = 4,
               mlp_ratio: int = 4, context: int = 64, *, rngs: nnx.Rngs):
    self.context = context
    self.tok = nnx.Embed(VOCAB, dim, rngs=rngs)
    self.pos = nnx.Embed(context, dim, rngs=rngs)
    self.blocks = nnx.List([
        layers.Block(dim, heads, mlp_ratio, rngs=rngs) for _ in range(depth)])
    self.ln = layers.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, VOCAB, rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    t = tokens.shape[1]
    if t > self.context:
      raise ValueError(f"sequence length {t} exceeds context {self.context}")
    x = self.tok(tokens) + self.pos(jnp.arange(t))[None]
    mask = jnp.tril(jnp.ones((t, t), bool))[None, None]
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.ln(x))
