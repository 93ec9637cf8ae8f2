"""Port mismatches: composite kernels as a cross-framework port gets them wrong.

Each function here is a kernel under test with the signature of the
reference models' composite of its kind (``models/layers.py``: layer norm
``(x, scale, bias, eps)``, softmax ``(x)``, attention ``(q, k, v, mask)``,
GELU ``(x)``), computed in plain JAX, and wrong in the way ports are:

* ``parameter``: a constant of the computation differs: another
  normalization epsilon (a framework's default where the model set its
  own, or added to the standard deviation instead of the variance), the
  unbiased variance where the model uses the biased one, a
  softmax temperature, a missing or doubled ``1/sqrt(d)`` in attention;
* ``approximation``: another closed form of the same function: GELU's tanh
  form where the model uses erf, a fast exponential, an approximate
  reciprocal or reciprocal square root refined by one Newton step.

:data:`BENIGN_PORTS` are correct ports that only sum in another order (the
Detector must pass them). They run anywhere a KUT does (``peat.register_kut``, a ``py:`` spec) and
are the port-mismatch cases of the Detector's calibration.
:data:`EXPECTED_ERROR_MODEL` names the model the Detector should name.
"""

from __future__ import annotations

import functools
import types

import jax
from jax import lax
import jax.numpy as jnp


def _moments(x, unbiased: bool = False):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  sq = jnp.sum(jnp.square(x - mean), axis=-1, keepdims=True)
  n = x.shape[-1]
  return mean, sq / (n - 1 if unbiased else n)


def layer_norm_eps(x: jax.Array, scale: jax.Array, bias: jax.Array,
                   eps: float = 1e-6, *, port_eps: float = 1e-5) -> jax.Array:
  """Layer norm with the port's own epsilon (``port_eps``), not the model's."""
  del eps
  mean, var = _moments(x)
  return (x - mean) * lax.rsqrt(var + port_eps) * scale + bias


def layer_norm_eps_std(x: jax.Array, scale: jax.Array, bias: jax.Array,
                       eps: float = 1e-6, *, port_eps: float = 1e-5
                       ) -> jax.Array:
  """Layer norm with the epsilon added to the standard deviation,
  ``(x - mean) / (sqrt(var) + eps)``, where the model adds it to the
  variance (some TensorFlow and hand-written kernels do)."""
  del eps
  mean, var = _moments(x)
  return (x - mean) / (jnp.sqrt(var) + port_eps) * scale + bias


def layer_norm_unbiased(x: jax.Array, scale: jax.Array, bias: jax.Array,
                        eps: float = 1e-6) -> jax.Array:
  """Layer norm with the unbiased variance (divides by ``n - 1``)."""
  mean, var = _moments(x, unbiased=True)
  return (x - mean) * lax.rsqrt(var + eps) * scale + bias


def _fast_rsqrt(v: jax.Array) -> jax.Array:
  """1/sqrt(v) from the exponent trick and one Newton step (~2e-3 rel.)."""
  i = lax.bitcast_convert_type(v.astype(jnp.float32), jnp.int32)
  y = lax.bitcast_convert_type(jnp.int32(0x5F3759DF) - (i >> 1), jnp.float32)
  return (y * (1.5 - 0.5 * v * y * y)).astype(v.dtype)


def layer_norm_fast_rsqrt(x: jax.Array, scale: jax.Array, bias: jax.Array,
                          eps: float = 1e-6) -> jax.Array:
  """Layer norm with an approximate reciprocal square root."""
  mean, var = _moments(x)
  return (x - mean) * _fast_rsqrt(var + eps) * scale + bias


def softmax_temperature(x: jax.Array, *, temperature: float = 1.1
                        ) -> jax.Array:
  """Softmax of ``x / temperature`` (a temperature the model does not use)."""
  return jax.nn.softmax(x / jnp.asarray(temperature, x.dtype), axis=-1)


def _fast_exp(x: jax.Array) -> jax.Array:
  """exp(x) as 2**(x log2 e) with a degree-3 polynomial of the fraction."""
  t = x.astype(jnp.float32) * 1.4426950408889634
  t = jnp.maximum(t, -126.0)
  n = jnp.floor(t)
  f = t - n
  p = 1.0 + f * (0.6958 + f * (0.2262 + f * 0.0780))
  scale = lax.bitcast_convert_type(
      ((n.astype(jnp.int32) + 127) << 23), jnp.float32)
  return (p * scale).astype(x.dtype)


