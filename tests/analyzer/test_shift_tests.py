"""The shift tests of a record at its own shape equal their general form.

`_shift_tests` counts bitwise matches of t against g shifted by columns,
by rows and transposed, on sampled rows. A record at its own shape (R x C
its size, R and C static) takes row copies and static slices
(`_shift_tests_static`); a padded record, R and C traced, gathers every
compared element. Both must give the same six counts, exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.analyzer.signature import _pass


def _record(shape, kind, seed):
  rng = np.random.default_rng(seed)
  g = rng.standard_normal(shape).astype(np.float32)
  if kind == "col_shift":
    t = np.roll(g, 3, axis=1)
  elif kind == "col_shift_back":
    t = np.roll(g, -8, axis=1)
  elif kind == "row_shift":
    t = np.roll(g, 2, axis=0)
  elif kind == "transpose":
    t = np.ascontiguousarray(g.T)
  else:  # noise: few elements match anything
    t = (g * (1 + 1e-6 * rng.standard_normal(shape))).astype(np.float32)
  t.reshape(-1)[::7] = 0  # zeros are never informative
  return t.view(np.uint32).reshape(-1), g.view(np.uint32).reshape(-1)


_static = jax.jit(_pass._shift_tests, static_argnums=(2, 3))
# R and C traced, the record padded past its size: the general form.
_general = jax.jit(lambda tb, gb, rows, cols: _pass._shift_tests(
    tb, gb, rows, cols))


@pytest.mark.parametrize("shape,kind", [
    ((7, 5), "col_shift"), ((48, 130), "col_shift_back"),
    ((48, 130), "row_shift"), ((129, 129), "transpose"),
    ((64, 600), "col_shift"), ((3, 520), "col_shift_back"),
    ((40, 515), "row_shift"), ((1, 70000), "col_shift"),
    ((70000, 1), "row_shift"), ((16, 16), "noise")])
def test_own_shape_counts_equal_the_general_form(shape, kind):
  tb, gb = _record(shape, kind, seed=sum(shape))
  rows, cols = shape
  own = [np.asarray(x) for x in _static(jnp.asarray(tb), jnp.asarray(gb),
                                        rows, cols)]
  pad = np.zeros(37, np.uint32)
  general = [np.asarray(x) for x in _general(
      jnp.asarray(np.concatenate([tb, pad])),
      jnp.asarray(np.concatenate([gb, pad + 1])), jnp.int32(rows),
      jnp.int32(cols))]
  for a, b in zip(own, general):
    np.testing.assert_array_equal(a, b)
  col_m, col_n, row_m, row_n, tr_m, tr_n = own
  shift = {"col_shift": 3, "col_shift_back": -8}.get(kind)
  if shift is not None and cols > 1:  # the column shift's own count
    k = shift + _pass.SHIFT_RANGE
    assert col_m[k] > col_n[k] // 2 > 0
  if kind == "row_shift":
    k = 2 + _pass.SHIFT_RANGE
    assert row_m[k] > row_n[k] // 2 > 0
  if kind == "transpose":
    assert tr_m > tr_n // 2 > 0
  else:
    assert tr_m <= tr_n
  if kind == "noise":
    assert max(col_m) <= 1 and max(row_m) <= 1
