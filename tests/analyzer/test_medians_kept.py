"""The traced exact median of playback's device tries
(``analyzer.signature.medians_kept``): ``np.median`` of each array's kept
(non-NaN) elements bit for bit, by the native kernel on CPU
(``kernels.median_kept``) and by the sort other platforms run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import kernels
from peat_jax.analyzer.signature import _select
from peat_jax.analyzer.signature import medians_kept
from peat_jax.core import PeatError


def _ratios(kind: str, n: int, seed: int) -> np.ndarray:
  """Non-negative float64 arrays, NaN where not kept, of one kind."""
  rng = np.random.default_rng(seed)
  x = np.abs(rng.standard_normal(n))
  if kind == "ratios":  # the probe's: many octaves, some inf, NaN holes
    x = np.abs(rng.standard_normal(n)) * 10.0 ** rng.integers(-8, 3, n)
    x[rng.random(n) < 0.02] = np.inf
    x[rng.random(n) < 0.3] = np.nan
  elif kind == "ties":  # few distinct values: a bin holds most of them
    x = np.round(x * 3) / 3
  elif kind == "constant":  # one bin holds every element
    x = np.full(n, 0.75)
  elif kind == "apart":  # the two middle ranks in bins far apart
    x = np.where(np.arange(n) % 2 == 0, 1e-30, 1e30)
    x[-1] = np.nan if n % 2 else x[-1]
  elif kind == "zeros":  # +0 and -0 share a bin
    x = np.where(rng.random(n) < 0.6, 0.0, x)
    x[rng.random(n) < 0.2] = -0.0
  elif kind == "sorted":
    x = np.sort(x)
  return x


def _numpy(x: np.ndarray) -> np.float64:
  kept = x[~np.isnan(x)]
  return np.float64(np.median(kept)) if kept.size else np.float64(np.inf)


_KINDS = ("ratios", "ties", "constant", "apart", "zeros", "sorted")
_SIZES = (1, 2, 3, 1000, 16385, 262144)


@pytest.mark.parametrize("path", ["native", "sort"])
@pytest.mark.parametrize("kind", _KINDS)
def test_medians_are_numpy_medians_bitwise(kind, path):
  xs = [_ratios(kind, n, seed) for seed, n in enumerate(_SIZES)]
  with jax.enable_x64(True):
    dev = [jnp.asarray(x) for x in xs]
    if path == "native":  # what medians_kept lowers to on CPU
      got = jax.jit(lambda *a: medians_kept(a))(*dev)
    else:  # the other platforms' branch, run here
      got = jax.jit(lambda *a: jnp.stack(
          [_select._sorted_median(x) for x in a]))(*dev)
    got = np.asarray(got)
  assert got.dtype == np.float64 and got.shape == (len(xs),)
  want = np.array([_numpy(x) for x in xs])
  # Bitwise: the same order statistics, averaged as np.mean averages two
  # (zeros compare equal whatever their sign, as np.median's partition).
  same = (got.view(np.uint64) == want.view(np.uint64)) | (
      (got == 0) & (want == 0))
  assert same.all(), (kind, path, got[~same], want[~same])


def test_nothing_kept_is_inf_and_shapes_are_flattened():
  with jax.enable_x64(True):
    xs = [jnp.full((4, 5), jnp.nan), jnp.asarray([[2.0, 1.0], [4.0, 3.0]]),
          jnp.asarray([np.inf, 1.0, np.nan])]
    got = np.asarray(jax.jit(lambda *a: medians_kept(a))(*xs))
  np.testing.assert_array_equal(got, [np.inf, 2.5, np.inf])


def test_the_native_median_is_deterministic_bitwise():
  xs = [_ratios("ratios", 200003, s) for s in range(5)]
  with jax.enable_x64(True):
    f = jax.jit(lambda *a: kernels.median_kept(*a))
    runs = [np.asarray(f(*[jnp.asarray(x) for x in xs])) for _ in range(3)]
  for r in runs[1:]:
    np.testing.assert_array_equal(r.view(np.uint64), runs[0].view(np.uint64))


def test_bad_inputs_name_the_problem():
  with pytest.raises(PeatError, match="no array"):
    kernels.median_kept()
  with pytest.raises(PeatError, match=r"inputs \[1\].*float32.*float64"):
    with jax.enable_x64(True):
      kernels.median_kept(jnp.ones(3, jnp.float64), jnp.ones(3, jnp.float32))
  with jax.enable_x64(True):
    x = jnp.asarray([1.0, -2.0, np.nan])
    with pytest.raises(Exception, match="input 1 has a negative kept"):
      jax.block_until_ready(jax.jit(lambda a, b: kernels.median_kept(a, b))(
          jnp.ones(3, jnp.float64), x))
