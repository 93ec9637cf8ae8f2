"""`first_true` is ``jnp.nonzero(mask, size=k, fill_value=0)[0]`` exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.analyzer.signature._prefix import first_true


@pytest.mark.parametrize("n,size,density", [
    (0, 4, 0.5), (1, 4, 1.0), (31, 8, 0.5), (33, 64, 1.0), (100, 16, 0.0),
    (1000, 4096, 0.01), (4097, 64, 0.9), (70001, 4096, 0.001),
    (70001, 4096, 0.3), (524288, 4096, 1e-4), (524288, 4096, 0.02)])
def test_first_true_is_nonzero(n, size, density):
  rng = np.random.default_rng(n + size)
  mask = rng.random(n) < density
  if n > 40:
    mask[-1] = True  # the last element, past every full word
    mask[32] = True  # the first bit of a word
    mask[31] = True  # the last bit of a word
  got = np.asarray(jax.jit(first_true, static_argnums=1)(
      jnp.asarray(mask), size))
  want = np.asarray(jnp.nonzero(jnp.asarray(mask), size=size,
                                fill_value=0)[0])
  assert got.dtype == np.int32 and got.shape == (size,)
  np.testing.assert_array_equal(got, want)
