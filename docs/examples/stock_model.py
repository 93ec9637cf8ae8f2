"""A user's model in stock Flax (no peat_jax marker anywhere), as a task.

A small transformer that reads the 8 rows of an 8x8 digit image (the
1,797 images scikit-learn ships) as a sequence of 8 tokens: ``nnx.Linear``
embedding plus learned positions, two pre-LN blocks (``nnx.LayerNorm``,
``nnx.MultiHeadAttention``, an MLP with ``jax.nn.gelu``), attention pooling
over the rows (``jax.nn.softmax``) and a linear head, trained with Optax's
softmax cross-entropy. ``task()`` hands it to peat_jax::

  python -m peat_jax.tools.sites --task=stock_model:task
  python -m peat_jax.tools.validate --task=stock_model:task \\
      --kut=py:pallas_kernels:layer_norm --kernel=layer_norm
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn import datasets

import peat_jax as peat

DIM, HEADS, BLOCKS, BATCH = 32, 2, 2, 32


class Block(nnx.Module):
  """Pre-LN transformer block."""

  def __init__(self, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(DIM, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(HEADS, DIM, decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(DIM, rngs=rngs)
    self.up = nnx.Linear(DIM, 2 * DIM, rngs=rngs)
    self.down = nnx.Linear(2 * DIM, DIM, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.norm1(x))
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class DigitRows(nnx.Module):
  """Rows of an 8x8 image as 8 tokens -> 10 class logits."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Linear(8, DIM, rngs=rngs)
    self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (8, DIM)))
    self.blocks = nnx.List([Block(rngs) for _ in range(BLOCKS)])
    self.norm = nnx.LayerNorm(DIM, rngs=rngs)
    self.pool = nnx.Linear(DIM, 1, rngs=rngs)
    self.head = nnx.Linear(DIM, 10, rngs=rngs)

  def __call__(self, images):                      # [B, 8, 8]
    h = self.embed(images) + self.pos[...]
    for block in self.blocks:
      h = block(h)
    h = self.norm(h)
    weights = jax.nn.softmax(self.pool(h)[..., 0])   # [B, 8] over the rows
    return self.head(jnp.einsum("bt,btd->bd", weights, h))


def _digits():
  d = datasets.load_digits()
  x = (d.images / 16.0).astype(np.float32)
  y = d.target.astype(np.int32)
  perm = np.random.default_rng(0).permutation(len(y))
  return x[perm[360:]], y[perm[360:]], x[perm[:360]], y[perm[:360]]


X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = _digits()


def batch_at(position: int) -> dict:
  """Batch ``position`` of a fixed shuffle (a pure function of it)."""
  rng = np.random.default_rng(int(position))
  idx = rng.choice(len(Y_TRAIN), BATCH, replace=False)
  return {"images": X_TRAIN[idx], "labels": Y_TRAIN[idx]}


def loss_fn(model: DigitRows, batch: dict) -> jax.Array:
  logits = model(batch["images"])
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, batch["labels"]).mean()


def accuracy(model: DigitRows) -> dict:
  pred = jnp.argmax(model(X_TEST), -1)
  return {"test_accuracy": float(jnp.mean(pred == Y_TEST))}


def task() -> peat.TrainTask:
  """The task peat_jax trains, checkpoints and plays back."""
  return peat.nnx_task(lambda rngs: DigitRows(rngs), optax.adam(3e-3),
                       loss_fn, batch_at, name="digit_rows",
                       evaluate=accuracy, default_steps=30,
                       default_checkpoint_every=10)
