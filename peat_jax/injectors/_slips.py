"""Slips of the grammar made at working precision: the slip search's cases.

The Detector explains a flagged kernel call by searching the slip grammar
(:mod:`peat_jax.core`'s :class:`~peat_jax.core.Slip`, in float64). This
module makes those slips on purpose, at the precision a kernel under test
works in, written apart from that search so that each tests the other:

* :func:`golden_call`: the golden kernel of a call (XLA's own: ``lax``
  and ``jax.nn``; 16-bit inputs as a Flax bf16 model computes them, in
  float32 inside and rounded once to the output's dtype; attention is
  ``jax.nn.dot_product_attention`` itself);
* :func:`slipped_call`: the kernel under test with one slip (on its
  ``base``), or with none: a *correct port* (the same math summed another
  way: blocked reductions, an online softmax that rescales, another
  closed form of the same function, float32 inside);
* :func:`slipped_reference`: the same computation in float64 (the slip's
  own output, what the search should find);
* :func:`slipped_kernel`: a slip as a KUT with the kind's signature;
* :func:`draw_call`, :func:`draw_slip`, :func:`draw_slip_cases`: a
  realistic call of a site kind, a random slip of the grammar that
  applies to it, and seeded cases of both (the property test and the
  benchmark of the grammar draw theirs here);
* :func:`slip_visibility`: whether a slip's own effect on the output is
  beyond the golden kernel's rounding by the margins the Detector needs
  to flag and explain it (:data:`VISIBLE_RMS`, :data:`VISIBLE_MEDIAN`);
  :func:`names_slip`: whether an error model names a slip (its own, or
  a format that rounds the call's inputs alike).

Readings of the grammar's description (``peat_jax/core/_slips.py``) made
here:

* the kernel's reduction (``accumulate``, ``blocked``) is only the
  reduction :data:`~peat_jax.core.REDUCTION_AXES` names: a norm's sums
  (its divisor stays ``n``: a left-out block lowers the mean, a doubled
  one raises it), a softmax's sum of exponentials (its numerators stay),
  attention's two sums over keys (the softmax's and the values'),
  dot_general's last contracting dimension, a convolution's input
  features (``feature_group_count`` 1);
* blocked slips need at least two blocks (a reduction no longer than the
  width would drop or double all of it: ``zero`` or ``scale``, other
  models); an op that would change nothing (a length-1 axis, a format
  every floating argument already fits, a fill with nothing masked, a
  closed form the call already uses) does not apply;
* ``accumulate`` with blocks (``norescale`` on an ``accumulate`` base):
  each block summed in order in the format, the carried sums rounded to
  it after each block;
* ``repeat``'s first tile reads the entries of the next tile that exist
  (a partial next tile leaves the rest as they were);
* ``mask_shift``: query ``i`` reads the mask row of query
  ``clip(i + shift, 0, T - 1)``, the causal mask's too (``is_causal``
  is then a ``tril`` mask argument's equal);
* a blocked ``drop`` also leaves the block out of the softmax's max (a
  loop that skips a block never sees it: the same value where the max
  cancels, and no 0/0 where the kept keys are all masked);
* ``drop`` and ``repeat`` tiles of width 1 (an element, row or column)
  and of the lattice; an operand op may move an integer or boolean
  argument (labels, positions, a mask) as well as a floating one;
* ``inputs`` round every floating argument (a bf16 model's float32 norm
  parameters too) and keep the rounded values in float32 (no second
  rounding back to a 16-bit argument's dtype);
* ``rcp_newton1`` in ``log_softmax``: ``-log(s)`` as ``log(rcp(s))``;
* the bit tricks (``exp_schraudolph``, ``rsqrt_newton1``,
  ``rcp_newton1``) read and write float32 bits whatever the compute
  dtype (their Newton steps and polynomials run in it);
* ``fill``'s golden value: the compute format's lowest (jax fills
  ``-0.7`` of float32's max; both weigh a masked key zero);
* cross-entropy's output has its logits' dtype.
"""

from __future__ import annotations

import collections
import functools
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core
from peat_jax.core import APPROXIMATIONS, ONLINE_SOFTMAX_KINDS, PARAMETERS
from peat_jax.core import REDUCTION_AXES, SLIP_MODES, TILE_LATTICE
from peat_jax.core import PeatError, Slip, check_slip
from peat_jax.injectors import _rounding

#: The site kinds the slips are made for, with their call conventions
#: (docs/kernels.md): dot_general ``(lhs, rhs, dimension_numbers=...,
#: precision=, preferred_element_type=)``; conv_general_dilated ``(lhs,
#: rhs, window_strides=, padding=, lhs_dilation=, rhs_dilation=,
#: dimension_numbers=, feature_group_count=1, batch_group_count=1, ...)``;
#: softmax / log_softmax ``(x)``; layer_norm ``(x, scale, bias, eps=)``;
#: rms_norm ``(x, scale, eps=)``; attention ``(q, k, v[, mask], scale=,
#: is_causal=)``; gelu ``(x, approximate=)``; silu ``(x[, up])``; rope
#: ``(x, positions, theta=)``; cross_entropy ``(logits, labels,
#: reduction=)``.
SLIP_KINDS = ("dot_general", "conv_general_dilated", "softmax", "log_softmax",
         "layer_norm", "rms_norm", "attention", "gelu", "silu", "rope",
         "cross_entropy")

#: The block width of a correct port's reductions (``slip=None``).
CONTROL_WIDTH = 16
#: The kinds whose correct port is an online softmax (rescaling what it
#: carries when a block raises the max, as a flash kernel does); softmax's
#: own sums its exponentials in blocks after a first pass for the max
#: (an online pass's rescalings round the sum, one factor per row: up to
#: 3x golden's RMS error on a row of 40, too near the Detector's 4x for a
#: control that must pass).
_ONLINE_CONTROLS = ("log_softmax", "cross_entropy", "attention")

_HIGHEST = lax.Precision.HIGHEST


# --------------------------------------------------------------- the call


class _Call(NamedTuple):
  """One call: its kind, arguments, array leaves (call order) and the
  template that rebuilds ``(args, kwargs)`` from them."""
  kind: str
  args: tuple
  kwargs: dict
  arrays: list
  template: tuple

  def rebuild(self, arrays: Sequence[Any]) -> tuple[tuple, dict]:
    treedef, static, is_array = self.template
    it = iter(arrays)
    return jax.tree.unflatten(
        treedef, [next(it) if a else s for s, a in zip(static, is_array)])


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray))


def _call(kind: str, args: Sequence[Any],
          kwargs: Mapping[str, Any] | None) -> _Call:
  """The call's parts, its kind checked."""
  if kind not in SLIP_KINDS:
    raise PeatError(f"unknown site kind {kind!r}; expected one of "
                    f"{', '.join(SLIP_KINDS)}")
  args, kwargs = tuple(args), dict(kwargs or {})
  leaves, treedef = jax.tree.flatten((args, kwargs))
  is_array = tuple(_is_array(x) for x in leaves)
  arrays = [x for x, a in zip(leaves, is_array) if a]
  static = tuple(None if a else x for x, a in zip(leaves, is_array))
  if not arrays:
    raise PeatError(f"{kind}: the call has no array argument; expected "
                    "the site's arrays (jax or numpy)")
  return _Call(kind, args, kwargs, arrays, (treedef, static, is_array))


def _floating(x) -> bool:
  return jnp.issubdtype(np.dtype(x.dtype), jnp.floating)


def _out_dtype(call: _Call) -> np.dtype:
  """The output's dtype: float64 where an argument is float64 (the
  slip's own float64 output), the dot's or conv's result type where
  given, else the first array's."""
  if any(np.dtype(a.dtype) == np.float64 for a in call.arrays):
    return np.dtype(np.float64)
  pet = call.kwargs.get("preferred_element_type")
  if call.kind in ("dot_general", "conv_general_dilated") and pet is not None:
    return np.dtype(pet)
  return np.dtype(call.arrays[0].dtype)


def _compute_dtype(call: _Call) -> np.dtype:
  """float64 for a float64 call, float32 otherwise (16-bit upcast)."""
  return np.dtype(np.float64 if _out_dtype(call) == np.float64
                  else np.float32)


def _reduction_length(call: _Call) -> int | None:
  """The length of the kind's reduction (REDUCTION_AXES), or None."""
  kind, a = call.kind, call.args
  if kind == "dot_general":
    lc = call.kwargs["dimension_numbers"][0][0]
    return int(np.shape(a[0])[lc[-1]]) if lc else None
  if kind == "conv_general_dilated":
    return int(np.shape(a[0])[_conv_dn(call.kwargs, a)[0][1]])
  if kind == "attention":
    return int(np.shape(a[1])[1])
  if kind in REDUCTION_AXES:
    return int(np.shape(a[0])[-1])
  return None


def _conv_dn(kw: Mapping[str, Any], args) -> tuple:
  """(lhs_spec, rhs_spec, out_spec) of a convolution call."""
  dn = lax.conv_dimension_numbers(np.shape(args[0]), np.shape(args[1]),
                                  kw.get("dimension_numbers"))
  return dn.lhs_spec, dn.rhs_spec, dn.out_spec


def _not_applicable(slip: Slip, kind: str, why: str, fix: str) -> PeatError:
  return PeatError(f"slip {slip.name} ({slip.category}:{slip.op}) does not "
                   f"apply to {kind}: {why}; {fix}")


# ----------------------------------------------------------- the reducer


class _Reducer(NamedTuple):
  """How the kernel's reduction sums: in the golden order (all fields
  empty), in blocks of ``width`` (a block left out or counted twice:
  ``op``, ``where``), or in order in ``fmt``."""
  fmt: str = ""
  width: int = 0
  op: str = ""
  where: str = ""

  def blocks(self, n: int) -> list[tuple[int, int, float]]:
    """(start, size, weight) of each block in order."""
    width = self.width or n
    out = [(lo, min(width, n - lo), 1.0) for lo in range(0, n, width)]
    if self.op:
      i = 0 if self.where == "first" else len(out) - 1
      out[i] = out[i][:2] + (0.0 if self.op == "drop" else 2.0,)
    return out

  def kept(self, n: int) -> np.ndarray | None:
    """Which terms the reduction reads (None: all)."""
    return None if self.op != "drop" else self.weights(n) > 0

  def max(self, z: jax.Array) -> jax.Array:
    """The max over the last axis of the terms it reads (``[..., 1]``):
    a loop that skips a block never sees its values."""
    kept = self.kept(z.shape[-1])
    if kept is not None:
      z = jnp.where(jnp.asarray(kept), z, -jnp.inf)
    return jnp.max(z, axis=-1, keepdims=True)

  def weights(self, n: int) -> np.ndarray:
    """Each term's weight (0: left out, 2: counted twice)."""
    w = np.ones(n)
    for lo, size, wb in self.blocks(n):
      w[lo:lo + size] = wb
    return w

  def sum(self, x: jax.Array, axis: int = -1) -> jax.Array:
    """The reduction of materialized terms ``x`` along ``axis`` (removed)."""
    axis = axis % x.ndim
    n = x.shape[axis]
    return self.contract(
        lambda lo, size: jnp.sum(lax.dynamic_slice_in_dim(x, lo, size, axis),
                                 axis), n)

  def contract(self, part: Callable[[Any, int], jax.Array],
               n: int) -> jax.Array:
    """The reduction of a length-``n`` axis from its partial results:
    ``part(start, size)`` reduces ``[start, start + size)`` (a static
    ``size``; ``start`` may be traced)."""
    if self.fmt:
      return _in_order(part, n, self.weights(n), self.fmt)
    total = None
    for lo, size, wb in self.blocks(n):
      if wb == 0.0:
        continue
      p = part(lo, size)
      p = p * jnp.asarray(wb, p.dtype) if wb != 1.0 else p
      total = p if total is None else total + p
    return total if total is not None else jnp.zeros_like(part(0, 1))


