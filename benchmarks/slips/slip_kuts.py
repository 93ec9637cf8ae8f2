"""Ports with one slip each, as a kernel engineer writes them (py: KUTs of
benchmarks/bench_slip_search.py)."""

from jax import lax


def dot_drop_last(lhs, rhs, *, dimension_numbers, precision=None,
                  preferred_element_type=None, **unused):
  """A dot_general whose loop over its contraction stops one term short."""
  del precision, unused
  (lc, rc), _ = dimension_numbers
  lhs = lax.slice_in_dim(lhs, 0, lhs.shape[lc[-1]] - 1, axis=lc[-1])
  rhs = lax.slice_in_dim(rhs, 0, rhs.shape[rc[-1]] - 1, axis=rc[-1])
  return lax.dot_general(lhs, rhs, dimension_numbers,
                         preferred_element_type=preferred_element_type)
