"""Shared checks of the Analyzer's tests."""

import numpy as np
import pytest

# Fields that are near-zero differences of sums (cancellation to rounding):
# their value is the summation order's.
ORDER_ONLY = {"row_resid", "fit_resid", "balance_test", "balance_golden"}


def assert_same_but_order(a, b):
  """Two Signatures (or Screens, Decompositions) of one record computed in
  two summation orders (its size bucket's executable and its own shape's):
  shapes, counts, bits and shares equal, floats to 2e-4 but the sums that
  cancel to rounding (``ORDER_ONLY``)."""
  for name in a._fields:
    x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
    assert x.shape == y.shape, name
    if x.dtype.kind in "biu":
      np.testing.assert_array_equal(x, y, err_msg=name)
    elif name not in ORDER_ONLY:
      np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-30, err_msg=name)


@pytest.fixture(name="same_but_order")
def _same_but_order():
  """`assert_same_but_order`, for the tests of this folder."""
  return assert_same_but_order
