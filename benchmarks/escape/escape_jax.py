"""The escape suite's JAX kernels under test: formula-level slips of ports.

Each is a ``py:`` KUT (docs/kernels.md, "Your own kernels") with its site
kernel's KUT signature, and a documented real-world failure mode that
passes random-input unit tests (benchmarks/escape_suite.py):

| function | site kernel | the slip (precedent) |
| --- | --- | --- |
| ``dot_general_by_stride`` | ``dot_general`` | batches walked in the order of the left operand's strides (innermost first, the cache-friendly order for strided views) and written out as if in the logical order: batches permuted when the batch dims' strides are not in their logical order, as for q, k, v of ``[B, T, H, D]`` sliced from a fused QKV projection (flash-attention issue 2541: strided q/k/v views mishandled) |
| ``gelu_abs_erf`` | ``gelu`` | the erf of Abramowitz and Stegun 7.1.26 (valid for z >= 0) evaluated on ``|z|`` without restoring the sign: exact on non-negative inputs, ``x - gelu(x)`` on negative ones (a sign bug invisible on ``torch.rand`` inputs) |
| ``reduce_max_from_zero`` | ``reduce_max`` | the running max started at 0 instead of -inf: right on non-negative inputs and on rows with a positive entry, 0 on rows that are all negative |
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _strides(shape) -> list[int]:
  """Row-major element strides of ``shape``."""
  out, acc = [], 1
  for n in reversed(shape):
    out.append(acc)
    acc *= int(n)
  return out[::-1]


def dot_general_by_stride(lhs, rhs, *, dimension_numbers, precision=None,
                          preferred_element_type=None, out_sharding=None):
  """``lax.dot_general`` whose batches are written back in stride order.

  The port computes every batch's product right, walking the batch dims
  innermost first (smallest stride of the left operand: the cache-friendly
  order for strided views), and writes the products out one after another
  as if they came in the logical order. One batch dim, or batch dims whose
  strides fall in their logical order, give the right result;
  ``bthd,bshd->bhts`` (heads strided inside each row, as q, k, v sliced
  from a fused QKV projection are) puts the ``(h, b)``-ordered batches in
  the places of the ``(b, h)`` ones.
  """
  del out_sharding
  (_, _), (lb, _) = dimension_numbers
  lb = tuple(int(d) for d in lb)
  out = lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                        preferred_element_type=preferred_element_type)
  st = _strides(lhs.shape)
  order = sorted(range(len(lb)), key=lambda i: st[lb[i]])  # the slip
  if order == list(range(len(lb))):
    return out
  walked = jnp.transpose(out, order + list(range(len(lb), out.ndim)))
  return walked.reshape(out.shape)  # written as if in the logical order


# Abramowitz and Stegun 7.1.26: erf(z) for z >= 0, |error| <= 1.5e-7.
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf_nonnegative(z):
  t = 1.0 / (1.0 + _P * z)
  poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
  return 1.0 - poly * jnp.exp(-z * z)


def gelu_abs_erf(x, approximate=False):
  """GELU ``x Phi(x)`` with a polynomial erf, its sign never restored."""
  if approximate:  # the tanh form is not what this port implements
    return jax.nn.gelu(x, approximate=True)
  z = jnp.abs(x) * (1.0 / math.sqrt(2.0))  # the formula wants z >= 0 ...
  return 0.5 * x * (1.0 + _erf_nonnegative(z))  # ... and erf(-z) = -erf(z)


def reduce_max_from_zero(x, *, axes, **params):
  """``lax.reduce_max`` as a running max that starts at 0, not -inf:
  ``max(0, x_1, ..., x_n)`` (differentiable, as the port's is)."""
  del params
  return jnp.maximum(lax.reduce_max(x, tuple(axes)), jnp.zeros((), x.dtype))
