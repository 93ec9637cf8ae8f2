"""A small CNN for 8x8 digits: three 3x3 convolutions and a dense head."""

import jax
import jax.numpy as jnp
from flax import nnx


class Cnn(nnx.Module):
  """conv16-relu, conv32-relu, 2x2 avg-pool, conv64-relu, mean-pool, dense.

  Inputs are ``[B, 8, 8, 1]`` images in [0, 1]; outputs ``[B, classes]``
  logits. Convolution kernels are HWIO (``nnx.Conv``).
  """

  def __init__(self, classes: int = 10, width: int = 16, *, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(1, width, (3, 3), rngs=rngs)
    self.conv2 = nnx.Conv(width, 2 * width, (3, 3), rngs=rngs)
    self.conv3 = nnx.Conv(2 * width, 4 * width, (3, 3), rngs=rngs)
    self.head = nnx.Linear(4 * width, classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = jax.nn.relu(self.conv1(x))
    x = jax.nn.relu(self.conv2(x))
    x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
    x = jax.nn.relu(self.conv3(x))
    return self.head(jnp.mean(x, axis=(1, 2)))
