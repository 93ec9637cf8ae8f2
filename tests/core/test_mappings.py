"""Compiled code against the kernel's mapping limit (peat_jax.core)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import core
from peat_jax.core import _mappings

linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="/proc/self/maps is Linux's")


def _compile_many(n, seed):
  """n distinct executables, each run once on fresh inputs; kept alive."""
  x = jnp.asarray(np.random.default_rng(seed).standard_normal(16),
                  jnp.float32)
  fns = []
  for i in range(n):
    f = jax.jit(lambda a, i=i: jnp.sin(a) * (i + 1) + jnp.cumsum(a))
    f(x).block_until_ready()
    fns.append(f)
  return fns


@linux
def test_executables_hold_mappings_until_released():
  base, limit = core.mapping_use()
  assert 0 < base < limit
  fns = _compile_many(60, seed=3)
  held, _ = core.mapping_use()
  assert held - base >= 4 * 60  # about six per XLA:CPU executable
  # Under the threshold nothing is cleared: the executables stay cached.
  assert not core.release_compiled(1.0)
  assert core.mapping_use()[0] >= held - 10
  assert fns[0]._cache_size() == 1
  # Over it (a threshold just below the current use) the caches go.
  assert core.release_compiled((held - 1) / limit)
  after, _ = core.mapping_use()
  assert held - after >= 4 * 60
  assert fns[0]._cache_size() == 0


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, float("nan")])
def test_a_fraction_outside_the_limit_is_refused(fraction):
  with pytest.raises(core.PeatError, match=r"in \(0, 1\]"):
    core.release_compiled(fraction)


def test_without_proc_nothing_is_cleared(monkeypatch, tmp_path):
  monkeypatch.setattr(_mappings, "_MAPS", str(tmp_path / "absent"))
  assert core.mapping_use() == (0, 0)
  f = jax.jit(lambda a: a * 3.0)
  f(jnp.float32(1.7))
  assert not core.release_compiled(1e-9)
  assert f._cache_size() == 1