def _rounder(fmt: str) -> Callable[[jax.Array], jax.Array]:
  f = _core.get_format(fmt)
  return lambda v: _rounding.round_nearest(v, f)


def _in_order(part, n: int, weights: np.ndarray, fmt: str) -> jax.Array:
  """Terms ``part(k, 1)`` (weighted) summed in order in ``fmt``: each
  term and each partial sum rounded to nearest."""
  rnd = _rounder(fmt)
  first = part(0, 1)
  w = jnp.asarray(weights, first.dtype)

  def step(acc, k):
    return rnd(acc + rnd(part(k, 1) * w[k])), None

  total, _ = lax.scan(step, jnp.zeros_like(first), jnp.arange(n))
  return total


# ----------------------------------------------------------- approximations


def _f32_bits(x: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)


def _from_bits(i: jax.Array, like: jax.Array) -> jax.Array:
  return lax.bitcast_convert_type(i, jnp.float32).astype(like.dtype)


def _pow2_parts(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``x / ln 2`` as (n, f): its floor (clamped to float32's normal
  exponents) and fraction in [0, 1)."""
  t = jnp.clip(x / math.log(2.0), -126.0, 127.0)
  n = jnp.floor(t)
  return n, t - n


def _exp_schraudolph(x: jax.Array) -> jax.Array:
  """exp by Schraudolph's bit trick (float32 bits of 2^23 (x / ln 2 +
  127 - 0.0579848))."""
  t = jnp.clip(x / math.log(2.0), -126.0, 127.0)
  bits = (2.0 ** 23 * (t + 127.0 - 0.0579848)).astype(jnp.int32)
  return _from_bits(bits, x)


def _exp_poly3(x: jax.Array) -> jax.Array:
  """exp as 2^n 2^f, 2^f by the cubic 1 + f (0.6960656 + f (0.2244012 +
  f 0.0795332))."""
  n, f = _pow2_parts(x)
  p = 1.0 + f * (0.6960656 + f * (0.2244012 + f * 0.0795332))
  return jnp.ldexp(p, n.astype(jnp.int32))


_TABLE64 = 2.0 ** (np.arange(65) / 64.0)


def _exp_table64(x: jax.Array) -> jax.Array:
  """exp as 2^n times 2^(k/64) from a 65-entry table, linearly
  interpolated."""
  n, f = _pow2_parts(x)
  j = f * 64.0
  k = jnp.clip(jnp.floor(j), 0, 63)
  table = jnp.asarray(_TABLE64, x.dtype)
  lo, hi = table[k.astype(jnp.int32)], table[k.astype(jnp.int32) + 1]
  return jnp.ldexp(lo + (j - k) * (hi - lo), n.astype(jnp.int32))


def _rsqrt_newton1(v: jax.Array) -> jax.Array:
  """1/sqrt(v) from 0x5f3759df - (bits >> 1) and one Newton step."""
  y = _from_bits(jnp.int32(0x5F3759DF) - (_f32_bits(v) >> 1), v)
  return y * (1.5 - 0.5 * v * y * y)


def _rcp_newton1(s: jax.Array) -> jax.Array:
  """1/s from 0x7ef311c7 - bits and one Newton step."""
  y = _from_bits(jnp.int32(0x7EF311C7) - _f32_bits(s), s)
  return y * (2.0 - s * y)


def _erf_poly(z: jax.Array) -> jax.Array:
  """erf by Abramowitz-Stegun 7.1.26."""
  a = jnp.abs(z)
  t = 1.0 / (1.0 + 0.3275911 * a)
  p = t * (0.254829592 + t * (-0.284496736 + t * (
      1.421413741 + t * (-1.453152027 + t * 1.061405429))))
  return jnp.sign(z) * (1.0 - p * jnp.exp(-a * a))


_SQRT_2_PI = math.sqrt(2.0 / math.pi)

#: GELU's closed forms: the call's own (erf or tanh), a library member's,
#: and a correct port's other way to the same function (``*_port``).
_GELU_FORMS = {
    "erf": lambda x: 0.5 * x * (1.0 + lax.erf(x / math.sqrt(2.0))),
    "tanh": lambda x: 0.5 * x * (1.0 + jnp.tanh(
        _SQRT_2_PI * (x + 0.044715 * x ** 3))),
    "sigmoid": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "erf_poly": lambda x: 0.5 * x * (1.0 + _erf_poly(x / math.sqrt(2.0))),
    "erf_port": lambda x: 0.5 * x * lax.erfc(-x / math.sqrt(2.0)),
    "tanh_port": lambda x: x * jax.nn.sigmoid(
        2.0 * _SQRT_2_PI * (x + 0.044715 * x ** 3)),
}


# --------------------------------------------------------------- the knobs


class _Knobs(NamedTuple):
  """What a slip changes inside the kernel (the defaults: golden)."""
  consts: tuple = ()  # (param, value) pairs
  exp: Callable = jnp.exp
  fast_exp: bool = False
  rsqrt: Callable = lax.rsqrt
  rcp: Callable | None = None  # None: a division
  gelu: str = ""  # a form of _GELU_FORMS ("": the call's)
  silu_hard: bool = False
  reducer: _Reducer = _Reducer()
  online: tuple | None = None  # (width, where): "" rescales
  mask_shift: int = 0
  control: bool = False

  def const(self, name: str, default):
    return dict(self.consts).get(name, default)


def _divide(k: _Knobs, a: jax.Array, s: jax.Array) -> jax.Array:
  return a / s if k.rcp is None else a * k.rcp(s)


# ------------------------------------------------------------ the kernels


def _up(x, c) -> jax.Array:
  return jnp.asarray(x).astype(c)


def _k_dot_general(args, kw, k: _Knobs, c) -> jax.Array:
  lhs, rhs = _up(args[0], c), _up(args[1], c)
  dn = kw["dimension_numbers"]
  (lc, rc), _ = dn
  dot = lambda a, b: lax.dot_general(a, b, dn, precision=_HIGHEST,
                                     preferred_element_type=c)
  if not lc:
    return dot(lhs, rhs)
  part = lambda lo, size: dot(
      lax.dynamic_slice_in_dim(lhs, lo, size, lc[-1]),
      lax.dynamic_slice_in_dim(rhs, lo, size, rc[-1]))
  return k.reducer.contract(part, lhs.shape[lc[-1]])


def _k_conv(args, kw, k: _Knobs, c) -> jax.Array:
  lhs, rhs = _up(args[0], c), _up(args[1], c)
  lspec, rspec, _ = _conv_dn(kw, args)
  conv = lambda a, b: lax.conv_general_dilated(
      a, b, kw["window_strides"], kw["padding"], kw.get("lhs_dilation"),
      kw.get("rhs_dilation"), kw.get("dimension_numbers"),
      kw.get("feature_group_count", 1), kw.get("batch_group_count", 1),
      precision=_HIGHEST, preferred_element_type=c)
  part = lambda lo, size: conv(
      lax.dynamic_slice_in_dim(lhs, lo, size, lspec[1]),
      lax.dynamic_slice_in_dim(rhs, lo, size, rspec[1]))
  return k.reducer.contract(part, lhs.shape[lspec[1]])


def _logits(x, k: _Knobs, c) -> jax.Array:
  z = _up(x, c)
  temp = k.const("temperature", 1.0)
  return z if temp == 1.0 else z / jnp.asarray(temp, c)


def _online(z: jax.Array, k: _Knobs, values: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """An online softmax over the last axis of ``z`` in blocks: (the
  running max ``[..., 1]``, the sum of exponentials ``[..., 1]``, and the
  weighted sum of attention's ``values`` ``[b, h, s, d]``: ``[b, h, t,
  d]``, or None).
  A block that raises the max rescales what is carried by ``exp(m_old -
  m_new)``, unless ``k.online``'s ``where`` says it forgets to."""
  width, where = k.online
  red = k.reducer
  rnd = _rounder(red.fmt) if red.fmt else (lambda v: v)
  inner = _Reducer(fmt=red.fmt)
  stale_s = where in ("sum", "both")  # forgets to rescale the sum
  stale_acc = where in ("acc", "both")  # ... the output it carries
  n = z.shape[-1]
  m = jnp.full(z.shape[:-1] + (1,), -jnp.inf, z.dtype)
  s, acc = jnp.zeros_like(m), None
  for lo in range(0, n, width):
    size = min(width, n - lo)
    zb = lax.slice_in_dim(z, lo, lo + size, axis=-1)
    m_new = jnp.maximum(m, jnp.max(zb, axis=-1, keepdims=True))
    alpha = k.exp(m - m_new)
    p = k.exp(zb - m_new)
    s = rnd((s if stale_s else s * alpha) + inner.sum(p)[..., None])
    if values is not None:
      vb = lax.slice_in_dim(values, lo, lo + size, axis=-2)
      pv = inner.contract(lambda a, sz: jnp.einsum(
          "bhts,bhsd->bhtd", lax.dynamic_slice_in_dim(p, a, sz, 3),
          lax.dynamic_slice_in_dim(vb, a, sz, 2), precision=_HIGHEST), size)
      acc = pv if acc is None else rnd(
          (acc if stale_acc else acc * alpha) + pv)
    m = m_new
  return m, s, acc


def _stats(z: jax.Array, k: _Knobs) -> tuple[jax.Array, jax.Array]:
  """The max and the sum of exponentials over the last axis, ``[..., 1]``."""
  if k.online is not None:
    m, s, _ = _online(z, k)
    return m, s
  m = k.reducer.max(z)
  return m, k.reducer.sum(k.exp(z - m))[..., None]


def _k_softmax(args, kw, k: _Knobs, c) -> jax.Array:
  z = _logits(args[0], k, c)
  m, s = _stats(z, k)
  return _divide(k, k.exp(z - m), s)


def _k_log_softmax(args, kw, k: _Knobs, c) -> jax.Array:
  z = _logits(args[0], k, c)
  m, s = _stats(z, k)
  tail = -jnp.log(s) if k.rcp is None else jnp.log(k.rcp(s))
  return (z - m) + tail


def _k_cross_entropy(args, kw, k: _Knobs, c) -> jax.Array:
  z = _logits(args[0], k, c)
  labels = jnp.asarray(args[1]).astype(jnp.int32)
  m, s = _stats(z, k)
  lse = (m + jnp.log(s))[..., 0]
  nll = lse - jnp.take_along_axis(z, labels[..., None], axis=-1)[..., 0]
  alpha = k.const("smoothing", 0.0)
  if alpha:
    nll = (1.0 - alpha) * nll + alpha * (lse - jnp.mean(z, axis=-1))
  return jnp.mean(nll) if kw.get("reduction", "mean") == "mean" else nll


