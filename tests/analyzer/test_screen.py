"""The triage screen's facts are the decomposition's, exactly.

The screen (``screen_split_many``, ``peat.analyzer.screen``) computes the
golden envelope's maxima and counts in its own variadic reductions; they
must be bit for bit the fields of the record's decomposition (maxima and
integer counts do not depend on the order of the reductions). Over dtypes
(float32, bf16, fp16, float64), with and without a float64 reference,
with NaN/Inf in one output or both, at the record's own shape
(many-record calls) and padded to its size bucket (the lone API).
"""

import jax
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.analyzer.signature import split_reference

_FACTS = ("z_max_test", "env_golden_z", "env_theta_golden", "n_beyond",
          "n_nonfinite_mismatch")


def _record(shape, dtype, fault, seed):
  rng = np.random.default_rng(seed)
  r = rng.standard_normal(shape) * np.exp2(rng.integers(-3, 4, shape[-1]))
  g = r.astype(dtype)
  t = (r * (1 + 2.0 ** -9 * rng.standard_normal(shape))).astype(dtype)
  flat = t.reshape(-1)
  idx = rng.choice(flat.size, 4, replace=False)
  if fault == "outliers":
    flat[idx] = flat[idx] * 3 + 1
  elif fault == "nonfinite":
    flat[idx[:2]] = np.nan
    flat[idx[2]] = np.inf
    g.reshape(-1)[idx[3]] = -np.inf  # golden's own; the KUT's finite
  return t, g, r


_CASES = [((48, 130), np.float32, "outliers"),
          ((64, 96), ml_dtypes.bfloat16, "nonfinite"),
          ((3, 2, 40), np.float16, "outliers"),
          ((33,), np.float64, "nonfinite"),
          ((129, 129), np.float32, "nonfinite")]


def _slow(case):
  return pytest.param(case, marks=pytest.mark.slow)


@pytest.mark.parametrize("with_ref", [True, False])
@pytest.mark.parametrize("case", [_CASES[1]] + [
    _slow(c) for c in _CASES if c is not _CASES[1]])
def test_screen_facts_are_the_decompositions(case, with_ref):
  shape, dtype, fault = case
  t, g, r = _record(shape, dtype, fault, seed=len(shape))
  # A second record of another shape in the same call: many records.
  t2, g2, r2 = _record((5, 11), dtype, "outliers", seed=9)
  refs = (r, r2) if with_ref else (None, None)
  halves = [split_reference(x, np.shape(x), batched=False) if x is not None
            else (None, None) for x in refs]
  screens = peat.analyzer.screen_split_many(
      [t, t2], [g, g2], [h for h, _ in halves], [lo for _, lo in halves],
      to_host=True)
  decs = peat.analyzer.decompose_split_many(
      [t, t2], [g, g2], [h for h, _ in halves], [lo for _, lo in halves],
      to_host=True)
  for (sig, scr), dec in zip(screens, decs):
    for name in _FACTS:
      want = np.asarray(getattr(dec, name))
      np.testing.assert_array_equal(np.asarray(getattr(scr, name)), want,
                                    err_msg=name)
      np.testing.assert_array_equal(np.asarray(getattr(sig, name)), want,
                                    err_msg=name)
  assert int(screens[0][1].n_beyond) > 0  # the fault is seen
  # The lone record, padded to its size bucket: its lone decomposition's.
  _, scr = jax.device_get(peat.analyzer.screen(t, g, refs[0]))
  dec = jax.device_get(peat.analyzer.decomposition(t, g, refs[0]))
  for name in _FACTS:
    np.testing.assert_array_equal(np.asarray(getattr(scr, name)),
                                  np.asarray(getattr(dec, name)),
                                  err_msg=f"padded {name}")
