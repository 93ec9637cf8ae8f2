"""Property-based tests of the Analyzer over dtypes, shapes, special values.

Shapes come from a small fixed set so that compiled executables are reused
across examples (compilation, not analysis, dominates the cost).
"""

import hypothesis
import hypothesis.strategies as st
import ml_dtypes
import numpy as np

from peat_jax import analyzer

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
SPECIALS = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3e38, -3e38, 65504.0,
            1.0, -1.0, 448.0]
# The ref_* fields, noise_ratio and share_*_closer are NaN without reference.
FINITE = [f for f in analyzer.Signature._fields
          if not (f.startswith("ref_") or f in (
              "noise_ratio", "share_test_closer", "share_golden_closer"))]


@st.composite
def records(draw):
  dtype = draw(st.sampled_from(DTYPES))
  shape = draw(st.sampled_from([(64, 96), (7,)]))
  n = int(np.prod(shape))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  g = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
  t = g * (1 + draw(st.sampled_from([0.0, 1e-7, 1e-3, 1.0])) *
           rng.standard_normal(n))
  for arr in (g, t):
    k = draw(st.integers(0, min(n, 8)))
    pos = rng.choice(n, size=k, replace=False)
    arr[pos] = rng.choice(SPECIALS, size=k)
  if draw(st.booleans()):
    g[:] = draw(st.sampled_from([0.0, np.nan, np.inf]))
  with np.errstate(over="ignore", invalid="ignore"):
    return (t.astype(dtype).reshape(shape), g.astype(dtype).reshape(shape))


@hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
@hypothesis.given(records())
def test_signature_is_defined_for_any_values(rec):
  t, g = rec
  s = analyzer.analyze(t, g)
  n = t.size
  for name in FINITE:
    v = np.asarray(getattr(s, name), np.float64)
    assert not np.isnan(v).any(), name
  assert int(s.n) == n
  assert 0 <= int(s.n_bit_equal) <= int(s.n_value_equal) + int(
      s.n_nan_test) <= n + n
  assert int(np.asarray(s.ulp_hist).sum()) == int(s.n_finite_pairs)
  assert int(s.n_err_pos) + int(s.n_err_neg) <= int(s.n_finite_pairs)
  xor = np.asarray(s.bits_xor)
  assert (xor <= n).all() and (xor == np.asarray(s.bits_up) +
                               np.asarray(s.bits_down)).all()
  assert int(np.asarray(s.row_ndiff).sum()) == n - int(s.n_bit_equal)
  assert 0.0 <= float(s.share_differ) <= 1.0
  assert float(s.abs_max) >= 0 and float(s.abs_rms) <= float(s.abs_max)
  assert -1.0 - 1e-6 <= float(s.bias) <= 1.0 + 1e-6
  pct = np.asarray(s.abs_pct)
  assert (np.diff(pct) >= 0).all() and (pct <= float(s.abs_max)).all()
