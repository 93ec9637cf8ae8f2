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

The kernels of a Llama-style bf16 model (``rms_norm``, ``silu``, ``rope``,
grouped-query ``attention``; their KUT signatures are those of
``peat_jax.kernels.CONVENTIONS``) have ports of both kinds here:
correct alternatives in :data:`BENIGN_PORTS` (HF Llama's RMSNorm, other
orders of the mean of squares, SiLU and RoPE in float32 written another
way, GQA by repeating the kv heads) and slips in :data:`LLAMA_PORTS`
(a bf16 accumulator, a framework's eps, a mean subtracted, SiLU in bf16,
gate and up swapped, the GPT-J rotary layout, a hard-coded rotary base,
positions off by one, the wrong kv-head grouping). Their golden kernels:
``flax.nnx.RMSNorm(dtype=x.dtype)`` (float32 statistics, one rounding),
``jax.nn.silu`` / ``silu(x) * up`` in float32 rounded once, the rotary
embedding of the two halves in float32 rounded once, and
``jax.nn.dot_product_attention`` (docs/kernels.md).
"""

from __future__ import annotations

import functools
import types

import jax
from jax import lax
import jax.numpy as jnp


def _wide_for_16_bit(fn):
  """A layer-norm port as golden computes one for 16-bit inputs (a bf16
  model's ``layers.layer_norm``: float32 statistics and result, float32
  parameters, one rounding to x's dtype); float32 inputs run as written."""
  @functools.wraps(fn)
  def port(x, scale, bias, *args, **kwargs):
    if jnp.dtype(x.dtype).itemsize != 2:
      return fn(x, scale, bias, *args, **kwargs)
    f = lambda a: jnp.asarray(a).astype(jnp.float32)
    return fn(f(x), f(scale), f(bias), *args, **kwargs).astype(x.dtype)
  return port


def _moments(x, unbiased: bool = False):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  sq = jnp.sum(jnp.square(x - mean), axis=-1, keepdims=True)
  n = x.shape[-1]
  return mean, sq / (n - 1 if unbiased else n)


@_wide_for_16_bit
def layer_norm_eps(x: jax.Array, scale: jax.Array, bias: jax.Array,
                   eps: float = 1e-6, *, port_eps: float = 1e-5) -> jax.Array:
  """Layer norm with the port's own epsilon (``port_eps``), not the model's."""
  del eps
  mean, var = _moments(x)
  return (x - mean) * lax.rsqrt(var + port_eps) * scale + bias


@_wide_for_16_bit
def layer_norm_eps_std(x: jax.Array, scale: jax.Array, bias: jax.Array,
                       eps: float = 1e-6, *, port_eps: float = 1e-5
                       ) -> jax.Array:
  """Layer norm with the epsilon added to the standard deviation,
  ``(x - mean) / (sqrt(var) + eps)``, where the model adds it to the
  variance (some TensorFlow and hand-written kernels do)."""
  del eps
  mean, var = _moments(x)
  return (x - mean) / (jnp.sqrt(var) + port_eps) * scale + bias


@_wide_for_16_bit
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


@_wide_for_16_bit
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
  del unused, precision
  # The site's result dtype (a bf16 model's attention logits: bf16
  # operands, float32 result), as golden's dot_general returns it.
  dg = functools.partial(lax.dot_general,
                         preferred_element_type=preferred_element_type)
  out = dg(lhs, rhs, dimension_numbers)
  (lc, rc), _ = dimension_numbers
  if out.ndim != 2 or len(lc) != 1 or out.shape[1] % tile == 0:
    return out
  k, w = lhs.shape[lc[0]], out.shape[1] % tile
  part = lambda a, b: dg(
      lax.slice_in_dim(lhs, a, b, axis=lc[0]),
      lax.slice_in_dim(rhs, a, b, axis=rc[0]), dimension_numbers)
  edge = part(0, k // 2) + part(k // 2, k)
  return out.at[:, -w:].set(edge[:, -w:])


# ------------------------------------------- Llama-style kernels (bf16)
#
# Conventions (peat_jax.kernels.CONVENTIONS): rms_norm ``(x, scale,
# eps)``, silu ``(x)`` or ``(x, up)``, rope ``(x, positions, *, theta)``
# (``theta`` also taken by position), attention ``(q, k, v, mask=None, *,
# bias=None, scale=None, is_causal=False)`` with k and v of fewer heads
# (grouped-query attention). Each port returns x's (q's) dtype.


def _f32(x: jax.Array) -> jax.Array:
  return x.astype(jnp.float32)


def _rb(x: jax.Array) -> jax.Array:
  """``x`` (float32) rounded to bfloat16's precision, kept in float32: one
  bf16 operation's rounding (to nearest, ties to even; beyond bf16's range
  an infinity).

  A ``reduce_precision``, not a convert to bfloat16 and back: XLA:GPU
  removes such a pair of converts where it allows excess precision (its
  default), so the port would round nothing there (the first GPU check);
  a reduce-precision is no conversion to remove (still to be confirmed on
  a GPU). On the CPU the two give the same bits
  (tests/kernels/test_ports_llama.py)."""
  return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def _norm_scale(scale, x: jax.Array):
  """The scale as the golden layer applies it: in x's dtype (as
  ``nnx.RMSNorm(dtype=x.dtype)`` casts its parameter), float32 for the
  arithmetic; None for a layer without scale."""
  return None if scale is None else _f32(jnp.asarray(scale).astype(x.dtype))


def _rms_out(x, xf, inv, scale):
  """``x * inv * scale`` in float32, rounded once to x's dtype."""
  y = xf * inv
  s = _norm_scale(scale, x)
  return (y if s is None else y * s).astype(x.dtype)


def rms_norm_hf(x: jax.Array, scale: jax.Array | None, eps: float = 1e-6
                ) -> jax.Array:
  """HF Llama's ``LlamaRMSNorm``: float32 statistics, the normalized value
  cast to x's dtype, then times the scale in x's dtype (a second rounding
  in bf16; in float32 the same arithmetic as golden). Benign."""
  xf = _f32(x)
  h = xf * lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
  h = h.astype(x.dtype)
  return h if scale is None else jnp.asarray(scale).astype(x.dtype) * h


def rms_norm_l2(x: jax.Array, scale: jax.Array | None, eps: float = 1e-6
                ) -> jax.Array:
  """RMS norm as a division by the RMS, ``x / sqrt(||x||^2 / n + eps)``
  (a correctly rounded square root and division instead of golden's
  ``rsqrt``), float32, one rounding. Benign."""
  xf = _f32(x)
  ss = jnp.sum(jnp.square(xf), axis=-1, keepdims=True)
  y = xf / jnp.sqrt(ss / x.shape[-1] + eps)
  s = _norm_scale(scale, x)
  return (y if s is None else y * s).astype(x.dtype)


def rms_norm_two_pass(x: jax.Array, scale: jax.Array | None,
                      eps: float = 1e-6) -> jax.Array:
  """Two passes over the row, as an overflow-safe norm does (BLAS
  ``nrm2``): the row's largest magnitude ``m``, then ``m**2 * mean((x /
  m)**2)``, float32, one rounding. Benign."""
  xf = _f32(x)
  m = jnp.max(jnp.abs(xf), axis=-1, keepdims=True)
  m = jnp.where(m > 0, m, 1.0)
  ms = jnp.square(m) * jnp.mean(jnp.square(xf / m), axis=-1, keepdims=True)
  return _rms_out(x, xf, lax.rsqrt(ms + eps), scale)


def _lanes(n: int, most: int = 32) -> int:
  lanes = 1
  while lanes * 2 <= most and n % (lanes * 2) == 0:
    lanes *= 2
  return lanes


def rms_norm_welford(x: jax.Array, scale: jax.Array | None,
                     eps: float = 1e-6) -> jax.Array:
  """The mean of squares as a warp-level kernel computes it: each of 32
  lanes (the largest power of two up to 32 dividing n) keeps a running
  mean (Welford's update ``m += (x**2 - m) / k``) of the elements
  ``lane, lane + 32, ...``, then the lanes are merged pairwise (Chan's
  formula, equal counts: ``(m_a + m_b) / 2``); float32, one rounding.
  Benign."""
  xf = _f32(x)
  n = x.shape[-1]
  lanes = _lanes(n)
  sq = jnp.square(xf).reshape(xf.shape[:-1] + (n // lanes, lanes))

  def update(m, kv):
    k, v = kv
    return m + (v - m) / k, None

  steps = jnp.moveaxis(sq, -2, 0)
  m, _ = lax.scan(update, steps[0], (
      jnp.arange(2, n // lanes + 1, dtype=jnp.float32), steps[1:]))
  while m.shape[-1] > 1:
    m = 0.5 * (m[..., 0::2] + m[..., 1::2])
  return _rms_out(x, xf, lax.rsqrt(m + eps), scale)


def rms_norm_acc_bf16(x: jax.Array, scale: jax.Array | None,
                      eps: float = 1e-6) -> jax.Array:
  """The mean of squares accumulated in a bfloat16 register element by
  element (``acc = bf16(acc + bf16(x_i**2))`` in order), the rest in
  float32 with one rounding: an ``accumulation:bf16`` slip whose error
  grows with the row length."""
  xf = _f32(x)

  def add(acc, v):
    return _rb(acc + _rb(jnp.square(v))), None

  acc, _ = lax.scan(add, jnp.zeros(xf.shape[:-1], jnp.float32),
                    jnp.moveaxis(xf, -1, 0))
  ms = (acc / x.shape[-1])[..., None]
  return _rms_out(x, xf, lax.rsqrt(ms + eps), scale)


def rms_norm_eps(x: jax.Array, scale: jax.Array | None, eps: float = 1e-6,
                 *, port_eps: float = 1e-5) -> jax.Array:
  """RMS norm with the port's own epsilon (``port_eps``, HF Llama's
  default 1e-5), not the model's: relative error ``(port_eps - eps) /
  (2 mean(x**2))`` per row, small unless the row's mean square is."""
  del eps
  xf = _f32(x)
  ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
  return _rms_out(x, xf, lax.rsqrt(ms + port_eps), scale)


def rms_norm_as_layer_norm(x: jax.Array, scale: jax.Array | None,
                           eps: float = 1e-6) -> jax.Array:
  """Layer norm without bias where the model uses RMS norm: the row's mean
  subtracted and the variance about it (a centring the model does not
  make), float32, one rounding."""
  xf = _f32(x)
  mean = jnp.mean(xf, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
  return _rms_out(x, xf - mean, lax.rsqrt(var + eps), scale)


def silu_f32(x: jax.Array, up: jax.Array | None = None) -> jax.Array:
  """SiLU (times ``up``: SwiGLU) in float32 as ``x / (1 + exp(-x))``, one
  rounding to x's dtype. Benign."""
  xf = _f32(x)
  y = xf / (1.0 + jnp.exp(-xf))
  return (y if up is None else y * _f32(up)).astype(x.dtype)


def silu_bf16(x: jax.Array, up: jax.Array | None = None) -> jax.Array:
  """SiLU with every operation in bfloat16 (``x``, ``exp(-x)``, ``1 +
  e``, ``1 / d``, ``x * s`` and ``* up`` each rounded to bf16): a
  ``precision:bf16`` slip, a few bf16 ulps."""
  xb = _rb(_f32(x))
  e = _rb(jnp.exp(-xb))
  sig = _rb(1.0 / _rb(1.0 + e))
  y = _rb(xb * sig)
  if up is not None:
    y = _rb(y * _rb(_f32(up)))
  return y.astype(x.dtype)


def swiglu_swapped(x: jax.Array, up: jax.Array | None = None) -> jax.Array:
  """SwiGLU with gate and up swapped, ``silu(up) * x`` (the projections'
  weights loaded the wrong way round); float32, one rounding. At a plain
  SiLU site (no ``up``) it is the correct SiLU."""
  if up is None:
    return jax.nn.silu(_f32(x)).astype(x.dtype)
  return (jax.nn.silu(_f32(up)) * _f32(x)).astype(x.dtype)


def _rope_check(x, positions) -> None:
  if x.ndim != 4 or x.shape[-1] % 2:
    raise ValueError(f"rope: x must be [batch, length, heads, head_dim] "
                     f"with an even head_dim; got shape {x.shape}")
  if jnp.ndim(positions) != 1 or positions.shape[0] != x.shape[1]:
    raise ValueError(f"rope: positions must be [length] = [{x.shape[1]}]; "
                     f"got shape {jnp.shape(positions)}")


def _rope_halves(x, positions, theta):
  """The golden rotation of the two halves (float32, one rounding)."""
  _rope_check(x, positions)
  d = x.shape[-1]
  h = d // 2
  inv_freq = jnp.asarray(theta, jnp.float32) ** (
      -jnp.arange(h, dtype=jnp.float32) * (2.0 / d))
  angle = jnp.asarray(positions).astype(jnp.float32)[:, None] * inv_freq
  cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
  xf = _f32(x)
  x1, x2 = xf[..., :h], xf[..., h:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def rope_f32_tables(x: jax.Array, positions: jax.Array,
                    theta: float = 10000.0) -> jax.Array:
  """RoPE as HF Llama writes it: ``inv_freq = 1 / theta**(arange(0, D, 2)
  / D)``, full-width float32 cos/sin tables of ``[freqs, freqs]`` and
  ``x * cos + rotate_half(x) * sin``, float32, one rounding. Benign."""
  _rope_check(x, positions)
  d = x.shape[-1]
  inv_freq = 1.0 / (jnp.asarray(theta, jnp.float32) ** (
      jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  freqs = jnp.asarray(positions).astype(jnp.float32)[:, None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  cos, sin = jnp.cos(emb)[None, :, None], jnp.sin(emb)[None, :, None]
  xf = _f32(x)
  rot = jnp.concatenate([-xf[..., d // 2:], xf[..., :d // 2]], axis=-1)
  return (xf * cos + rot * sin).astype(x.dtype)


def rope_interleaved(x: jax.Array, positions: jax.Array,
                     theta: float = 10000.0) -> jax.Array:
  """RoPE in the GPT-J / Meta-checkpoint layout: the pairs ``(x[2i],
  x[2i+1])`` rotated by ``inv_freq[i]`` where the model rotates ``(x[i],
  x[i + D/2])``: golden's values in permuted feature positions (for
  inputs permuted the other way)."""
  _rope_check(x, positions)
  d = x.shape[-1]
  inv_freq = jnp.asarray(theta, jnp.float32) ** (
      -jnp.arange(d // 2, dtype=jnp.float32) * (2.0 / d))
  angle = jnp.asarray(positions).astype(jnp.float32)[:, None] * inv_freq
  cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
  xf = _f32(x)
  xe, xo = xf[..., 0::2], xf[..., 1::2]
  out = jnp.stack([xe * cos - xo * sin, xo * cos + xe * sin], axis=-1)
  return out.reshape(x.shape).astype(x.dtype)


def rope_theta_500k(x: jax.Array, positions: jax.Array,
                    theta: float = 10000.0, *, port_theta: float = 500000.0
                    ) -> jax.Array:
  """RoPE with a hard-coded base (Llama 3's 500000) ignoring the model's
  ``theta``: golden of another constant."""
  del theta
  return _rope_halves(x, positions, port_theta)


def rope_offset(x: jax.Array, positions: jax.Array, theta: float = 10000.0
                ) -> jax.Array:
  """RoPE of ``positions + 1`` (1-based positions, or a cache offset
  counted twice): golden of other positions."""
  return _rope_halves(x, jnp.asarray(positions) + 1, theta)


def _gqa_attention(q, k, v, mask, bias, scale, is_causal, kv_heads):
  """Attention with k/v heads gathered per query head, float32, one
  rounding: ``kv_heads(h, hk)`` maps each query head to its kv head."""
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"attention: q, k, v must be [batch, length, heads, "
                     f"head_dim]; got {q.shape}, {k.shape}, {v.shape}")
  h, hk = q.shape[2], k.shape[2]
  if hk == 0 or h % hk or v.shape[2] != hk:
    raise ValueError(f"attention: q's heads ({h}) must be a multiple of "
                     f"k's and v's ({hk}, {v.shape[2]})")
  idx = kv_heads(h, hk)
  kf, vf = _f32(k)[:, :, idx], _f32(v)[:, :, idx]
  d = q.shape[-1]
  scale = 1.0 / (d ** 0.5) if scale is None else scale
  s = jnp.einsum("bthd,bshd->bhts", _f32(q), kf,
                 precision=lax.Precision.HIGHEST) * jnp.float32(scale)
  if bias is not None:
    s = s + _f32(jnp.asarray(bias))
  big_neg = jnp.finfo(jnp.float32).min
  if mask is not None:
    s = jnp.where(mask, s, big_neg)
  if is_causal:
    t, sk = s.shape[-2:]
    s = jnp.where(jnp.tril(jnp.ones((t, sk), bool)), s, big_neg)
  p = jax.nn.softmax(s, axis=-1)
  out = jnp.einsum("bhts,bshd->bthd", p, vf, precision=lax.Precision.HIGHEST)
  return out.astype(q.dtype)


def gqa_repeat(q: jax.Array, k: jax.Array, v: jax.Array,
               mask: jax.Array | None = None, *, bias=None, scale=None,
               is_causal: bool = False) -> jax.Array:
  """Grouped-query attention by repeating each kv head for its ``H / Hk``
  query heads (``repeat_interleave``: query head ``j`` uses kv head ``j //
  (H / Hk)``), then standard softmax attention in float32, one rounding.
  Benign."""
  return _gqa_attention(q, k, v, mask, bias, scale, is_causal,
                        lambda h, hk: jnp.arange(h) // (h // hk))


def gqa_wrong_group(q: jax.Array, k: jax.Array, v: jax.Array,
                    mask: jax.Array | None = None, *, bias=None, scale=None,
                    is_causal: bool = False) -> jax.Array:
  """Grouped-query attention with the kv heads tiled instead of repeated:
  query head ``j`` uses kv head ``j % Hk`` instead of ``j // (H / Hk)``
  (the same only where the two agree, e.g. head 0, and everywhere when
  ``Hk == H``): golden's values of other heads."""
  return _gqa_attention(q, k, v, mask, bias, scale, is_causal,
                        lambda h, hk: jnp.arange(h) % hk)


#: name -> (site kernel, a benign port: another summation order or
#: evaluation order only, at working precision; the Detector must pass it).
BENIGN_PORTS: types.MappingProxyType = types.MappingProxyType({
    "split_k_edge": ("dot_general", dot_general_split_k_edge),
    "rms_norm_hf": ("rms_norm", rms_norm_hf),
    "rms_norm_l2": ("rms_norm", rms_norm_l2),
    "rms_norm_two_pass": ("rms_norm", rms_norm_two_pass),
    "rms_norm_welford": ("rms_norm", rms_norm_welford),
    "silu_f32": ("silu", silu_f32),
    "rope_f32_tables": ("rope", rope_f32_tables),
    "gqa_repeat": ("attention", gqa_repeat),
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

#: kind -> name -> a slip of a Llama-style model's port (the KUT signatures
#: of ``peat_jax.kernels.CONVENTIONS``). Kept apart from :data:`PORTS`: the composed
#: calibration runs these on its 16-bit cases (the ``llama`` and
#: ``vit_bf16`` sites), ``gqa_wrong_group`` only where there are fewer kv
#: heads than query heads (elsewhere it is exact).
LLAMA_PORTS: types.MappingProxyType = types.MappingProxyType({
    "rms_norm": types.MappingProxyType({
        "rms_norm_acc_bf16": rms_norm_acc_bf16,
        "rms_norm_eps": functools.partial(rms_norm_eps, port_eps=1e-5),
        "rms_norm_as_layer_norm": rms_norm_as_layer_norm,
    }),
    "silu": types.MappingProxyType({
        "silu_bf16": silu_bf16,
        "swiglu_swapped": swiglu_swapped,
    }),
    "rope": types.MappingProxyType({
        "rope_interleaved": rope_interleaved,
        "rope_theta_500k": rope_theta_500k,
        "rope_offset": rope_offset,
    }),
    "attention": types.MappingProxyType({
        "gqa_wrong_group": gqa_wrong_group,
    }),
})

_LLAMA_MODELS = {
    "rms_norm_acc_bf16": "accumulation:bf16",
    "rms_norm_eps": "parameter",
    "rms_norm_as_layer_norm": "parameter",
    "silu_bf16": "precision:bf16",
    # The port probe's swapped_operands hypothesis (golden's values of
    # the other operand order): values in the wrong place.
    "swiglu_swapped": "indexing",
    "rope_interleaved": "indexing",
    "rope_theta_500k": "parameter",
    "rope_offset": "parameter",
    "gqa_wrong_group": "indexing",
}


def _expected() -> dict:
  out: dict = {}
  for kind, ports in PORTS.items():
    out.setdefault(kind, {}).update({
        name: ("approximation" if name.startswith(("fast_", "tanh"))
               else "parameter") for name in ports})
  for kind, ports in LLAMA_PORTS.items():
    out.setdefault(kind, {}).update({name: _LLAMA_MODELS[name]
                                     for name in ports})
  for name, (kernel, _) in BENIGN_PORTS.items():
    out.setdefault(kernel, {})[name] = "reordering"
  return {k: types.MappingProxyType(v) for k, v in out.items()}


#: kind -> name -> the error model the Detector should name, for
#: :data:`PORTS`, :data:`LLAMA_PORTS` and :data:`BENIGN_PORTS`
#: (``reordering``; their kind is the site kernel).
EXPECTED_ERROR_MODEL: types.MappingProxyType = types.MappingProxyType(
    _expected())
