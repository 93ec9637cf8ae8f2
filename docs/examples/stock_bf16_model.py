"""A user's bf16 Llama-style model in stock Flax (no peat_jax marker), as a task.

A byte-level decoder trained in bf16 mixed precision the way Flax users
write one: ``nnx.Embed``, ``nnx.RMSNorm`` and bias-free ``nnx.Linear`` with
``dtype=jnp.bfloat16, param_dtype=jnp.float32``; grouped-query causal
attention through ``jax.nn.dot_product_attention`` (4 query heads, 2 key/value
heads); a SwiGLU MLP with ``jax.nn.silu``; the loss on logits cast to
float32. Its corpus is the source of a few modules of Python's own standard
library (on every machine, nothing downloaded). ``task()`` hands it to
peat_jax, which finds its ``rms_norm``, ``attention`` and ``silu`` sites
without any change to this file::

  python -m peat_jax.tools.sites --task=stock_bf16_model:task --counts
  python -m peat_jax.tools.validate --task=stock_bf16_model:task \\
      --kut=py:bf16_kernels:rms_norm_hf --kernel=rms_norm
"""

import inspect
import json
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import peat_jax as peat

DIM, HEADS, KV_HEADS, BLOCKS, CONTEXT, BATCH = 64, 4, 2, 2, 32, 8
BF16 = jnp.bfloat16


def _linear(i, o, rngs):
  return nnx.Linear(i, o, use_bias=False, dtype=BF16,
                    param_dtype=jnp.float32, rngs=rngs)


class Block(nnx.Module):
  """RMSNorm, grouped-query attention, RMSNorm, SwiGLU MLP."""

  def __init__(self, rngs: nnx.Rngs):
    hd = DIM // HEADS
    self.norm1 = nnx.RMSNorm(DIM, dtype=BF16, param_dtype=jnp.float32,
                             rngs=rngs)
    self.q = _linear(DIM, HEADS * hd, rngs)
    self.kv = _linear(DIM, 2 * KV_HEADS * hd, rngs)
    self.o = _linear(HEADS * hd, DIM, rngs)
    self.norm2 = nnx.RMSNorm(DIM, dtype=BF16, param_dtype=jnp.float32,
                             rngs=rngs)
    self.gate = _linear(DIM, 2 * DIM, rngs)
    self.up = _linear(DIM, 2 * DIM, rngs)
    self.down = _linear(2 * DIM, DIM, rngs)

  def __call__(self, x):
    b, t, _ = x.shape
    h = self.norm1(x)
    q = self.q(h).reshape(b, t, HEADS, -1)
    k, v = jnp.split(self.kv(h).reshape(b, t, 2 * KV_HEADS, -1), 2, axis=2)
    a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    x = x + self.o(a.reshape(b, t, -1))
    h = self.norm2(x)
    return x + self.down(jax.nn.silu(self.gate(h)) * self.up(h))


class ByteLM(nnx.Module):
  """Bytes -> next-byte logits (bfloat16)."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(256, DIM, dtype=BF16, param_dtype=jnp.float32,
                           rngs=rngs)
    self.pos = nnx.Embed(CONTEXT, DIM, dtype=BF16, param_dtype=jnp.float32,
                         rngs=rngs)
    self.blocks = nnx.List([Block(rngs) for _ in range(BLOCKS)])
    self.norm = nnx.RMSNorm(DIM, dtype=BF16, param_dtype=jnp.float32,
                            rngs=rngs)
    self.head = _linear(DIM, 256, rngs)

  def __call__(self, tokens):                       # [B, T] int32
    h = self.embed(tokens) + self.pos(jnp.arange(tokens.shape[1]))
    for block in self.blocks:
      h = block(h)
    return self.head(self.norm(h))


def _corpus() -> np.ndarray:
  """The source of a few standard-library modules, as bytes."""
  text = "".join(textwrap.dedent(inspect.getsource(m))
                 for m in (json, os, textwrap, inspect))
  return np.frombuffer(text.encode("utf-8"), np.uint8)


CORPUS = _corpus()


def batch_at(position: int) -> dict:
  """Batch ``position``: seeded windows of the corpus (a pure function)."""
  rng = np.random.default_rng(int(position))
  start = rng.integers(0, len(CORPUS) - CONTEXT - 1, BATCH)
  win = np.stack([CORPUS[s:s + CONTEXT + 1] for s in start]).astype(np.int32)
  return {"tokens": win[:, :-1], "targets": win[:, 1:]}


def loss_fn(model: ByteLM, batch: dict) -> jax.Array:
  logits = model(batch["tokens"]).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, batch["targets"]).mean()


def task() -> peat.TrainTask:
  """The task peat_jax trains, checkpoints and plays back."""
  return peat.nnx_task(lambda rngs: ByteLM(rngs), optax.adamw(3e-3),
                       loss_fn, batch_at, name="byte_lm_bf16",
                       default_steps=30, default_checkpoint_every=10)