def _k_layer_norm(args, kw, k: _Knobs, c) -> jax.Array:
  x, scale, bias = (_up(a, c) for a in args[:3])
  n = x.shape[-1]
  ddof = k.const("ddof", 0.0)
  eps = k.const("eps", kw.get("eps", 1e-6))
  mean = k.reducer.sum(x)[..., None] / n
  var = k.reducer.sum(jnp.square(x - mean))[..., None] / (n - ddof)
  return (x - mean) * k.rsqrt(var + eps) * scale + bias


def _k_rms_norm(args, kw, k: _Knobs, c) -> jax.Array:
  x, scale = _up(args[0], c), _up(args[1], c)
  n = x.shape[-1]
  ddof = k.const("ddof", 0.0)
  eps = k.const("eps", kw.get("eps", 1e-6))
  offset = k.const("offset", 0.0)
  ms = k.reducer.sum(jnp.square(x))[..., None] / (n - ddof)
  return x * k.rsqrt(ms + eps) * (offset + scale)


def _attention_keep(mask, causal: bool, t: int, s: int, shift: int):
  """The kept (query, key) pairs ``[B|1, H|1, T, S]``, or None: query
  ``i`` reads the row of query ``clip(i + shift)``."""
  rows = np.clip(np.arange(t) + shift, 0, t - 1)
  keep = None
  if causal:
    keep = jnp.asarray(np.arange(s)[None, :] <= rows[:, None])[None, None]
  if mask is not None:
    m = jnp.asarray(mask, bool)
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    if m.shape[2] == t and shift:
      m = jnp.take(m, jnp.asarray(rows), axis=2)
    keep = m if keep is None else jnp.logical_and(keep, m)
  return keep


def _mask_of(args, kw):
  """Attention's mask argument (positional or keyword), or None."""
  return args[3] if len(args) > 3 else kw.get("mask")


def _k_attention(args, kw, k: _Knobs, c) -> jax.Array:
  q, key, v = (_up(a, c) for a in args[:3])
  mask = _mask_of(args, kw)
  d, groups = q.shape[-1], q.shape[2] // key.shape[2]
  if groups > 1:
    key, v = jnp.repeat(key, groups, axis=2), jnp.repeat(v, groups, axis=2)
  scale = kw.get("scale")
  scale = k.const("scale", 1.0 / math.sqrt(d) if scale is None else scale)
  scores = jnp.einsum("bthd,bshd->bhts", q, key, precision=_HIGHEST)
  scores = scores * jnp.asarray(scale, c)
  if kw.get("bias") is not None:
    scores = scores + _up(kw["bias"], c)
  keep = _attention_keep(mask, bool(kw.get("is_causal", False)),
                         q.shape[1], key.shape[1], k.mask_shift)
  if keep is not None:
    fill = k.const("fill", float(jnp.finfo(c).min))
    scores = jnp.where(keep, scores, jnp.asarray(fill, c))
  vt = jnp.transpose(v, (0, 2, 1, 3))  # b h s d
  if k.online is not None:
    _, s, acc = _online(scores, k, vt)
  else:
    m = k.reducer.max(scores)
    p = k.exp(scores - m)
    s = k.reducer.sum(p)[..., None]
    acc = k.reducer.contract(lambda lo, size: jnp.einsum(
        "bhts,bhsd->bhtd", lax.dynamic_slice_in_dim(p, lo, size, 3),
        lax.dynamic_slice_in_dim(vt, lo, size, 2), precision=_HIGHEST),
                             scores.shape[-1])
  return jnp.transpose(_divide(k, acc, s), (0, 2, 1, 3))


def _k_gelu(args, kw, k: _Knobs, c) -> jax.Array:
  x = _up(args[0], c)
  form = k.gelu or ("tanh" if kw.get("approximate", False) else "erf")
  if k.control and form in ("erf", "tanh"):
    form += "_port"
  return _GELU_FORMS[form](x)


def _k_silu(args, kw, k: _Knobs, c) -> jax.Array:
  x = _up(args[0], c)
  up = args[1] if len(args) > 1 else kw.get("up")
  beta = k.const("beta", 1.0)
  if k.silu_hard:
    y = x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0
  elif k.fast_exp or k.control:
    y = x / (1.0 + k.exp(-beta * x))
  else:
    y = x * jax.nn.sigmoid(beta * x)
  return y if up is None else y * _up(up, c)