def softmax_fast_exp(x: jax.Array) -> jax.Array:
  """Softmax with an approximate exponential (a cubic of the fraction)."""
  e = _fast_exp(x - jnp.max(x, axis=-1, keepdims=True))
  return e / jnp.sum(e, axis=-1, keepdims=True)


def _fast_recip(s: jax.Array) -> jax.Array:
  """1/s from the exponent trick and one Newton step (~4e-3 rel.)."""
  i = lax.bitcast_convert_type(s.astype(jnp.float32), jnp.int32)
  y = lax.bitcast_convert_type(jnp.int32(0x7EF311C7) - i, jnp.float32)
  return (y * (2.0 - s * y)).astype(s.dtype)


def softmax_fast_recip(x: jax.Array) -> jax.Array:
  """Softmax multiplying by an approximate reciprocal of the sum."""
  e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
  return e * _fast_recip(jnp.sum(e, axis=-1, keepdims=True))


def _attention(q, k, v, mask, scale):
  scores = jnp.einsum("bthd,bshd->bhts", q, k) * jnp.asarray(scale, q.dtype)
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
  return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)


def attention_no_scale(q: jax.Array, k: jax.Array, v: jax.Array,
                       mask: jax.Array | None = None) -> jax.Array:
  """Attention without the ``1/sqrt(d)`` of the scores."""
  return _attention(q, k, v, mask, 1.0)


def attention_double_scale(q: jax.Array, k: jax.Array, v: jax.Array,
                           mask: jax.Array | None = None) -> jax.Array:
  """Attention with ``1/sqrt(d)`` applied twice (``1/d``)."""
  return _attention(q, k, v, mask, 1.0 / q.shape[-1])


def gelu_tanh(x: jax.Array) -> jax.Array:
  """GELU's tanh approximation where the model uses the exact erf form."""
  return jax.nn.gelu(x, approximate=True)


def dot_general_split_k_edge(lhs: jax.Array, rhs: jax.Array, *,
                             dimension_numbers, precision=None,
                             preferred_element_type=None, tile: int = 16,
                             **unused) -> jax.Array:
  """A correct ``dot_general`` port whose last partial column tile (the
  output columns past the last multiple of ``tile``) sums its K terms in
  two halves, as a split-K kernel's edge path does: rounding-level error
  confined to the last columns. Benign: the Detector must pass it."""
  del unused, precision, preferred_element_type
  out = lax.dot_general(lhs, rhs, dimension_numbers)
  (lc, rc), _ = dimension_numbers
  if out.ndim != 2 or len(lc) != 1 or out.shape[1] % tile == 0:
    return out
  k, w = lhs.shape[lc[0]], out.shape[1] % tile
  part = lambda a, b: lax.dot_general(
      lax.slice_in_dim(lhs, a, b, axis=lc[0]),
      lax.slice_in_dim(rhs, a, b, axis=rc[0]), dimension_numbers)
  edge = part(0, k // 2) + part(k // 2, k)
  return out.at[:, -w:].set(edge[:, -w:])


#: name -> (site kernel, a benign port: another summation order only).
BENIGN_PORTS: types.MappingProxyType = types.MappingProxyType({
    "split_k_edge": ("dot_general", dot_general_split_k_edge),
})

#: kind -> name -> the port-mismatch KUT (reference composite signature).
PORTS: types.MappingProxyType = types.MappingProxyType({
    "layer_norm": types.MappingProxyType({
        "eps_1e-5": functools.partial(layer_norm_eps, port_eps=1e-5),
        "eps_1e-3": functools.partial(layer_norm_eps, port_eps=1e-3),
        "eps_in_std": layer_norm_eps_std,
        "unbiased_var": layer_norm_unbiased,
        "fast_rsqrt": layer_norm_fast_rsqrt,
    }),
    "softmax": types.MappingProxyType({
        "temperature_1.1": functools.partial(softmax_temperature,
                                             temperature=1.1),
        "temperature_0.5": functools.partial(softmax_temperature,
                                             temperature=0.5),
        "fast_exp": softmax_fast_exp,
        "fast_recip": softmax_fast_recip,
    }),
    "attention": types.MappingProxyType({
        "no_scale": attention_no_scale,
        "double_scale": attention_double_scale,
    }),
    "gelu": types.MappingProxyType({"tanh": gelu_tanh}),
})

#: kind -> name -> the error model the Detector should name.
EXPECTED_ERROR_MODEL: types.MappingProxyType = types.MappingProxyType({
    kind: types.MappingProxyType({
        name: ("approximation" if name.startswith(("fast_", "tanh"))
               else "parameter") for name in ports})
    for kind, ports in PORTS.items()})
