"""The Analyzer releases compiled code before the mapping limit.

Each record size bucket's signature maps ~600 compiled kernels; about
100 distinct executables in one process reach vm.max_map_count, where XLA aborts
the process (found by benchmarks/bench_compile.py at 96 shapes). The entry
points check the process's mappings after a call that compiled, and only
then.
"""

import jax
import numpy as np

import peat_jax as peat
from peat_jax.analyzer.signature import _api


def _pair(rows: int, cols: int, seed: int):
  r = np.random.default_rng(seed).standard_normal((rows, cols))
  g = r.astype(np.float32)
  t = (r * (1 + 1e-6 * np.random.default_rng(seed + 1).standard_normal(
      r.shape))).astype(np.float32)
  return t, g, r


def test_a_call_that_compiles_checks_the_mappings_and_a_cached_one_does_not(
    monkeypatch):
  calls = []
  monkeypatch.setattr(_api._core, "release_compiled",
                      lambda: calls.append(1) or False)
  # Records share executables by size bucket: start from none compiled.
  jax.clear_caches()
  t, g, r = _pair(37, 53, 0)
  peat.analyze(t, g, r)
  assert len(calls) == 1
  peat.analyze(t, g, r)  # cached: no check
  assert len(calls) == 1
  peat.analyzer.screen(t, g, r)  # the screen's executable: a new one
  assert len(calls) == 2
  peat.analyzer.screen(t, g, r)
  assert len(calls) == 2


def test_release_clears_the_caches_past_the_threshold(monkeypatch):
  t, g, r = _pair(41, 59, 2)
  peat.analyze(t, g, r)
  assert _api._compiled() > 0
  monkeypatch.setattr(peat.core._mappings, "mapping_use",
                      lambda: (40_000, 65_530))
  assert peat.core.release_compiled()
  assert _api._compiled() == 0
  # ... and the next call compiles again, to the same signature.
  again = peat.analyze(t, g, r)
  assert int(again.n) == t.size