def _k_rope(args, kw, k: _Knobs, c) -> jax.Array:
  x = _up(args[0], c)
  positions = jnp.asarray(args[1])
  theta = k.const("theta", kw.get("theta", 10000.0))
  offset = k.const("offset", 0.0)
  d = x.shape[-1]
  h = d // 2
  inv_freq = jnp.asarray(theta, c) ** (-jnp.arange(h, dtype=c) * (2.0 / d))
  pos = positions.astype(c) + jnp.asarray(offset, c)
  angle = pos[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
  x1, x2 = x[..., :h], x[..., h:]
  if k.control:  # HF's rotate_half form: x cos + rotate_half(x) sin
    two = lambda a: jnp.concatenate([a, a], -1)
    return x * two(cos) + jnp.concatenate([-x2, x1], -1) * two(sin)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


#: Each kind's kernel with knobs: ``(args, kwargs, knobs, compute dtype)
#: -> output in the compute dtype``.
_KERNELS = {
    "dot_general": _k_dot_general,
    "conv_general_dilated": _k_conv,
    "softmax": _k_softmax,
    "log_softmax": _k_log_softmax,
    "layer_norm": _k_layer_norm,
    "rms_norm": _k_rms_norm,
    "attention": _k_attention,
    "gelu": _k_gelu,
    "silu": _k_silu,
    "rope": _k_rope,
    "cross_entropy": _k_cross_entropy,
}


# ------------------------------------------------------- the golden kernels


def _f32(x) -> jax.Array:
  x = jnp.asarray(x)
  return x.astype(jnp.float32) if jnp.finfo(x.dtype).bits < 32 else x


def _g_dot_general(args, kw, out):
  pet = jnp.float32 if np.dtype(out).itemsize < 4 else out
  return lax.dot_general(args[0], args[1], kw["dimension_numbers"],
                         precision=kw.get("precision"),
                         preferred_element_type=pet)


def _g_conv(args, kw, out):
  pet = jnp.float32 if np.dtype(out).itemsize < 4 else out
  return lax.conv_general_dilated(
      args[0], args[1], kw["window_strides"], kw["padding"],
      kw.get("lhs_dilation"), kw.get("rhs_dilation"),
      kw.get("dimension_numbers"), kw.get("feature_group_count", 1),
      kw.get("batch_group_count", 1), precision=kw.get("precision"),
      preferred_element_type=pet)


def _g_layer_norm(args, kw, out):
  x = _f32(args[0])
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return ((x - mean) * lax.rsqrt(var + kw.get("eps", 1e-6))
          * _f32(args[1]) + _f32(args[2]))


def _g_rms_norm(args, kw, out):
  x = _f32(args[0])
  ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return x * lax.rsqrt(ms + kw.get("eps", 1e-6)) * _f32(args[1])


def _g_attention(args, kw, out):
  mask = _mask_of(args, kw)
  return jax.nn.dot_product_attention(
      args[0], args[1], args[2], bias=kw.get("bias"), mask=mask,
      scale=kw.get("scale"), is_causal=bool(kw.get("is_causal", False)),
      implementation="xla")


def _g_silu(args, kw, out):
  up = args[1] if len(args) > 1 else kw.get("up")
  y = jax.nn.silu(_f32(args[0]))
  return y if up is None else y * _f32(up)


def _g_rope(args, kw, out):
  x = _f32(args[0])
  d = x.shape[-1]
  h = d // 2
  theta = kw.get("theta", 10000.0)
  inv_freq = theta ** (-jnp.arange(h, dtype=x.dtype) * (2.0 / d))
  angle = jnp.asarray(args[1]).astype(x.dtype)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
  x1, x2 = x[..., :h], x[..., h:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _g_cross_entropy(args, kw, out):
  logp = jax.nn.log_softmax(_f32(args[0]), axis=-1)
  labels = jnp.asarray(args[1]).astype(jnp.int32)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  return jnp.mean(nll) if kw.get("reduction", "mean") == "mean" else nll


#: Each kind's golden kernel: ``(args, kwargs, output dtype) -> output``
#: (any float dtype; cast to the output's dtype once after).
_GOLDEN = {
    "dot_general": _g_dot_general,
    "conv_general_dilated": _g_conv,
    "softmax": lambda a, kw, out: jax.nn.softmax(_f32(a[0]), axis=-1),
    "log_softmax": lambda a, kw, out: jax.nn.log_softmax(_f32(a[0]),
                                                         axis=-1),
    "layer_norm": _g_layer_norm,
    "rms_norm": _g_rms_norm,
    "attention": _g_attention,
    "gelu": lambda a, kw, out: jax.nn.gelu(
        _f32(a[0]), approximate=bool(kw.get("approximate", False))),
    "silu": _g_silu,
    "rope": _g_rope,
    "cross_entropy": _g_cross_entropy,
}


# ------------------------------------------------------------- the plan


class _Plan(NamedTuple):
  """A slip as what runs: transforms of the array arguments, in order,
  then the kernel with knobs."""
  transforms: tuple = ()
  knobs: _Knobs = _Knobs()

  def then(self, transform=None, **knobs) -> "_Plan":
    t = self.transforms + ((transform,) if transform is not None else ())
    return _Plan(t, self.knobs._replace(**knobs))


def _axis(slip: Slip, call: _Call, a, ax: int) -> int:
  nd = np.ndim(a)
  if not -nd <= ax < nd:
    raise _not_applicable(slip, call.kind, f"axis {ax} is out of range for "
                          f"argument {slip.arg} of shape {np.shape(a)}",
                          f"use an axis in [0, {nd})")
  return ax % nd


def _operand(slip: Slip, call: _Call):
  """The array argument ``slip.arg`` and its axes, checked."""
  n = len(call.arrays)
  if not 0 <= slip.arg < n:
    raise _not_applicable(slip, call.kind, f"argument {slip.arg} does not "
                          f"exist (the call has {n} array arguments)",
                          f"use arg in [0, {n})")
  a = call.arrays[slip.arg]
  axes = tuple(_axis(slip, call, a, ax) for ax in slip.axes)
  for ax in axes:
    if np.shape(a)[ax] < 2:
      raise _not_applicable(slip, call.kind, f"axis {ax} of argument "
                            f"{slip.arg} {np.shape(a)} has length 1 (the op "
                            "changes nothing)", "use an axis of length > 1")
  return a, axes


def _on_arg(i: int, fn: Callable[[jax.Array], jax.Array]):
  """A transform of the array arguments that changes argument ``i``."""
  def transform(arrays):
    out = list(arrays)
    out[i] = fn(jnp.asarray(out[i]))
    return out
  return transform


def _tile(n: int, width: int, where: str) -> tuple[int, int]:
  """[start, stop) of the first or last tile of ``width`` along ``n``."""
  if where == "first":
    return 0, min(width, n)
  return width * ((n - 1) // width), n


def _op_reverse(slip, call, plan):
  _, axes = _operand(slip, call)
  if len(axes) not in (1, 2) or len(set(axes)) != len(axes):
    raise _not_applicable(slip, call.kind, f"reverse takes one or two "
                          f"distinct axes; got {slip.axes}", "pass axes=(a,) "
                          "or (a, b)")
  return plan.then(_on_arg(slip.arg, lambda a: jnp.flip(a, axes)))


def _op_transpose(slip, call, plan):
  a, axes = _operand(slip, call)
  if len(axes) != 2 or axes[0] == axes[1] or (
      np.shape(a)[axes[0]] != np.shape(a)[axes[1]]):
    raise _not_applicable(slip, call.kind, f"transpose needs two distinct "
                          f"axes of equal length; got axes {slip.axes} of "
                          f"shape {np.shape(a)}", "pick two axes of equal "
                          "length")
  return plan.then(_on_arg(slip.arg, lambda x: jnp.swapaxes(x, *axes)))


def _one_axis(slip, call) -> tuple[Any, int]:
  """The argument and the one axis of a roll, drop or repeat."""
  a, axes = _operand(slip, call)
  if len(axes) != 1:
    raise _not_applicable(slip, call.kind, f"{slip.op} takes one axis; got "
                          f"{slip.axes}", "pass axes=(a,)")
  return a, axes[0]


def _op_roll(slip, call, plan):
  _, ax = _one_axis(slip, call)
  return plan.then(_on_arg(slip.arg, lambda a: jnp.roll(a, slip.shift, ax)))


def _op_swap(slip, call, plan):
  a, _ = _operand(slip, call)
  n = len(call.arrays)
  if not 0 <= slip.other < n or slip.other == slip.arg:
    raise _not_applicable(slip, call.kind, f"the other argument "
                          f"{slip.other} is not another array argument",
                          f"use other in [0, {n}), not arg")
  b = call.arrays[slip.other]
  if np.shape(a) != np.shape(b) or np.dtype(a.dtype) != np.dtype(b.dtype):
    raise _not_applicable(slip, call.kind, f"arguments {slip.arg} "
                          f"{a.dtype}{list(np.shape(a))} and {slip.other} "
                          f"{b.dtype}{list(np.shape(b))} differ in shape or "
                          "dtype", "swap two arguments of one shape and dtype")
  i, j = slip.arg, slip.other

  def swap(arrays):
    out = list(arrays)
    out[i], out[j] = out[j], out[i]
    return out
  return plan.then(swap)


def _tile_axis(slip, call) -> tuple[int, int, int]:
  """(axis, start, stop) of a drop / repeat tile."""
  a, ax = _one_axis(slip, call)
  lo, hi = _tile(np.shape(a)[ax], slip.width, slip.where)
  return ax, lo, hi


def _op_drop(slip, call, plan):
  ax, lo, hi = _tile_axis(slip, call)

  def drop(a):
    idx = jnp.arange(a.shape[ax]).reshape(
        [-1 if d == ax else 1 for d in range(a.ndim)])
    return jnp.where((idx >= lo) & (idx < hi), jnp.zeros((), a.dtype), a)
  return plan.then(_on_arg(slip.arg, drop))


def _op_repeat(slip, call, plan):
  ax, lo, hi = _tile_axis(slip, call)
  n = np.shape(call.arrays[slip.arg])[ax]
  if n <= slip.width:
    raise _not_applicable(slip, call.kind, f"axis {ax} of length {n} holds "
                          f"one tile of {slip.width} (no neighbour to read)",
                          "use a width below the axis length")
  idx = np.arange(n)
  if slip.where == "first":
    src = np.arange(lo, hi) + slip.width
    ok = src < n
    idx[np.arange(lo, hi)[ok]] = src[ok]
  else:
    idx[lo:hi] = np.arange(lo, hi) - slip.width
  return plan.then(_on_arg(slip.arg, lambda a: jnp.take(
      a, jnp.asarray(idx), axis=ax)))


def _op_mask_shift(slip, call, plan):
  if call.kind != "attention":
    raise _not_applicable(slip, call.kind, "mask_shift moves attention's "
                          "mask", "use it on attention")
  mask = _mask_of(call.args, call.kwargs)
  t = np.shape(call.args[0])[1]
  rows = mask is not None and np.ndim(mask) >= 2 and np.shape(mask)[-2] == t
  if rows and not call.kwargs.get("is_causal"):
    m = np.asarray(mask)
    rows = bool(np.any(m[..., 1:, :] != m[..., :-1, :]))
  if not (call.kwargs.get("is_causal") or rows) or t < 2:
    raise _not_applicable(slip, call.kind, "the call has no causal mask and "
                          "no mask argument whose rows differ by query",
                          "use a causal call or one with a [.., T, S] mask "
                          "that varies by query")
  return plan.then(mask_shift=slip.shift)


#: ``operand`` ops: ``(slip, call, plan) -> plan`` (checked).
_OPERAND_OPS = {
    "reverse": _op_reverse,
    "transpose": _op_transpose,
    "roll": _op_roll,
    "swap": _op_swap,
    "drop": _op_drop,
    "repeat": _op_repeat,
    "mask_shift": _op_mask_shift,
}


def _apply_operand(slip, call, plan):
  return _OPERAND_OPS[slip.op](slip, call, plan)


# ------------------------------------------------------------ constants


def _golden_value(call: _Call, param: str) -> float:
  """A constant's golden value in this call."""
  kw = call.kwargs
  if param == "eps":
    return float(kw.get("eps", 1e-6))
  if param == "theta":
    return float(kw.get("theta", 10000.0))
  if param == "scale":
    s = kw.get("scale")
    return 1.0 / math.sqrt(np.shape(call.args[0])[-1]) if s is None else s
  if param == "fill":
    return float(np.finfo(np.float32).min)
  return {"temperature": 1.0, "beta": 1.0}.get(param, 0.0)


def golden_value(kind: str, args: Sequence[Any],
                 kwargs: Mapping[str, Any] | None, param: str) -> float:
  """The golden value of a kind's constant in a call (the call's own, or
  the default :data:`~peat_jax.core.PARAMETERS` names).

  Args:
    kind: the site kind.
    args: the call's positional arguments.
    kwargs: its keyword arguments.
    param: the constant's name.

  Returns:
    Its value (``fill``: float32's lowest).

  Raises:
    PeatError: the kind has no such constant.
  """
  call = _call(kind, args, kwargs)
  _check_param(Slip("constant", "set", param=param), call)
  return _golden_value(call, param)


def _check_param(slip: Slip, call: _Call) -> None:
  known = PARAMETERS.get(call.kind, {})
  if slip.param not in known:
    raise _not_applicable(slip, call.kind, f"it has no constant "
                          f"{slip.param!r}", "its constants: "
                          f"{', '.join(known) or 'none'}")


def _op_set(slip, call, plan):
  _check_param(slip, call)
  v = float(slip.value)
  if not math.isfinite(v) and not (slip.param == "fill" and v < 0):
    raise _not_applicable(slip, call.kind, f"value {slip.value!r} is not a "
                          "finite number (only a fill may be -inf)",
                          "set value")
  if slip.param == "ddof" and not 0 <= v < np.shape(call.args[0])[-1]:
    raise _not_applicable(slip, call.kind, f"ddof {v} leaves no positive "
                          "divisor", "use 0 <= ddof < n")
  if slip.param == "offset" and call.kind == "rope" and v != round(v):
    raise _not_applicable(slip, call.kind, f"a rope position offset is an "
                          f"integer; got {v}", "use an integer offset")
  if slip.param == "fill" and not (
      call.kwargs.get("is_causal")
      or _mask_of(call.args, call.kwargs) is not None):
    raise _not_applicable(slip, call.kind, "the call masks no key",
                          "use a causal or masked call")
  return plan.then(consts=plan.knobs.consts + ((slip.param, v),))


#: ``constant`` ops: ``(slip, call, plan) -> plan`` (checked).
_CONSTANT_OPS = {"set": _op_set}


def _apply_constant(slip, call, plan):
  return _CONSTANT_OPS[slip.op](slip, call, plan)


# ------------------------------------------------------------ precision


def _format(slip: Slip, call: _Call) -> _core.Format:
  if slip.fmt not in _rounding.FORMATS:
    raise _not_applicable(slip, call.kind, f"unknown format {slip.fmt!r}",
                          f"use one of {', '.join(_rounding.FORMATS)}")
  return _rounding.FORMATS[slip.fmt]


def _fits(fmt: _core.Format, dtype) -> bool:
  """Whether every value of ``dtype`` is one of ``fmt``'s."""
  own = _core.format_of(dtype)
  return (fmt.mantissa_bits >= own.mantissa_bits and fmt.max >= own.max
          and fmt.min_normal <= own.min_normal)


def _op_inputs(slip, call, plan):
  fmt = _format(slip, call)
  mode = slip.mode or "nearest_even"
  if mode not in SLIP_MODES:
    raise _not_applicable(slip, call.kind, f"unknown rounding mode "
                          f"{mode!r}", f"use one of {', '.join(SLIP_MODES)}")
  floats = [i for i, a in enumerate(call.arrays) if _floating(a)]
  if all(_fits(fmt, call.arrays[i].dtype) for i in floats):
    raise _not_applicable(slip, call.kind, f"every floating argument is "
                          f"already {slip.fmt} (rounding changes nothing)",
                          "use a narrower format")
  c = _compute_dtype(call)

  def round_inputs(arrays):
    out = list(arrays)
    for i in floats:
      out[i] = _rounding.round_to(jnp.asarray(out[i]).astype(c), fmt, mode)
    return out
  return plan.then(round_inputs)


def _op_accumulate(slip, call, plan):
  _format(slip, call)
  if _reduction_length(call) is None:
    raise _not_applicable(slip, call.kind, "it has no reduction",
                          f"use a kind of {', '.join(REDUCTION_AXES)}")
  _check_groups(slip, call)
  return plan.then(reducer=plan.knobs.reducer._replace(fmt=slip.fmt))


def _check_groups(slip, call) -> None:
  kw = call.kwargs
  if call.kind == "conv_general_dilated" and (
      kw.get("feature_group_count", 1) != 1
      or kw.get("batch_group_count", 1) != 1):
    raise _not_applicable(slip, call.kind, "a grouped convolution's input "
                          "features are no one reduction",
                          "use feature_group_count=1")


#: ``precision`` ops: ``(slip, call, plan) -> plan`` (checked).
_PRECISION_OPS = {"inputs": _op_inputs, "accumulate": _op_accumulate}


def _apply_precision(slip, call, plan):
  return _PRECISION_OPS[slip.op](slip, call, plan)


# -------------------------------------------------------------- blocked


def _blocks(slip, call) -> int:
  n = _reduction_length(call)
  if n is None:
    raise _not_applicable(slip, call.kind, "it has no reduction",
                          f"use a kind of {', '.join(REDUCTION_AXES)}")
  _check_groups(slip, call)
  if n <= slip.width:
    raise _not_applicable(slip, call.kind, f"its reduction of {n} is one "
                          f"block of {slip.width}", "use a width below "
                          f"{n}")
  return n


def _op_weighted(slip, call, plan):
  _blocks(slip, call)
  return plan.then(reducer=plan.knobs.reducer._replace(
      width=slip.width, op=slip.op, where=slip.where))


def _op_norescale(slip, call, plan):
  _blocks(slip, call)
  if call.kind not in ONLINE_SOFTMAX_KINDS:
    raise _not_applicable(slip, call.kind, "its reduction is no softmax's",
                          f"use one of {', '.join(ONLINE_SOFTMAX_KINDS)}")
  if slip.where != "sum" and call.kind != "attention":
    raise _not_applicable(slip, call.kind, f"only attention carries an "
                          f"output ({slip.where!r})", "use where='sum'")
  return plan.then(online=(slip.width, slip.where))


#: ``blocked`` ops: ``(slip, call, plan) -> plan`` (checked).
_BLOCKED_OPS = {"drop": _op_weighted, "twice": _op_weighted,
                "norescale": _op_norescale}


def _apply_blocked(slip, call, plan):
  return _BLOCKED_OPS[slip.op](slip, call, plan)


# -------------------------------------------------------- approximations


def _gelu_form(form: str, needs: str = ""):
  """A GELU member: ``form`` in place of the call's form ``needs`` (any
  form where empty)."""
  def apply(slip, call, plan):
    own = "tanh" if call.kwargs.get("approximate", False) else "erf"
    if needs and own != needs:
      raise _not_applicable(slip, call.kind, f"the call computes GELU's "
                            f"{own} form; {slip.op} replaces the {needs} "
                            "form", "use approximate=" + str(needs == "tanh")
                            + " calls, or gelu_sigmoid")
    return plan.then(gelu=form)
  return apply


#: ``approximation`` members: ``(slip, call, plan) -> plan`` (the kinds
#: each applies to: :data:`~peat_jax.core.APPROXIMATIONS`).
_APPROXIMATION_OPS = {
    "gelu_tanh": _gelu_form("tanh", needs="erf"),
    "gelu_erf": _gelu_form("erf", needs="tanh"),
    "gelu_sigmoid": _gelu_form("sigmoid"),
    "erf_poly": _gelu_form("erf_poly", needs="erf"),
    "silu_hard": lambda s, c, plan: plan.then(silu_hard=True),
    "exp_schraudolph": lambda s, c, plan: plan.then(exp=_exp_schraudolph,
                                                    fast_exp=True),
    "exp_poly3": lambda s, c, plan: plan.then(exp=_exp_poly3, fast_exp=True),
    "exp_table64": lambda s, c, plan: plan.then(exp=_exp_table64,
                                                fast_exp=True),
    "rsqrt_newton1": lambda s, c, plan: plan.then(rsqrt=_rsqrt_newton1),
    "rcp_newton1": lambda s, c, plan: plan.then(rcp=_rcp_newton1),
}


def _apply_approximation(slip, call, plan):
  kinds = APPROXIMATIONS[slip.op][0]
  if call.kind not in kinds:
    raise _not_applicable(slip, call.kind, f"{slip.op} replaces a function "
                          f"of {', '.join(kinds)} only", "members for "
                          f"{call.kind}: " + (", ".join(
                              m for m, (ks, _) in APPROXIMATIONS.items()
                              if call.kind in ks) or "none"))
  return _APPROXIMATION_OPS[slip.op](slip, call, plan)


#: Each category's application: ``(slip, call, plan) -> plan``.
_CATEGORIES = {
    "operand": _apply_operand,
    "constant": _apply_constant,
    "precision": _apply_precision,
    "blocked": _apply_blocked,
    "approximation": _apply_approximation,
}


def _plan(call: _Call, slip: Slip | None) -> _Plan:
  """The plan of a slip on its base (None: a correct port), checked."""
  if slip is None:
    n = _reduction_length(call)
    knobs = _Knobs(control=True)
    if n is not None and n > CONTROL_WIDTH and not (
        call.kind == "conv_general_dilated"
        and call.kwargs.get("feature_group_count", 1) != 1):
      if call.kind in _ONLINE_CONTROLS:
        knobs = knobs._replace(online=(CONTROL_WIDTH, ""))
      else:
        knobs = knobs._replace(reducer=_Reducer(width=CONTROL_WIDTH))
    return _Plan((), knobs)
  check_slip(slip)
  plan = _Plan()
  for s in ((slip.base,) if slip.base is not None else ()) + (slip,):
    plan = _CATEGORIES[s.category](s, call, plan)
  return plan


# ----------------------------------------------------------- the programs


_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_MAX_PROGRAMS = 128


def _key(call: _Call, what: str) -> tuple:
  treedef, static, _ = call.template
  return (what, call.kind, str(treedef), repr(static),
          tuple((np.shape(a), np.dtype(a.dtype).name) for a in call.arrays),
          bool(jax.config.jax_enable_x64))


def _program(key: tuple, build: Callable[[], Callable]) -> Callable:
  """A jitted program, kept for the next call of the same key."""
  fn = _PROGRAMS.get(key)
  if fn is None:
    fn = _PROGRAMS[key] = jax.jit(build())
    while len(_PROGRAMS) > _MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  else:
    _PROGRAMS.move_to_end(key)
  return fn


def _run_plan(call: _Call, plan: _Plan) -> Callable:
  out, c = _out_dtype(call), _compute_dtype(call)
  kernel = _KERNELS[call.kind]

  def run(*arrays):
    arrays = list(arrays)
    for t in plan.transforms:
      arrays = t(arrays)
    args, kwargs = call.rebuild(arrays)
    return kernel(args, kwargs, plan.knobs, c).astype(out)
  return run


def golden_call(kind: str, args: Sequence[Any],
                kwargs: Mapping[str, Any] | None = None) -> jax.Array:
  """The golden kernel of a call at working precision (jitted).

  XLA's own kernels: ``lax.dot_general`` / ``lax.conv_general_dilated``
  with the call's precision (16-bit operands: a float32 result, rounded
  once, as XLA:CPU computes a bf16 dot), ``jax.nn.softmax`` /
  ``log_softmax`` / ``gelu`` / ``silu``, the layer norm, RMS norm and
  rotary embedding of the reference models, all in float32 for 16-bit
  inputs and rounded once to the output's dtype (a Flax bf16 model's
  composites); attention is ``jax.nn.dot_product_attention``
  (``implementation="xla"``: float32 scores and softmax, probabilities
  rounded to the values' dtype). Scale and bias are used in their own
  dtype (a bf16 model's float32 parameters).

  Args:
    kind: the site kind (:data:`SLIP_KINDS`).
    args: the call's positional arguments.
    kwargs: its keyword arguments.

  Returns:
    The output, in the call's output dtype (dot/conv: its
    ``preferred_element_type``; otherwise the first argument's).

  Raises:
    PeatError: an unknown kind.
  """
  call = _call(kind, args, kwargs)
  out = _out_dtype(call)

  def build():
    def run(*arrays):
      a, kw = call.rebuild(arrays)
      return _GOLDEN[kind](a, kw, out).astype(out)
    return run
  return _program(_key(call, "golden"), build)(*call.arrays)


def slipped_call(kind: str, slip: Slip | None, args: Sequence[Any],
                 kwargs: Mapping[str, Any] | None = None) -> jax.Array:
  """A kernel under test: the call's kernel with ``slip`` (jitted).

  The slip (on its ``base``) is applied as the grammar describes
  (``peat_jax/core/_slips.py``, and this module's readings of it), the
  kernel computed in float32 for float32 and 16-bit calls (float64 for
  float64 ones: :func:`slipped_reference`) and rounded once to the
  output's dtype.

  >>> t = slipped_call("softmax", Slip("constant", "set",
  ...                  param="temperature", value=1.5), (x,), {})

  Args:
    kind: the site kind (:data:`SLIP_KINDS`).
    slip: the slip, or None for a correct port: the same math computed
      another way, which a validator must pass: reductions in blocks of
      :data:`CONTROL_WIDTH` summed in order (dot, conv, norms, softmax's
      sum), an online softmax that rescales (log-softmax, cross-entropy,
      attention), GELU through ``erfc`` or a sigmoid, SiLU as ``x / (1 +
      exp(-x))``, RoPE in HF's ``rotate_half`` form; float32 inside for
      16-bit calls, rounded once.
    args: the call's positional arguments.
    kwargs: its keyword arguments.

  Returns:
    The output, of the golden kernel's shape and dtype.

  Raises:
    PeatError: an unknown kind, an invalid slip (``check_slip``), or a
      slip that does not apply to the call (the message says why and
      what applies).
  """
  call = _call(kind, args, kwargs)
  plan = _plan(call, slip)
  what = "control" if slip is None else repr(slip)
  return _program(_key(call, what), lambda: _run_plan(call, plan))(
      *call.arrays)


def slipped_kernel(kind: str, slip: Slip | None) -> Callable[..., jax.Array]:
  """:func:`slipped_call` as a kernel under test with the kind's
  signature (``kut(*args, **kwargs)``), e.g. for ``peat.register_kut``.

  Args:
    kind: the site kind.
    slip: the slip, or None (a correct port).

  Returns:
    The KUT.
  """
  return lambda *args, **kwargs: slipped_call(kind, slip, args, kwargs)


def _f64(x):
  if x is None or not _is_array(x):
    return x
  a = np.asarray(jax.device_get(x))
  return a.astype(np.float64) if _floating(a) else a


def slipped_reference(kind: str, slip: Slip | None, args: Sequence[Any],
                      kwargs: Mapping[str, Any] | None = None) -> np.ndarray:
  """The slip's own output in float64: :func:`slipped_call` on float64
  copies of the floating arguments, x64 enabled in a scope (its roundings
  to narrower formats, ``inputs`` and ``accumulate``, are kept).

  Args:
    kind: the site kind.
    slip: the slip, or None: the kind's float64 golden math (the Analyzer's
      reference, summed another way).
    args: the call's positional arguments.
    kwargs: its keyword arguments.

  Returns:
    A float64 host array of the output's shape.

  Raises:
    PeatError: as :func:`slipped_call`.
  """
  call = _call(kind, args, kwargs)
  a64 = [_f64(a) for a in call.arrays]
  with jax.enable_x64(True):
    a, kw = call.rebuild(a64)
    if kind in ("dot_general", "conv_general_dilated"):
      kw = dict(kw, preferred_element_type=None)
    out = slipped_call(kind, slip, a, kw)
    return np.asarray(jax.device_get(out)).astype(np.float64)


# ------------------------------------------------------------ drawn calls


def _values(rng: np.random.Generator, shape, dtype, scale: float = 1.0,
            loc: float = 0.0) -> jax.Array:
  """Seeded normal values (never zero: |x| >= scale / 1000), in ``dtype``."""
  x = rng.standard_normal(shape) * scale
  x = np.where(np.abs(x) < scale * 1e-3, np.copysign(scale * 1e-3, x), x)
  return jnp.asarray((x + loc).astype(np.float32)).astype(dtype)


def _pick(rng: np.random.Generator, options: Sequence[Any]):
  return options[int(rng.integers(len(options)))]


def _draw_dot(srng, rng, dtype):
  m, k, n, b = _pick(srng, [(12, 40, 10, 0), (7, 100, 24, 0),
                            (24, 24, 11, 2), (16, 64, 9, 0), (5, 37, 19, 3)])
  scale = float(10 ** srng.uniform(-0.5, 0.5))
  lead = (b,) if b else ()
  lhs = _values(rng, lead + (m, k), dtype, scale)
  rhs = _values(rng, lead + (k, n), dtype, 1.0)
  dn = (((len(lead) + 1,), (len(lead),)),
        (((0,), (0,)) if b else ((), ())))
  return (lhs, rhs), {"dimension_numbers": dn, "precision": None,
                      "preferred_element_type": np.dtype(dtype)}


def _draw_conv(srng, rng, dtype):
  n, h, w, c, kh, o, stride, pad = _pick(srng, [
      (2, 7, 7, 20, 3, 8, 1, 1), (2, 9, 6, 40, 3, 6, 2, 1),
      (1, 8, 8, 33, 1, 16, 1, 0), (2, 6, 6, 24, 3, 8, 1, 0)])
  lhs = _values(rng, (n, h, w, c), dtype)
  rhs = _values(rng, (kh, kh, c, o), dtype, 1.0 / math.sqrt(kh * kh))
  dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape,
                                  ("NHWC", "HWIO", "NHWC"))
  return (lhs, rhs), {"window_strides": (stride, stride),
                      "padding": ((pad, pad), (pad, pad)),
                      "lhs_dilation": (1, 1), "rhs_dilation": (1, 1),
                      "dimension_numbers": dn, "feature_group_count": 1,
                      "batch_group_count": 1, "precision": None,
                      "preferred_element_type": None}


def _draw_softmax(srng, rng, dtype):
  shape = _pick(srng, [(4, 37), (3, 5, 100), (6, 64), (2, 3, 150)])
  return (_values(rng, shape, dtype, float(srng.uniform(1.0, 4.0))),), {}


def _draw_norm(srng, rng, dtype, with_bias: bool, eps: Sequence[float]):
  shape = _pick(srng, [(4, 6, 48), (8, 100), (3, 5, 70), (6, 256)])
  x = _values(rng, shape, dtype, float(srng.uniform(0.5, 3.0)),
              float(srng.uniform(-1.0, 1.0)))
  params = (_values(rng, shape[-1:], jnp.float32, 0.2, 1.0),)
  if with_bias:
    params += (_values(rng, shape[-1:], jnp.float32, 0.1),)
  return (x,) + params, {"eps": float(_pick(srng, eps))}


def _draw_attention(srng, rng, dtype):
  b, t, s, h, hk, d, mode = _pick(srng, [
      (1, 12, 12, 4, 2, 16, "causal"), (2, 9, 21, 2, 2, 8, "mask"),
      (1, 20, 20, 4, 4, 32, "causal"), (2, 7, 7, 2, 1, 16, "none"),
      (1, 16, 16, 2, 2, 16, "causal")])
  spread = float(srng.uniform(0.7, 1.5))
  q = _values(rng, (b, t, h, d), dtype, spread)
  k = _values(rng, (b, s, hk, d), dtype, spread)
  v = _values(rng, (b, s, hk, d), dtype)
  kw = {"is_causal": True} if mode == "causal" else {}
  if srng.uniform() < 0.3:
    kw["scale"] = 1.0 / math.sqrt(d)
  if mode != "mask":
    return (q, k, v), kw
  lengths = rng.integers(s // 2, s + 1, size=b)
  mask = np.arange(s)[None, None, None, :] < lengths[:, None, None, None]
  mask = np.broadcast_to(mask, (b, 1, t, s))
  return (q, k, v, jnp.asarray(mask)), kw


def _draw_gelu(srng, rng, dtype):
  shape = _pick(srng, [(8, 64), (5, 37), (4, 3, 50)])
  kw = {"approximate": True} if srng.uniform() < 0.3 else {}
  return (_values(rng, shape, dtype, 2.0),), kw


def _draw_silu(srng, rng, dtype):
  shape = _pick(srng, [(8, 64), (5, 37), (4, 3, 50)])
  x = _values(rng, shape, dtype, 2.0)
  if srng.uniform() < 0.5:
    return (x, _values(rng, shape, dtype)), {}
  return (x,), {}


def _draw_rope(srng, rng, dtype):
  b, t, h, d = _pick(srng, [(1, 12, 4, 16), (2, 9, 2, 32), (1, 20, 2, 64)])
  start = int(srng.integers(0, 100))
  x = _values(rng, (b, t, h, d), dtype)
  positions = jnp.arange(start, start + t, dtype=jnp.int32)
  return (x, positions), {"theta": float(_pick(srng, [1e4, 5e5]))}


def _draw_cross_entropy(srng, rng, dtype):
  b, c = _pick(srng, [(8, 37), (6, 100), (16, 50), (4, 257)])
  logits = _values(rng, (b, c), dtype, float(srng.uniform(1.0, 4.0)))
  labels = jnp.asarray(rng.integers(0, c, size=b).astype(np.int32))
  return (logits, labels), {"reduction": "none"}


#: Each kind's call: ``(shape rng, value rng, dtype) -> (args, kwargs)``.
_DRAW_CALL = {
    "dot_general": _draw_dot,
    "conv_general_dilated": _draw_conv,
    "softmax": _draw_softmax,
    "log_softmax": _draw_softmax,
    "layer_norm": lambda s, r, d: _draw_norm(s, r, d, True,
                                             (1e-5, 1e-6, 1e-12)),
    "rms_norm": lambda s, r, d: _draw_norm(s, r, d, False, (1e-5, 1e-6)),
    "attention": _draw_attention,
    "gelu": _draw_gelu,
    "silu": _draw_silu,
    "rope": _draw_rope,
    "cross_entropy": _draw_cross_entropy,
}


def draw_call(rng: np.random.Generator, kind: str, dtype=jnp.float32, *,
              shape_seed: int | None = None) -> tuple[tuple, dict]:
  """A realistic call of a site kind: the arguments and keyword arguments
  its kernel receives (the conventions of :data:`SLIP_KINDS`).

  Shapes come from a few per kind (reduction lengths that are multiples
  of 8, 16, 32 and lengths that are not; square operands, grouped-query
  attention, causal and padding masks), values are seeded normals at a
  drawn scale and offset, never zero. Float arrays have ``dtype``, except
  a norm's scale and bias (float32 parameters, as in a bf16 model);
  labels and positions are int32, masks bool. Cross-entropy is drawn
  per example (``reduction="none"``: a mean is one number, no pattern
  to explain).

  Args:
    rng: the values' generator (and the shape's, without ``shape_seed``).
    kind: the site kind (:data:`SLIP_KINDS`).
    dtype: the floating dtype, float32 or bfloat16.
    shape_seed: draw the shape and static keyword arguments from this seed
      instead: calls of one seed share a shape (and compiled programs)
      with fresh values.

  Returns:
    ``(args, kwargs)``.

  Raises:
    PeatError: an unknown kind or dtype.
  """
  if kind not in _DRAW_CALL:
    raise PeatError(f"unknown site kind {kind!r}; expected one of "
                    f"{', '.join(SLIP_KINDS)}")
  if np.dtype(dtype).name not in ("float32", "bfloat16", "float16"):
    raise PeatError(f"draw_call: dtype {np.dtype(dtype).name}; expected "
                    "float32, bfloat16 or float16")
  srng = rng if shape_seed is None else np.random.default_rng(shape_seed)
  return _DRAW_CALL[kind](srng, rng, np.dtype(dtype))


# ------------------------------------------------------------ drawn slips


def _draw_axes_arg(rng, call: _Call, floating_weight: float = 3.0):
  """An array argument with an axis of length > 1 (one exists): (index,
  its shape)."""
  cands = [(i, np.shape(a)) for i, a in enumerate(call.arrays)
           if any(n > 1 for n in np.shape(a))]
  w = np.array([floating_weight if _floating(call.arrays[i]) else 1.0
                for i, _ in cands])
  return cands[int(rng.choice(len(cands), p=w / w.sum()))]


def _long_axes(shape) -> list[int]:
  return [ax for ax, n in enumerate(shape) if n > 1]


def _draw_reverse(rng, call):
  i, shape = _draw_axes_arg(rng, call)
  axes = _long_axes(shape)
  k = 2 if len(axes) > 1 and rng.uniform() < 0.25 else 1
  return Slip("operand", "reverse", arg=i, axes=tuple(
      sorted(int(a) for a in rng.choice(axes, k, replace=False))))


def _draw_transpose(rng, call):
  pairs = [(i, a, b) for i, x in enumerate(call.arrays)
           for a in range(np.ndim(x)) for b in range(a + 1, np.ndim(x))
           if np.shape(x)[a] == np.shape(x)[b] > 1]
  if not pairs:
    return None
  i, a, b = _pick(rng, pairs)
  return Slip("operand", "transpose", arg=i, axes=(a, b))


def _draw_roll(rng, call):
  i, shape = _draw_axes_arg(rng, call)
  return Slip("operand", "roll", arg=i, axes=(int(_pick(rng, _long_axes(
      shape))),), shift=int(_pick(rng, (1, -1))))


def _draw_swap(rng, call):
  arrays = call.arrays
  pairs = [(i, j) for i in range(len(arrays)) for j in range(len(arrays))
           if i != j and np.shape(arrays[i]) == np.shape(arrays[j])
           and arrays[i].dtype == arrays[j].dtype]
  if not pairs:
    return None
  i, j = _pick(rng, pairs)
  return Slip("operand", "swap", arg=i, other=j)


def _draw_tile(op: str):
  def draw(rng, call):
    i, shape = _draw_axes_arg(rng, call)
    ax = int(_pick(rng, _long_axes(shape)))
    n = shape[ax]
    widths = [1] + [w for w in TILE_LATTICE if w < n]
    return Slip("operand", op, arg=i, axes=(ax,),
                where=_pick(rng, ("first", "last")),
                width=int(_pick(rng, widths)))
  return draw


def _draw_mask_shift(rng, call):
  return Slip("operand", "mask_shift", shift=int(_pick(rng, (1, -1))))


#: ``operand`` ops' draws (None: none fits the call), and their weights.
_DRAW_OPERAND = {
    "reverse": (_draw_reverse, 2.0),
    "transpose": (_draw_transpose, 1.0),
    "roll": (_draw_roll, 2.0),
    "swap": (_draw_swap, 1.0),
    "drop": (_draw_tile("drop"), 2.0),
    "repeat": (_draw_tile("repeat"), 1.5),
    "mask_shift": (_draw_mask_shift, 1.0),
}


def _weighted(rng, table: Mapping[str, tuple]):
  names = list(table)
  w = np.array([table[n][1] for n in names])
  return table[names[int(rng.choice(len(names), p=w / w.sum()))]][0]


def _draw_operand(rng, call):
  if not any(n > 1 for a in call.arrays for n in np.shape(a)):
    return None  # nothing to move
  ops = {k: v for k, v in _DRAW_OPERAND.items()
         if k != "mask_shift" or call.kind == "attention"}
  return _weighted(rng, ops)(rng, call)


def _log_uniform_away(rng, lo: float, hi: float, golden: float,
                      factor: float = 2.0) -> float:
  """10**U(lo, hi), at least ``factor`` away from ``golden``."""
  while True:
    v = float(10 ** rng.uniform(lo, hi))
    if not golden or abs(math.log(v / golden)) > math.log(factor):
      return v


def _uniform_away(rng, lo: float, hi: float, golden: float,
                  gap: float = 0.05) -> float:
  while True:
    v = float(rng.uniform(lo, hi))
    if abs(v - golden) > gap * abs(golden or 1.0):
      return v


def _draw_theta(rng, golden):
  return _pick(rng, [v for v in (1e4, 5e5, 1e6) if v != golden] + [
      _log_uniform_away(rng, math.log10(golden) - 1, math.log10(golden) + 1,
                        golden, 1.5)])


def _draw_scale(rng, golden):
  return _pick(rng, [1.0, golden * golden, golden * _uniform_away(
      rng, 0.5, 2.0, 1.0, 0.1)])


#: Each constant's value draw: ``(rng, golden value) -> value``.
_DRAW_VALUE = {
    "eps": lambda rng, g: _log_uniform_away(rng, -12.0, -1.0, g),
    "ddof": lambda rng, g: 1.0,
    "offset": lambda rng, g: 1.0,
    "temperature": lambda rng, g: _uniform_away(rng, 0.5, 2.0, 1.0),
    "scale": _draw_scale,
    "fill": lambda rng, g: _pick(rng, [0.0, -1e4, -1e9, -math.inf,
                                       -float(rng.uniform(2.0, 20.0))]),
    "smoothing": lambda rng, g: float(rng.uniform(0.05, 0.2)),
    "beta": lambda rng, g: _pick(rng, [1.702, _uniform_away(rng, 0.5, 2.0,
                                                            1.0)]),
    "theta": _draw_theta,
}


def _draw_constant(rng, call):
  param = _pick(rng, list(PARAMETERS[call.kind]))
  g = _golden_value(call, param)
  if call.kind == "rope" and param == "offset":
    return Slip("constant", "set", param=param,
                value=float(_pick(rng, (-2, -1, 1, 2))))
  return Slip("constant", "set", param=param,
              value=float(_DRAW_VALUE[param](rng, g)))


def _narrower(fmt: str, dtype) -> bool:
  """Whether ``fmt`` has fewer fraction bits than ``dtype`` (rounds most
  of its values)."""
  return (_rounding.FORMATS[fmt].mantissa_bits
          < _core.format_of(dtype).mantissa_bits)


def _draw_inputs(rng, call):
  floats = [a for a in call.arrays if _floating(a)]
  fmts = [f for f in ("tf32", "bf16", "fp16")
          if any(_narrower(f, a.dtype) for a in floats)]
  fmt = _pick(rng, fmts or ["fp8_e4m3", "fp8_e5m2"])
  mode = SLIP_MODES[int(rng.choice(3, p=[0.5, 0.25, 0.25]))]
  return Slip("precision", "inputs", fmt=fmt, mode=mode)


def _draw_accumulate(rng, call):
  fmt = ("bf16", "fp16", "tf32")[int(rng.choice(3, p=[0.45, 0.45, 0.1]))]
  return Slip("precision", "accumulate", fmt=fmt)


def _draw_precision(rng, call):
  if _reduction_length(call) is not None and rng.uniform() < 0.35:
    return _draw_accumulate(rng, call)
  return _draw_inputs(rng, call)


def _draw_blocked(rng, call):
  n = _reduction_length(call)
  widths = [w for w in TILE_LATTICE if w < (n or 0)]
  if not widths:
    return None
  ops = ["drop", "twice"] + (["norescale"] if call.kind
                             in ONLINE_SOFTMAX_KINDS else [])
  op = _pick(rng, ops)
  if op == "norescale":
    where = _pick(rng, ("sum", "acc", "both")) if (
        call.kind == "attention") else "sum"
  else:
    where = _pick(rng, ("first", "last"))
  return Slip("blocked", op, where=where, width=int(_pick(rng, widths)))


def _draw_approximation(rng, call):
  members = [m for m, (kinds, _) in APPROXIMATIONS.items()
             if call.kind in kinds]
  return Slip("approximation", _pick(rng, members)) if members else None


#: Each category's draw: ``(rng, call) -> Slip or None``.
_DRAW_SLIP = {
    "operand": _draw_operand,
    "constant": _draw_constant,
    "precision": _draw_precision,
    "blocked": _draw_blocked,
    "approximation": _draw_approximation,
}

#: Share of drawn slips that stand on a precision base.
BASE_SHARE = 0.1


def _category_applies(cat: str, call: _Call) -> bool:
  kind = call.kind
  if cat == "constant":
    return kind in PARAMETERS
  if cat == "blocked":
    n = _reduction_length(call)
    return n is not None and n > min(TILE_LATTICE)
  if cat == "approximation":
    return any(kind in ks for ks, _ in APPROXIMATIONS.values())
  return True


def _applies(call: _Call, slip: Slip | None) -> bool:
  if slip is None:
    return False
  try:
    _plan(call, slip)
  except PeatError:
    return False
  return True


def draw_slip(rng: np.random.Generator, kind: str, args: Sequence[Any],
              kwargs: Mapping[str, Any] | None = None, *,
              categories: Sequence[str] | None = None) -> Slip:
  """A random slip of the grammar that applies to a call.

  A category is drawn uniformly among those with a slip for the kind,
  then its op and fields: operands and axes of length > 1 (floating
  arguments three times as often), tile widths of 1 or of
  :data:`~peat_jax.core.TILE_LATTICE` below the length; constants away
  from their golden value (eps log-uniform over 1e-12 .. 1e-1,
  temperatures and betas in [0.5, 2], a missing, doubled or rescaled
  attention scale, a mask fill of 0, -1e4, -1e9, -inf or a few units,
  label smoothing in [0.05, 0.2], another rotary base or position
  offset, the unbiased variance, Gemma's ``1 + scale``); input formats
  that change an argument (tf32, bf16, fp16; fp8 where the arguments
  are 16-bit) in any rounding mode, accumulation in bf16, fp16 or tf32;
  block widths of the lattice below the reduction's length; a library
  member for the kind. :data:`BASE_SHARE` of the slips outside the
  ``precision`` category stand on a precision base.

  Args:
    rng: the generator.
    kind: the site kind.
    args: the call's positional arguments.
    kwargs: its keyword arguments.
    categories: draw from these categories only (None: all).

  Returns:
    The slip (``slipped_call`` applies it to the call).

  Raises:
    PeatError: an unknown category, or none of them has a slip for the
      call.
  """
  call = _call(kind, args, kwargs)
  cats = list(categories or _DRAW_SLIP)
  bad = [c for c in cats if c not in _DRAW_SLIP]
  if bad:
    raise PeatError(f"unknown slip categories {bad}; expected some of "
                    f"{', '.join(_DRAW_SLIP)}")
  cats = [c for c in cats if _category_applies(c, call)]
  for _ in range(64 if cats else 0):
    cat = _pick(rng, cats)
    slip = _DRAW_SLIP[cat](rng, call)
    if not _applies(call, slip):
      continue
    if cat != "precision" and rng.uniform() < BASE_SHARE:
      based = slip._replace(base=_draw_precision(rng, call))
      slip = based if _applies(call, based) else slip
    return slip
  raise PeatError(f"no slip of {', '.join(categories or _DRAW_SLIP)} "
                  f"applies to this {kind} call")


# ------------------------------------------------------------ visibility

#: The Detector's margins, mirrored here (the injectors stand below the
#: Analyzer; tests/analyzer/test_slip_grammar.py checks they agree with
#: ``peat_jax.analyzer.probes``): a record is probed when the KUT's RMS
#: error against float64 is beyond BEYOND_GOLDEN times golden's, and a
#: hypothesis explains it when the median of ``|t - h| / |t - r|`` is at
#: most EXPLAINS; structural (``indexing``) hypotheses are read where
#: they move the output, when at least PROBE_MIN elements move.
BEYOND_GOLDEN = 4.0
EXPLAINS = 0.25
PROBE_MIN = 16
#: A slip is visible when its own RMS effect (its float64 output rounded
#: to the output dtype, against the float64 reference) is at least this
#: many times the golden kernel's RMS error: BEYOND_GOLDEN to be flagged,
#: times 1 / EXPLAINS because a KUT that makes the slip is itself about
#: one golden noise away from the slip's float64 output, which the
#: explaining ratio must keep under EXPLAINS of the effect (16: also the
#: probe's dense-error ratio).
VISIBLE_RMS = BEYOND_GOLDEN / EXPLAINS
#: ... and when the median effect over the elements the probe reads is
#: at least 1 / EXPLAINS times the golden RMS error: at the median element
#: the KUT's own rounding must stay under EXPLAINS of it. The probe reads
#: where the KUT's output differs from the reference (a float32 output:
#: every element; a 16-bit one: where the slip moves it off the rounded
#: reference); an ``indexing`` hypothesis where it moves the output
#: beyond golden's own error, when PROBE_MIN elements or more move. A slip
#: on a base must pass both margins against its base's output as well:
#: the Detector names the fault on top only where the base alone leaves
#: it to explain.
VISIBLE_MEDIAN = 1.0 / EXPLAINS


class Visibility(NamedTuple):
  """A slip's own effect on one call's output against golden's noise.

  Attributes:
    visible: beyond both margins, every output finite where the
      reference is.
    rms_ratio: RMS of ``h - r`` over RMS of ``g - r`` (``h``: the slip's
      float64 output rounded to the output dtype; ``r``: the float64
      reference; ``g``: the golden output).
    median_ratio: the lower median of ``|h - r|`` over the elements the
      probe reads (:data:`VISIBLE_MEDIAN`), over RMS of ``g - r`` (``r``
      rounded to a 16-bit output's dtype there, as the probe rounds it).
    read: how many elements the median read.
    nonfinite: elements where ``h`` is not finite and ``r`` is.
    over_base: a slip on a base: ``(rms_ratio, median_ratio, read)`` of
      its output against its base's alone (the top slip's own effect,
      which must be beyond the margins too: a base that explains the
      output alone leaves the slip on it invisible); else None.
  """
  visible: bool
  rms_ratio: float
  median_ratio: float
  read: int
  nonfinite: int
  over_base: tuple | None = None


def _at_output(x: np.ndarray, dtype) -> np.ndarray:
  """float64 ``x`` rounded to a 16-bit output dtype (through float32, as
  the port probe rounds), else as it is."""
  if np.dtype(dtype).itemsize > 2:
    return x
  with np.errstate(all="ignore"):
    return x.astype(np.float32).astype(dtype).astype(np.float64)


def _rms(x: np.ndarray) -> float:
  return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


def slip_visibility(kind: str, slip: Slip | None, args: Sequence[Any],
                    kwargs: Mapping[str, Any] | None = None, *,
                    golden=None) -> Visibility:
  """Whether a slip's own effect is beyond the golden kernel's rounding
  by the Detector's margins (:data:`VISIBLE_RMS`,
  :data:`VISIBLE_MEDIAN`): where it is not, no search can be asked to
  name it.

  Args:
    kind: the site kind.
    slip: the slip (None: the correct port).
    args: the call's positional arguments.
    kwargs: its keyword arguments.
    golden: the golden output (None: :func:`golden_call`).

  Returns:
    The :class:`Visibility`.

  Raises:
    PeatError: as :func:`slipped_call`.
  """
  g = golden_call(kind, args, kwargs) if golden is None else golden
  dtype = np.dtype(g.dtype)
  g = np.asarray(jax.device_get(g)).astype(np.float64)
  h = _at_output(slipped_reference(kind, slip, args, kwargs), dtype)
  r = slipped_reference(kind, None, args, kwargs)
  r_at = _at_output(r, dtype)
  fin = np.isfinite(r) & np.isfinite(g)
  nonfinite = int(np.sum(fin & ~np.isfinite(h)))
  fin &= np.isfinite(h)
  noise = max(_rms((g - r)[fin]), 1e-300)
  effect = functools.partial(
      _effect, h, g_err=np.abs(g - r_at), fin=fin, noise=noise,
      indexing=slip is not None and slip.model == "indexing",
      narrow=dtype.itemsize <= 2)
  rms_ratio, median_ratio, read = effect(r, r_at)
  visible = (nonfinite == 0 and rms_ratio >= VISIBLE_RMS
             and median_ratio >= VISIBLE_MEDIAN)
  over = None
  if slip is not None and slip.base is not None:
    hb = _at_output(slipped_reference(kind, slip.base, args, kwargs), dtype)
    over = effect(hb, hb)
    visible = visible and over[0] >= VISIBLE_RMS and over[1] >= VISIBLE_MEDIAN
  return Visibility(bool(visible), rms_ratio, median_ratio, read, nonfinite,
                    over)


def _effect(h: np.ndarray, ref: np.ndarray, ref_at: np.ndarray, *,
            g_err: np.ndarray, fin: np.ndarray, noise: float,
            indexing: bool, narrow: bool) -> tuple[float, float, int]:
  """(RMS of ``h - ref``, the median of ``|h - ref_at|`` over the
  elements the probe reads, each over golden's RMS error ``noise``; how
  many it reads). The probe reads where the KUT's output differs from
  the reference: a float32 output everywhere (its own rounding), a
  16-bit one where the slip moves it off the rounded reference; an
  ``indexing`` hypothesis where it moves it beyond golden's own error
  ``g_err``, when PROBE_MIN elements or more move."""
  diff = np.abs(h - ref_at)
  read = fin & (diff > 0) if narrow else fin
  if indexing:
    moved = fin & (diff > g_err)
    read = moved if moved.sum() >= PROBE_MIN else read
  # The lower median: the probe's ratio is at most EXPLAINS only where
  # more than half of the elements it reads carry the effect.
  median = float(np.quantile(diff[read], 0.5, method="lower")) / noise if (
      read.any()) else 0.0
  return _rms((h - ref)[fin]) / noise, median, int(read.sum())


# ------------------------------------------------------------- drawn cases


class SlipCase(NamedTuple):
  """One drawn case of the slip grammar's property test.

  Attributes:
    kind: the site kind.
    dtype: the call's floating dtype.
    args: the call's positional arguments.
    kwargs: its keyword arguments.
    slip: the slip the KUT makes, or None (a correct port: a control).
    call: the index of the call template the case was drawn from (cases
      of one template share shapes and compiled programs).
  """
  kind: str
  dtype: np.dtype
  args: tuple
  kwargs: dict
  slip: Slip | None
  call: int


def draw_slip_cases(seed: int, n: int, *, calls: int | None = None,
                    kinds: Sequence[str] | None = None,
                    dtypes: Sequence[Any] = ("float32", "bfloat16"),
                    categories: Sequence[str] | None = None,
                    controls: float = 0.2) -> list[SlipCase]:
  """Seeded cases of the slip grammar: calls and the slips their KUTs make.

  First ``calls`` call templates (kind, dtype, shape): the kinds x
  dtypes in a seeded order, repeated as needed, each with a drawn shape
  (:func:`draw_call`'s ``shape_seed``); then ``n`` cases, each of a
  template drawn uniformly, with fresh values (its own generator,
  ``(seed, index)``) and a slip (:func:`draw_slip`), or no slip (a
  control) with probability ``controls``. The test and the benchmark of
  the grammar draw their cases here, so they never diverge.

  Args:
    seed: the draw's seed.
    n: how many cases.
    calls: how many call templates (None: one per kind x dtype).
    kinds: the site kinds (None: :data:`SLIP_KINDS`).
    dtypes: the floating dtypes.
    categories: the slip categories (None: all).
    controls: the share of controls.

  Returns:
    The cases, in order.

  Raises:
    PeatError: an unknown kind, dtype or category.
  """
  kinds = list(kinds or SLIP_KINDS)
  combos = [(k, np.dtype(d)) for k in kinds for d in dtypes]
  rng = np.random.default_rng(seed)
  order = [combos[i] for i in rng.permutation(len(combos))]
  calls = len(combos) if calls is None else calls
  templates = [order[i % len(order)] + (int(rng.integers(2**31)),)
               for i in range(calls)]
  cases = []
  for i in range(n):
    crng = np.random.default_rng((seed, i))
    j = int(crng.integers(len(templates)))
    kind, dtype, shape_seed = templates[j]
    args, kwargs = draw_call(crng, kind, dtype, shape_seed=shape_seed)
    slip = None if crng.uniform() < controls else draw_slip(
        crng, kind, args, kwargs, categories=categories)
    cases.append(SlipCase(kind, dtype, args, kwargs, slip, j))
  return cases


def _own_slip(own: str, value: float) -> Slip | None:
  """A slip without base from its own name (None: no such name)."""
  if own.startswith("inputs_") or own.startswith("acc_"):
    rest = own.split("_", 1)[1]
    fmts = [f for f in _rounding.FORMATS
            if rest == f or rest.startswith(f + "_")]
    if not fmts:
      return None
    fmt = max(fmts, key=len)
    if own.startswith("acc_"):
      return Slip("precision", "accumulate", fmt=fmt)
    return Slip("precision", "inputs", fmt=fmt,
                mode=rest[len(fmt) + 1:] or "nearest_even")
  parts = own.split(":")
  try:
    if parts[0] == "blocked":
      return Slip("blocked", parts[1], where=parts[2],
                  width=int(parts[3].lstrip("w")))
    if parts[0] == "operand":
      return _operand_slip(parts[1], parts[2:])
  except (IndexError, ValueError):
    return None
  own = parts[-1]  # "constant:eps" or "eps"; "approximation:x" or "x"
  if own in APPROXIMATIONS:
    return Slip("approximation", own)
  if any(own in ps for ps in PARAMETERS.values()):
    return Slip("constant", "set", param=own, value=value)
  return None


def _operand_slip(op: str, fields: list[str]) -> Slip:
  """An operand slip from the fields of its name."""
  if op == "mask_shift":
    return Slip("operand", op, shift=int(fields[0]))
  if op == "swap":
    arg, other = (int(v) for v in fields[0].split(","))
    return Slip("operand", op, arg=arg, other=other)
  arg, axes = int(fields[0]), tuple(int(v) for v in fields[1].split(","))
  if op == "roll":
    return Slip("operand", op, arg=arg, axes=axes, shift=int(fields[2]))
  if op in ("drop", "repeat"):
    return Slip("operand", op, arg=arg, axes=axes, where=fields[2],
                width=int(fields[3].lstrip("w")))
  return Slip("operand", op, arg=arg, axes=axes)


def slip_from_name(name: str, value: float = math.nan) -> Slip | None:
  """The slip a grammar name stands for (``Slip.name``'s inverse).

  Args:
    name: the name, e.g. ``inputs_bf16+blocked:drop:last:w16``.
    value: a constant's value (names carry none: a campaign refits it).

  Returns:
    The slip, or None where ``name`` is no name of the grammar (the
    rebuilt slip's own name must be ``name``).
  """
  base, own = None, name
  head, plus, tail = name.partition("+")
  if plus and ":" not in head:  # a precision base: its name has no ':'
    base, own = _own_slip(head, value), tail
    if base is None:
      return None
  slip = _own_slip(own, value)
  if slip is None:
    return None
  slip = slip._replace(base=base)
  try:
    check_slip(slip)
  except PeatError:
    return None
  return slip if slip.name == name else None


def _zeroes_outputs(kind: str, slip: Slip, args, kwargs) -> bool:
  """Whether a slip's float64 output differs from the reference only by
  elements that are exactly zero."""
  h = slipped_reference(kind, slip, args, kwargs)
  r = slipped_reference(kind, None, args, kwargs)
  moved = h != r
  return bool(moved.any()) and bool(np.all(h[moved] == 0.0))


def names_slip(kind: str, slip: Slip, args: Sequence[Any],
               kwargs: Mapping[str, Any] | None, model: str, *,
               named: str | None = None,
               estimate: float | None = None) -> str:
  """How an error model (and the slip a search names) names a slip made
  on this call.

  ``"model"``: ``model`` is the slip's own (``slip.model``).
  ``"equivalent"``: ``zero`` for a slip whose own output is the
  reference's with some elements exactly zero (an input read as zero
  through an elementwise kernel: elements left zero, the same output);
  or another slip of ``model`` gives the slip's own output
  on these inputs: their float64 outputs, rounded to the output dtype,
  differ by less than :data:`VISIBLE_RMS` times the golden kernel's RMS
  error (the difference between the two is no visible slip, so no search
  can be asked to tell them apart). The other slips tried: the slip
  ``named`` (a grammar name, a constant at ``estimate``) where its model
  is ``model``, and, for a ``precision`` slip, the same op in the named
  model's format (any rounding mode: inside fp16's range tf32 and fp16
  round alike). ``""``: neither.

  Args:
    kind: the site kind.
    slip: the slip made.
    args: the call's positional arguments.
    kwargs: its keyword arguments.
    model: the error model named (e.g. a diagnosis's ``model``).
    named: the name of the slip named, if any (a diagnosis's
      ``params["slip"]``).
    estimate: its fitted constant, if any (``params["estimate"]``).

  Returns:
    ``"model"``, ``"equivalent"`` or ``""``.
  """
  if model == slip.model:
    return "model"
  if model == "zero" and _zeroes_outputs(kind, slip, args, kwargs):
    return "equivalent"
  alts = []
  other = slip_from_name(named, math.nan if estimate is None
                         else float(estimate)) if named else None
  if other is not None and other.model == model:
    alts.append(other)
  fam, _, fmt = model.partition(":")
  if (slip.category == "precision" and fmt and fmt != slip.fmt
      and fam == slip.model.partition(":")[0] and fmt in _rounding.FORMATS):
    alts += [slip._replace(fmt=fmt, mode=mode) for mode in (
        SLIP_MODES if slip.op == "inputs" else ("",))]
  if not alts:
    return ""
  g = golden_call(kind, args, kwargs)
  dtype = np.dtype(g.dtype)
  g = np.asarray(jax.device_get(g)).astype(np.float64)
  r = slipped_reference(kind, None, args, kwargs)
  h = _at_output(slipped_reference(kind, slip, args, kwargs), dtype)
  fin = np.isfinite(g) & np.isfinite(r) & np.isfinite(h)
  noise = max(_rms((g - r)[fin]), 1e-300)
  for alt in alts:
    try:
      h_alt = _at_output(slipped_reference(kind, alt, args, kwargs), dtype)
    except PeatError:
      continue
    same = np.isfinite(h_alt) == np.isfinite(h)
    if same.all() and _rms((h - h_alt)[fin]) < VISIBLE_RMS * noise:
      return "equivalent"
  return ""
