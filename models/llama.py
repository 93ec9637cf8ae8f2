"""A small Llama-style byte-level decoder in bf16 mixed precision.

The architecture of Llama 2/3 at a size this machine trains: RMSNorm before
attention and MLP (``nnx.RMSNorm``), rotary position embeddings on queries
and keys (``layers.rope``, a ``rope`` site), grouped-query attention with
fewer key/value heads than query heads through ``jax.nn.dot_product_attention``
(an ``attention`` site), a SwiGLU MLP (``layers.swiglu``: ``silu(gate) * up``,
a ``silu`` site), no biases, an untied output head. Parameters are float32;
activations and every kernel compute in bfloat16 (the composites and XLA's
dots float32 inside, rounded to bfloat16); the loss casts the logits to
float32.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from peat_jax.models import layers

VOCAB = 256  # bytes


class LlamaAttention(nnx.Module):
  """Grouped-query self-attention with rotary embeddings, causal."""

  def __init__(self, dim: int, heads: int, kv_heads: int, theta: float, *,
               dtype, rngs: nnx.Rngs):
    if dim % heads or heads % kv_heads:
      raise ValueError(f"dim ({dim}) must be divisible by heads ({heads}) and "
                       f"heads by kv_heads ({kv_heads})")
    self.heads, self.kv_heads, self.theta = heads, kv_heads, theta
    self.head_dim = dim // heads
    if self.head_dim % 2:
      raise ValueError(f"head_dim {self.head_dim} must be even for rotary "
                       "embeddings")
    lin = lambda i, o: nnx.Linear(i, o, use_bias=False, dtype=dtype,  # noqa: E731
                                  rngs=rngs)
    self.q = lin(dim, heads * self.head_dim)
    self.k = lin(dim, kv_heads * self.head_dim)
    self.v = lin(dim, kv_heads * self.head_dim)
    self.o = lin(heads * self.head_dim, dim)

  def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    b, t, _ = x.shape
    q = self.q(x).reshape(b, t, self.heads, self.head_dim)
    k = self.k(x).reshape(b, t, self.kv_heads, self.head_dim)
    v = self.v(x).reshape(b, t, self.kv_heads, self.head_dim)
    q = layers.rope(q, positions, self.theta)
    k = layers.rope(k, positions, self.theta)
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return self.o(y.reshape(b, t, self.heads * self.head_dim))


class LlamaMlp(nnx.Module):
  """SwiGLU MLP: ``down(silu(gate(x)) * up(x))``."""

  def __init__(self, dim: int, hidden: int, *, dtype, rngs: nnx.Rngs):
    lin = lambda i, o: nnx.Linear(i, o, use_bias=False, dtype=dtype,  # noqa: E731
                                  rngs=rngs)
    self.gate, self.up, self.down = lin(dim, hidden), lin(dim, hidden), lin(
        hidden, dim)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down(layers.swiglu(self.gate(x), self.up(x)))


class LlamaBlock(nnx.Module):
  """``x + Attn(RMSNorm(x))``, then ``x + Mlp(RMSNorm(x))``."""

  def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int,
               theta: float, eps: float, *, dtype, rngs: nnx.Rngs):
    norm = lambda: nnx.RMSNorm(dim, epsilon=eps, dtype=dtype,  # noqa: E731
                               param_dtype=jnp.float32, rngs=rngs)
    self.attn_norm = norm()
    self.attn = LlamaAttention(dim, heads, kv_heads, theta, dtype=dtype,
                               rngs=rngs)
    self.mlp_norm = norm()
    self.mlp = LlamaMlp(dim, hidden, dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    x = x + self.attn(self.attn_norm(x), positions)
    return x + self.mlp(self.mlp_norm(x))


class Llama(nnx.Module):
  """Token embedding, Llama blocks, final RMSNorm, untied head.

  Inputs are ``[B, T]`` int32 byte values; outputs ``[B, T, 256]`` logits of
  the next byte in ``dtype`` (bfloat16 by default).

  Args:
    dim: model width.
    depth: blocks.
    heads: query heads.
    kv_heads: key/value heads (grouped-query attention when fewer).
    hidden: the SwiGLU MLP's hidden width.
    context: longest sequence.
    theta: the rotary base.
    eps: RMSNorm's epsilon.
    dtype: the compute dtype (parameters are float32).
    rngs: nnx random streams.
  """

  def __init__(self, dim: int = 128, depth: int = 2, heads: int = 4,
               kv_heads: int = 2, hidden: int = 352, context: int = 64,
               theta: float = 10000.0, eps: float = 1e-6,
               dtype: str = "bfloat16", *, rngs: nnx.Rngs):
    self.context = context
    self.dtype = jnp.dtype(dtype)
    self.tok = nnx.Embed(VOCAB, dim, dtype=self.dtype,
                         param_dtype=jnp.float32, rngs=rngs)
    self.blocks = nnx.List([
        LlamaBlock(dim, heads, kv_heads, hidden, theta, eps,
                   dtype=self.dtype, rngs=rngs) for _ in range(depth)])
    self.norm = nnx.RMSNorm(dim, epsilon=eps, dtype=self.dtype,
                            param_dtype=jnp.float32, rngs=rngs)
    self.head = nnx.Linear(dim, VOCAB, use_bias=False, dtype=self.dtype,
                           rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    t = tokens.shape[1]
    if t > self.context:
      raise ValueError(f"sequence length {t} exceeds context {self.context}")
    positions = jnp.arange(t, dtype=jnp.int32)
    x = self.tok(tokens)
    for block in self.blocks:
      x = block(x, positions)
    return self.head(self.norm(x))
