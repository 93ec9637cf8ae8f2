"""Records of fewer than min_pattern elements: no noise floor of their own.

A fuzz variant with every other axis at one computes a single dot
product: the golden kernel may round it almost exactly, and a correct
kernel that adds in another order lands a few tens of ulps away. The
golden kernel's error over one element is no noise floor: such a
``reordering`` passes; the same error on min_pattern elements or more is
read against the floor, and warns.
"""

import numpy as np
import pytest

import peat_jax as peat


def _nudged(n: int, ulps: int, seed: int):
  r = np.random.default_rng(seed).standard_normal(n) + 2.0
  g = r.astype(np.float32)
  t = g.copy()
  for _ in range(ulps):
    t = np.nextafter(t, np.float32(np.inf))
  return t, g, r


@pytest.mark.parametrize("n,verdict", [(1, "pass"), (5, "pass"),
                                       (8, "warn"), (64, "warn")])
def test_a_handful_of_elements_sets_no_floor(n, verdict):
  t, g, r = _nudged(n, 20, seed=n)
  d = peat.detect(peat.analyze(t, g, r))
  assert (d.model, d.verdict) == ("reordering", verdict), d.evidence


def test_a_wrong_single_output_still_fails():
  t, g, r = _nudged(1, 0, seed=3)
  t = t * np.float32(1.5)  # a visible slip on one output
  d = peat.detect(peat.analyze(t, g, r))
  assert d.verdict == "fail", (d.model, d.evidence)
