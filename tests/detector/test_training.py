"""Training-level rules of the Detector (detector/_training.py)."""

import math

import numpy as np
import pytest

from peat_jax import detector

STEPS = [0, 10, 20, 30, 40, 50]


def _noisy(values, seed=0, spread=0.1):
  """values times log-normal noise of about +-``spread`` decades."""
  rng = np.random.default_rng(seed)
  return [float(v * 10 ** rng.uniform(-spread, spread)) for v in values]


@pytest.mark.parametrize("growth", [2.5, 4.0, 30.0])
def test_geometric_growth_rises_by_its_factor(growth):
  ratios = [0.3 * growth ** (s / 50) for s in STEPS]
  t = detector.noise_trend(STEPS, ratios)
  assert t["rises"]
  assert t["factor"] == pytest.approx(growth, rel=1e-9)
  assert t["factor_loo"] == pytest.approx(growth, rel=1e-9)
  assert (t["from_step"], t["to_step"], t["points"]) == (0, 50, 6)


def test_noisy_growth_rises_noisy_flat_does_not():
  grow = detector.noise_trend(STEPS, _noisy([2 ** (s / 10) for s in STEPS]))
  assert grow["rises"] and 10 < grow["factor"] < 100
  for seed in range(20):
    flat = detector.noise_trend(STEPS, _noisy([1.0] * 6, seed, spread=0.2))
    assert not flat["rises"], (seed, flat)


def test_one_noisy_step_is_not_a_trend():
  for at in range(len(STEPS)):
    ratios = [0.8] * 6
    ratios[at] = 80.0  # a single spike, anywhere
    t = detector.noise_trend(STEPS, ratios)
    assert not t["rises"], (at, t)
  late = detector.noise_trend(STEPS, [0.8, 0.8, 0.8, 0.8, 0.8, 80.0])
  assert late["factor_loo"] == pytest.approx(1.0)


def test_growth_below_the_factor_or_too_few_steps_does_not_rise():
  slow = detector.noise_trend(STEPS, [1.8 ** (s / 50) for s in STEPS])
  assert not slow["rises"] and slow["factor"] == pytest.approx(1.8)
  three = detector.noise_trend(STEPS[:3], [1.0, 10.0, 100.0])
  assert three["factor"] == pytest.approx(100.0) and not three["rises"]
  falling = detector.noise_trend(STEPS, [10 ** (-s / 10) for s in STEPS])
  assert not falling["rises"] and falling["factor"] < 1


def test_unusable_ratios_are_left_out():
  ratios = [None, math.nan, 0.0, math.inf, 1.0, 8.0]
  t = detector.noise_trend(STEPS, ratios)
  assert t["points"] == 2 and not t["rises"]
  assert detector.noise_trend([], [])["factor"] is None
  exact = detector.noise_trend(STEPS, [0.0] * 6)
  assert exact == {"rises": False, "factor": None, "factor_loo": None,
                   "from_step": None, "to_step": None, "points": 0}


@pytest.mark.parametrize("ratio,verdict", [
    (None, "pass"), (0.0, "pass"), (0.99, "pass"), (1.0, "pass"),
    (1.01, "warn"), (math.inf, "warn"), (math.nan, "warn")])
def test_weights_beyond_the_bf16_proxy_warn(ratio, verdict):
  assert detector.weights_verdict(ratio) == verdict


@pytest.mark.parametrize("ratios,far_below", [
    ([0.001, 0.05], True), ([0.0], True), ([0.05, 0.2], False),
    ([], False), ([None], False), ([0.01, math.nan], False),
    ([math.inf], False)])
def test_benign_records_pass_only_far_below_the_proxy(ratios, far_below):
  assert detector.benign_far_below(ratios) is far_below
  if far_below:  # a margin: 2x the largest still clears the limit
    assert 2 * max(ratios) <= detector.BENIGN_TRAINING_LIMIT
