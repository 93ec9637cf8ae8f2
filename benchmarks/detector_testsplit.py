"""The Detector's test split: (base, fault) cases nobody tunes it on.

Written apart from the Detector and from the project's other case
generators, with its own kernels, shapes, input distributions, layouts and
fault recipes, and using only the public API (`peat.analyze`, `peat.detect`).

Each case is a kernel under test (KUT) output `t`, built from a base (what a
correct or precision-reduced port computes) and optionally a fault on top of
it, next to the golden output `g` (the jitted JAX kernel at the case dtype)
and a float64 NumPy reference `r` of the same math on the same inputs. The
Detector's diagnosis is scored against the expected error model (name top-1)
and the expected verdict.

Bases (expected model, verdict): `exact` (t = g, a carrier for faults only);
`reordered` (another summation order or blocking: `reordering` or `exact`,
pass); `tf32_rne` / `tf32_rtz` (matmul operands rounded to TF32:
`precision:tf32`, warn or pass); `bf16_out` (golden output rounded to bf16:
`precision:bf16`, warn or pass); `fp16_compute` (the op in float16 math:
`precision:fp16`, warn or pass). Faults on top of a base (fail): `bitflip`,
`stuck_at`, `random_value`, `zero`, `indexing`, `scale`, `nan`, `lane`, a
wrong formula (`approximation` or `parameter`) and `ftz` (warn or fail). A
fault that leaves its base's output bitwise unchanged is skipped.

Usage:
  python benchmarks/detector_testsplit.py [--seed=0] [--context=none]
      [--dtypes=float32,bfloat16] [--json=PATH] [--quiet]
"""

import argparse
import collections
import dataclasses
import functools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax
import ml_dtypes
import numpy as np

import peat_jax as peat

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
DTYPES = {"float32": F32, "bfloat16": BF16}
HI = lax.Precision.HIGHEST
UINT = {2: np.uint16, 4: np.uint32}
FTZ_LIMIT = 1e-30


def _ident(x):
  """The identity (no rounding hook)."""
  return x


# ---------------------------------------------------------------- kernels


@dataclasses.dataclass
class Kernel:
  """One kernel with its inputs and the implementations a case needs.

  Attributes:
    name: the kernel's name in the tables.
    site: the site kind passed as context.
    reduction: the reduction length passed as context.
    inputs: the inputs at the case dtype, as given to the golden kernel.
    math: float32 JAX math; takes `rnd`, a hook applied to matmul operands.
    ref: the same math in float64 NumPy.
    reorder: float32 JAX math with another summation order or blocking.
    tf32: whether TF32 bases apply (float32 matmul-like kernels).
    bf16_out: whether the bf16-rounded-output base applies.
    fp16: float16 NumPy math of the kernel, or None.
    wrong: (detail, float32 JAX math) of wrong formulas.
  """
  name: str
  site: str
  reduction: int
  inputs: tuple
  math: Callable
  ref: Callable
  reorder: Callable
  tf32: bool = False
  bf16_out: bool = False
  fp16: Optional[Callable] = None
  wrong: tuple = ()


def compiled(fn, dtype, **kw):
  """Jits `fn` computing in float32 and rounding its output to `dtype`.

  Args:
    fn: float32 JAX math.
    dtype: the output dtype (the case dtype).
    **kw: keyword arguments bound into `fn`.

  Returns:
    A function of NumPy inputs returning a NumPy output.
  """
  def run(*xs):
    xs = [x.astype(jnp.float32) for x in xs]
    return fn(*xs, **kw).astype(dtype)
  jitted = jax.jit(run)
  return lambda *xs: np.asarray(jitted(*xs))


def cast(arrays, dtype):
  """Rounds float64 arrays to the case dtype."""
  return tuple(np.asarray(a, np.float64).astype(dtype) for a in arrays)


def dropout(rng, x, p):
  """Zeroes a fraction p of x and rescales the rest, as dropout does."""
  keep = rng.random(x.shape) >= p
  return np.where(keep, x / (1.0 - p), 0.0)


def erf64(x):
  """Elementwise erf in float64 (the standard library's)."""
  return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def sigmoid64(x):
  """Numerically stable logistic function in float64."""
  e = np.exp(-np.abs(x))
  return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def softmax64(x, axis=-1):
  """Softmax in float64."""
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


# matmul, plain layout: A[M,K] @ B[K,N], split-K reorder.


def mm_nn(a, b, rnd=_ident):
  """A @ B at float32 HIGHEST."""
  return jnp.matmul(rnd(a), rnd(b), precision=HI)


def mm_nn_split(a, b, part=_ident):
  """A @ B as three uneven K chunks, partials summed last to first."""
  k = a.shape[1]
  cuts = [0, k // 3, 2 * k // 3 + 1, k]
  parts = [part(jnp.matmul(a[:, i:j], b[i:j], precision=HI))
           for i, j in zip(cuts, cuts[1:])]
  return (parts[2] + parts[1]) + parts[0]


def kernel_matmul_nn(rng, dtype):
  """Laplace A with three heavy K channels; long prime K=211."""
  m, k, n = 37, 211, 97
  a = rng.laplace(0.0, 1.0, (m, k))
  a[:, rng.choice(k, 3, replace=False)] *= 30.0
  b = rng.uniform(-1.0, 1.0, (k, n)) / math.sqrt(k)
  return Kernel("matmul_nn", "dot_general", k, cast((a, b), dtype),
                mm_nn, lambda a, b: a @ b, mm_nn_split, tf32=True)


# matmul, transposed A operand: out = At^T @ B, reversed-K reorder.

_TN = (((0,), (0,)), ((), ()))


def mm_tn(at, b, rnd=_ident):
  """At^T @ B with At stored [K, M]."""
  return lax.dot_general(rnd(at), rnd(b), _TN, precision=HI)


def mm_tn_reversed(at, b, part=_ident):
  """At^T @ B over reversed K, as two halves summed."""
  at, b = at[::-1], b[::-1]
  h = at.shape[0] // 2
  lo = part(lax.dot_general(at[:h], b[:h], _TN, precision=HI))
  hi = part(lax.dot_general(at[h:], b[h:], _TN, precision=HI))
  return lo + hi


def kernel_matmul_tn(rng, dtype):
  """Sparse (dropout) transposed A, ramped B; short prime K=29."""
  k, m, n = 29, 61, 64
  at = dropout(rng, rng.standard_normal((k, m)), 0.3)
  ramp = np.linspace(-2.0, 2.0, k * n).reshape(k, n)
  b = ramp + 0.05 * rng.standard_normal((k, n))
  return Kernel("matmul_tn", "dot_general", k, cast((at, b), dtype),
                mm_tn, lambda at, b: at.T @ b, mm_tn_reversed, tf32=True)


# batched matmul, transposed B: einsum bmk,bnk->bmn, pairwise reorder.


def bmm(a, b, rnd=_ident):
  """Batched A @ B^T."""
  return jnp.einsum("bmk,bnk->bmn", rnd(a), rnd(b), precision=HI)


def bmm_pairwise(a, b, part=_ident):
  """Batched A @ B^T with products summed as a pairwise tree."""
  p = a[:, :, None, :] * b[:, None, :, :]
  width = 1 << (p.shape[-1] - 1).bit_length()
  p = jnp.pad(p, [(0, 0)] * 3 + [(0, width - p.shape[-1])])
  while p.shape[-1] > 2:
    p = p[..., 0::2] + p[..., 1::2]
  return part(p[..., 0]) + part(p[..., 1])


def kernel_matmul_bmm(rng, dtype):
  """Gaussian mixture A (10% wide); long prime K=509; batch 3."""
  bsz, m, k, n = 3, 19, 509, 67
  wide = rng.random((bsz, m, k)) < 0.1
  a = rng.standard_normal((bsz, m, k)) * np.where(wide, 10.0, 1.0)
  b = rng.uniform(-1.0, 1.0, (bsz, n, k))
  ref = lambda a, b: np.einsum("bmk,bnk->bmn", a, b)
  return Kernel("matmul_bmm", "dot_general", k, cast((a, b), dtype),
                bmm, ref, bmm_pairwise, tf32=True)


# matmul with tiny-but-normal rows (the carrier of the ftz fault).


def mm_chunked16(a, b, part=_ident):
  """A @ B over K chunks of 16, two halves accumulated apart."""
  halves = []
  for lo, hi in ((0, 32), (32, a.shape[1])):
    acc = jnp.matmul(a[:, lo:lo + 16], b[lo:lo + 16], precision=HI)
    for i in range(lo + 16, hi, 16):
      acc = acc + jnp.matmul(a[:, i:i + 16], b[i:i + 16], precision=HI)
    halves.append(part(acc))
  return halves[1] + halves[0]


def kernel_matmul_tiny(rng, dtype):
  """Three A rows near 1e-34, B columns spread over 3.5 decades."""
  m, k, n = 31, 64, 112
  a = rng.standard_normal((m, k))
  for row in rng.choice(m, 3, replace=False):
    sign = rng.choice([-1.0, 1.0], k)
    a[row] = 10.0 ** rng.uniform(-35.0, -33.0) * sign * rng.uniform(
        0.5, 2.0, k)
  cols = 10.0 ** rng.uniform(0.0, 3.5, n)
  b = rng.choice([-1.0, 1.0], (k, n)) * rng.uniform(0.25, 1.25, (k, n))
  return Kernel("matmul_tiny", "dot_general", k, cast((a, b * cols), dtype),
                mm_nn, lambda a, b: a @ b, mm_chunked16, tf32=True)


# conv2d NHWC / HWIO, VALID; reorder splits the input channels.

_NHWC = ("NHWC", "HWIO", "NHWC")


def conv_nhwc(x, w, rnd=_ident):
  """NHWC convolution, VALID padding."""
  return lax.conv_general_dilated(rnd(x), rnd(w), (1, 1), "VALID",
                                  dimension_numbers=_NHWC, precision=HI)


def conv_nhwc_split(x, w, part=_ident):
  """NHWC convolution as two input-channel groups summed."""
  c = x.shape[-1] // 2
  lo = part(conv_nhwc(x[..., :c], w[:, :, :c]))
  hi = part(conv_nhwc(x[..., c:], w[:, :, c:]))
  return hi + lo


def conv_ref_nchw(x, w, pad):
  """Float64 NCHW/OIHW convolution as a sum over kernel taps.

  Args:
    x: [N, C, H, W] input.
    w: [O, C, KH, KW] weights.
    pad: ((top, bottom), (left, right)) zero padding.

  Returns:
    [N, O, HO, WO] output.
  """
  x = np.pad(x, ((0, 0), (0, 0)) + tuple(pad))
  kh, kw = w.shape[2:]
  ho, wo = x.shape[2] - kh + 1, x.shape[3] - kw + 1
  out = 0.0
  for i in range(kh):
    for j in range(kw):
      patch = x[:, :, i:i + ho, j:j + wo]
      out = out + np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
  return out


def conv_nhwc_ref(x, w):
  """Float64 NHWC reference through the NCHW tap sum."""
  y = conv_ref_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1),
                    ((0, 0), (0, 0)))
  return y.transpose(0, 2, 3, 1)


def kernel_conv_nhwc(rng, dtype):
  """Small-magnitude uniform input (about 1e-3), prime channels 17."""
  x = rng.uniform(-1e-3, 1e-3, (2, 13, 11, 17))
  w = rng.standard_normal((3, 3, 17, 19)) / math.sqrt(3 * 3 * 17)
  return Kernel("conv_nhwc", "conv_general_dilated", 3 * 3 * 17,
                cast((x, w), dtype), conv_nhwc, conv_nhwc_ref,
                conv_nhwc_split, tf32=True)


# conv2d NCHW / OIHW, 5x3 kernel padded on H; reorder sums taps.

_NCHW = ("NCHW", "OIHW", "NCHW")
_NCHW_PAD = ((2, 2), (0, 0))


def conv_nchw(x, w, rnd=_ident):
  """NCHW convolution, padded 2 on H only."""
  return lax.conv_general_dilated(rnd(x), rnd(w), (1, 1), _NCHW_PAD,
                                  dimension_numbers=_NCHW, precision=HI)


def conv_nchw_taps(x, w, part=_ident):
  """NCHW convolution as 1x1 products summed tap by tap.

  The taps of the kernel's upper rows and of its lower rows are summed
  apart and the two partials added (`part` is applied to each).
  """
  x = jnp.pad(x, ((0, 0), (0, 0)) + _NCHW_PAD)
  kh, kw = w.shape[2:]
  ho, wo = x.shape[2] - kh + 1, x.shape[3] - kw + 1
  halves = []
  for rows in (range(kh // 2), range(kh // 2, kh)):
    out = 0.0
    for i in rows:
      for j in range(kw):
        patch = x[:, :, i:i + ho, j:j + wo]
        out = out + jnp.einsum("nchw,oc->nohw", patch, w[:, :, i, j],
                               precision=HI)
    halves.append(part(out))
  return halves[0] + halves[1]


def kernel_conv_nchw(rng, dtype):
  """ReLU'd Laplace input (exact zeros), 5x3 kernel, 7 channels."""
  x = np.maximum(rng.laplace(0.0, 1.0, (3, 7, 12, 23)), 0.0)
  w = rng.uniform(-1.0, 1.0, (5, 7, 5, 3)) / math.sqrt(7 * 5 * 3)
  ref = lambda x, w: conv_ref_nchw(x, w, _NCHW_PAD)
  return Kernel("conv_nchw", "conv_general_dilated", 7 * 5 * 3,
                cast((x, w), dtype), conv_nchw, ref, conv_nchw_taps,
                tf32=True)


# softmax over the last axis; reorder is a two-block online softmax.


def softmax(x, rnd=_ident, temperature=1.0):
  """Softmax over the last axis."""
  return jax.nn.softmax(x / temperature if temperature != 1.0 else x,
                        axis=-1)


def softmax_online(x, part=_ident):
  """Softmax whose normalizer is merged from two blocks, as online."""
  a, b = x[..., :64], x[..., 64:]
  ma = a.max(-1, keepdims=True)
  mb = b.max(-1, keepdims=True)
  m = jnp.maximum(ma, mb)
  s = (jnp.exp(a - ma).sum(-1, keepdims=True) * jnp.exp(ma - m)
       + jnp.exp(b - mb).sum(-1, keepdims=True) * jnp.exp(mb - m))
  return part(jnp.exp(x - m)) / s


def softmax_fp16(x):
  """Softmax in float16 elementwise math with a float32 row sum."""
  x = x.astype(F16)
  e = np.exp(x - x.max(-1, keepdims=True))
  s = e.astype(F32).sum(-1, keepdims=True).astype(F16)
  return (e / s).astype(F32)


def kernel_softmax(rng, dtype):
  """Logits with peaky rows and masked-like positions near -30."""
  x = 2.5 * rng.standard_normal((3, 11, 113))
  x[rng.random((3, 11)) < 0.3] *= 6.0
  masked = rng.random(x.shape) < 0.1
  x = np.where(masked, -30.0 + rng.standard_normal(x.shape), x)
  wrong = (("temperature 2", functools.partial(softmax, temperature=2.0)),)
  return Kernel("softmax", "softmax", 113, cast((x,), dtype), softmax,
                softmax64, softmax_online, bf16_out=True,
                fp16=softmax_fp16, wrong=wrong)


# layer norm with gamma and beta; reorder uses chunked sums and rsqrt.


def layer_norm(x, gamma, beta, rnd=_ident, eps=1e-5):
  """Layer norm over the last axis (biased variance)."""
  mu = x.mean(-1, keepdims=True)
  xc = x - mu
  var = (xc * xc).mean(-1, keepdims=True)
  return xc / jnp.sqrt(var + eps) * gamma + beta


def chunked_sum(v, size=50):
  """Sum over the last axis as chunk sums added last to first."""
  parts = [v[..., i:i + size].sum(-1, keepdims=True)
           for i in range(0, v.shape[-1], size)]
  total = parts[-1]
  for p in parts[-2::-1]:
    total = total + p
  return total


def layer_norm_chunked(x, gamma, beta, part=_ident, eps=1e-5):
  """Layer norm from chunked sums, multiplied by rsqrt."""
  n = x.shape[-1]
  xc = x - chunked_sum(x) / n
  var = chunked_sum(xc * xc) / n
  return part(xc * lax.rsqrt(var + eps)) * gamma + beta


def layer_norm_ref(x, gamma, beta, eps=1e-5):
  """Float64 layer norm."""
  xc = x - x.mean(-1, keepdims=True)
  var = (xc * xc).mean(-1, keepdims=True)
  return xc / np.sqrt(var + eps) * gamma + beta


def kernel_layer_norm(rng, dtype):
  """Shifted rows of varied scale with four heavy channels; N=263."""
  rows, n = 14, 263
  x = rng.standard_normal((rows, n)) + 3.0
  x[:, rng.choice(n, 4, replace=False)] *= 25.0
  x *= 10.0 ** rng.uniform(-1.5, 0.3, (rows, 1))
  gamma = 1.0 + 0.1 * rng.standard_normal(n)
  beta = 0.05 * rng.standard_normal(n)
  wrong = (("eps 1e-1", functools.partial(layer_norm, eps=1e-1)),)
  return Kernel("layer_norm", "layer_norm", n,
                cast((x, gamma, beta), dtype), layer_norm, layer_norm_ref,
                layer_norm_chunked, bf16_out=True, wrong=wrong)


# RMS norm; reorder divides by sqrt of a chunked sum.


def rms_norm(x, w, rnd=_ident, eps=1e-6):
  """RMS norm over the last axis."""
  ms = (x * x).mean(-1, keepdims=True)
  return x * lax.rsqrt(ms + eps) * w


def rms_norm_chunked(x, w, part=_ident, eps=1e-6):
  """RMS norm from a chunked sum of squares, divided by sqrt."""
  ms = chunked_sum(x * x, 32) / x.shape[-1]
  return part(x / jnp.sqrt(ms + eps)) * w


def rms_norm_ref(x, w, eps=1e-6):
  """Float64 RMS norm."""
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def kernel_rms_norm(rng, dtype):
  """Laplace rows ramped over two decades of magnitude; N=101."""
  rows, n = 37, 101
  ramp = 10.0 ** np.linspace(-1.5, 0.5, rows)[:, None]
  x = rng.laplace(0.0, 1.0, (rows, n)) * ramp
  w = 1.0 + 0.2 * rng.standard_normal(n)
  wrong = (("eps 1e-1", functools.partial(rms_norm, eps=1e-1)),)
  return Kernel("rms_norm", "rms_norm", n, cast((x, w), dtype), rms_norm,
                rms_norm_ref, rms_norm_chunked, wrong=wrong)


# GELU (erf form); reorder uses erfc.


def gelu(x, rnd=_ident):
  """GELU, erf form."""
  return jax.nn.gelu(x, approximate=False)


def gelu_piecewise(x, part=_ident):
  """GELU with 1 + erf(z) for z >= 0 and erfc(-z) below."""
  z = x * np.float32(1.0 / math.sqrt(2.0))
  phi2 = jnp.where(z >= 0, 1.0 + lax.erf(z), lax.erfc(-z))
  return 0.5 * x * part(phi2)


def gelu_tanh(x):
  """GELU, tanh form (the wrong closed form here)."""
  return jax.nn.gelu(x, approximate=True)


def silu(x, rnd=_ident):
  """SiLU, x * sigmoid(x)."""
  return jax.nn.silu(x)


def gelu_fp16(x):
  """GELU in float16 math, each operation rounded to float16."""
  x = x.astype(F16)
  e = erf64(x * F16.type(1.0 / math.sqrt(2.0))).astype(F16)
  return ((F16.type(0.5) * x) * (F16.type(1.0) + e)).astype(F32)


def gelu_ref(x):
  """Float64 GELU, erf form."""
  return 0.5 * x * (1.0 + erf64(x / math.sqrt(2.0)))


def kernel_gelu(rng, dtype):
  """Laplace(1.5) with 8% exact zeros and two heavy columns."""
  x = rng.laplace(0.0, 1.5, (29, 131))
  x[rng.random(x.shape) < 0.08] = 0.0
  x[:, rng.choice(131, 2, replace=False)] *= 4.0
  wrong = (("tanh form", lambda x: gelu_tanh(x)),
           ("silu instead", lambda x: silu(x)))
  return Kernel("gelu", "gelu", 1, cast((x,), dtype), gelu, gelu_ref,
                gelu_piecewise, bf16_out=True, fp16=gelu_fp16, wrong=wrong)


# SiLU; reorder computes x / (1 + exp(-x)).


def silu_div(x, part=_ident):
  """SiLU as x / (1 + exp(-x))."""
  return x / part(1.0 + jnp.exp(-x))


def hard_swish(x):
  """Hard swish x * relu6(x + 3) / 6 (the wrong closed form here)."""
  return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


def silu_fp16(x):
  """SiLU in float16 math with a stable float16 sigmoid."""
  x = x.astype(F16)
  e = np.exp(-np.abs(x))
  one = F16.type(1.0)
  s = np.where(x >= 0, one / (one + e), e / (one + e))
  return (x * s).astype(F32)


def kernel_silu(rng, dtype):
  """Rows of sorted uniform(-8, 6) values; batch dims 4 x 9."""
  x = np.sort(rng.uniform(-8.0, 6.0, (4, 9, 107)), axis=-1)
  wrong = (("gelu instead", lambda x: gelu(x)),
           ("hard swish", hard_swish))
  return Kernel("silu", "silu", 1, cast((x,), dtype), silu,
                lambda x: x * sigmoid64(x), silu_div, bf16_out=True,
                fp16=silu_fp16, wrong=wrong)


# SwiGLU silu(gate) * up; reorder reassociates.


def swiglu(gate, up, rnd=_ident):
  """silu(gate) * up."""
  return jax.nn.silu(gate) * up


def swiglu_assoc(gate, up, part=_ident):
  """(gate * up) * sigmoid(gate)."""
  return part(gate * up) * jax.nn.sigmoid(gate)


def swiglu_tanh_gate(gate, up):
  """GELU-tanh gate in place of SiLU (the wrong formula here)."""
  return gelu_tanh(gate) * up


def kernel_swiglu(rng, dtype):
  """Uniform(-5, 5) gate; Gaussian up after 25% dropout."""
  gate = rng.uniform(-5.0, 5.0, (61, 59))
  up = dropout(rng, rng.standard_normal((61, 59)), 0.25)
  ref = lambda g, u: g * sigmoid64(g) * u
  wrong = (("gelu-tanh gate", swiglu_tanh_gate),)
  return Kernel("swiglu", "silu", 1, cast((gate, up), dtype), swiglu, ref,
                swiglu_assoc, wrong=wrong)


# attention q, k, v [B, T, H, D]; reorder is a blocked (flash) form.


def attention(q, k, v, rnd=_ident, scaled=True):
  """softmax(q k^T / sqrt(D)) v, per batch and head."""
  s = jnp.einsum("bqhd,bkhd->bhqk", rnd(q), rnd(k), precision=HI)
  if scaled:
    s = s / np.float32(math.sqrt(q.shape[-1]))
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", rnd(p), rnd(v), precision=HI)


def attention_flash(q, k, v, part=_ident, block=8):
  """Attention over key blocks with an online softmax."""
  scale = np.float32(1.0 / math.sqrt(q.shape[-1]))
  b, t, h, d = q.shape
  m = jnp.full((b, h, t), -jnp.inf, jnp.float32)
  den = jnp.zeros((b, h, t), jnp.float32)
  acc = jnp.zeros((b, h, t, d), jnp.float32)
  for j in range(0, k.shape[1], block):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k[:, j:j + block],
                   precision=HI) * scale
    m_new = jnp.maximum(m, s.max(-1))
    corr = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[..., None])
    den = den * corr + p.sum(-1)
    acc = acc * corr[..., None] + jnp.einsum(
        "bhqk,bkhd->bhqd", part(p), v[:, j:j + block], precision=HI)
    m = m_new
  return (acc / den[..., None]).transpose(0, 2, 1, 3)


def attention_ref(q, k, v):
  """Float64 attention."""
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
  return np.einsum("bhqk,bkhd->bqhd", softmax64(s), v)


def kernel_attention(rng, dtype):
  """Laplace q, Gaussian k, small uniform v with zeros; T=23, D=24."""
  shape = (2, 23, 3, 24)
  q = rng.laplace(0.0, 0.8, shape)
  k = rng.standard_normal(shape)
  v = dropout(rng, rng.uniform(-0.02, 0.02, shape), 0.1)
  wrong = (("no 1/sqrt(D)", functools.partial(attention, scaled=False)),)
  return Kernel("attention", "attention", shape[1], cast((q, k, v), dtype),
                attention, attention_ref, attention_flash, tf32=True,
                wrong=wrong)


# causal attention, longer sequence; the wrong formula fills the mask
# with 0 instead of -inf.


def causal_attention(q, k, v, rnd=_ident, fill=-jnp.inf):
  """Causal softmax(q k^T / sqrt(D)) v."""
  t = q.shape[1]
  s = jnp.einsum("bqhd,bkhd->bhqk", rnd(q), rnd(k), precision=HI)
  s = s / np.float32(math.sqrt(q.shape[-1]))
  s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, fill)
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", rnd(p), rnd(v), precision=HI)


def causal_attention_flash(q, k, v, part=_ident, block=32):
  """Causal attention over key blocks with an online softmax."""
  scale = np.float32(1.0 / math.sqrt(q.shape[-1]))
  b, t, h, d = q.shape
  m = jnp.full((b, h, t), -jnp.inf, jnp.float32)
  den = jnp.zeros((b, h, t), jnp.float32)
  acc = jnp.zeros((b, h, t, d), jnp.float32)
  rows = jnp.arange(t)[:, None]
  for j in range(0, t, block):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k[:, j:j + block],
                   precision=HI) * scale
    cols = j + jnp.arange(s.shape[-1])[None, :]
    s = jnp.where(cols <= rows, s, -jnp.inf)
    m_new = jnp.maximum(m, s.max(-1))
    corr = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[..., None])
    den = den * corr + p.sum(-1)
    acc = acc * corr[..., None] + jnp.einsum(
        "bhqk,bkhd->bhqd", part(p), v[:, j:j + block], precision=HI)
    m = m_new
  return (acc / den[..., None]).transpose(0, 2, 1, 3)


def causal_attention_ref(q, k, v):
  """Float64 causal attention."""
  t = q.shape[1]
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
  s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
  return np.einsum("bhqk,bkhd->bqhd", softmax64(s), v)


def kernel_attention_causal(rng, dtype):
  """Causal, T=131, D=48; q with a few loud heads' dims, v ramped."""
  shape = (1, 131, 2, 48)
  q = rng.standard_normal(shape)
  q[..., rng.choice(48, 3, replace=False)] *= 4.0
  k = rng.uniform(-1.5, 1.5, shape)
  v = np.linspace(-1.0, 1.0, 131)[None, :, None, None] + 0.3 * (
      rng.standard_normal(shape))
  wrong = (("mask filled with 0",
            functools.partial(causal_attention, fill=0.0)),)
  return Kernel("attention_causal", "attention", shape[1],
                cast((q, k, v), dtype), causal_attention,
                causal_attention_ref, causal_attention_flash, tf32=True,
                wrong=wrong)


# matmul with a very long reduction and small-magnitude A.


def mm_nn_pairs(a, b, part=_ident):
  """A @ B as the sum of even-K and odd-K halves."""
  even = part(jnp.matmul(a[:, 0::2], b[0::2], precision=HI))
  odd = part(jnp.matmul(a[:, 1::2], b[1::2], precision=HI))
  return even + odd


def kernel_matmul_long(rng, dtype):
  """Uniform A near 1e-3 with a positive bias; prime K=4099."""
  m, k, n = 17, 4099, 89
  a = 1e-3 * (rng.uniform(-1.0, 1.0, (m, k)) + 0.2)
  b = rng.laplace(0.0, 1.0, (k, n))
  return Kernel("matmul_long", "dot_general", k, cast((a, b), dtype),
                mm_nn, lambda a, b: a @ b, mm_nn_pairs, tf32=True)


KERNELS = (kernel_matmul_nn, kernel_matmul_tn, kernel_matmul_bmm,
           kernel_matmul_tiny, kernel_matmul_long, kernel_conv_nhwc,
           kernel_conv_nchw, kernel_softmax, kernel_layer_norm,
           kernel_rms_norm, kernel_gelu, kernel_silu, kernel_swiglu,
           kernel_attention, kernel_attention_causal)


# ---------------------------------------------------------------- bases
# A base returns (output, detail) or None where it does not apply.


def tf32_round(x, mode):
  """Rounds float32 to TF32 (10 mantissa bits), 'rne' or 'rtz'."""
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  if mode == "rne":
    bits = bits + jnp.uint32(0xFFF) + ((bits >> 13) & jnp.uint32(1))
  bits = bits & jnp.uint32(0xFFFFE000)
  return lax.bitcast_convert_type(bits, jnp.float32)


def base_exact(kern, g, dtype, rng):
  """The golden output itself (a carrier for faults)."""
  return g.copy(), "t = g"


def to_bf16(x):
  """Rounds a float32 partial result to bf16 (and back to float32)."""
  return x.astype(jnp.bfloat16).astype(jnp.float32)


def base_reordered(kern, g, dtype, rng):
  """The same math with another summation order, at the case dtype.

  In bfloat16 the reorder's partial results (split-K partials, the
  probabilities fed to the second matmul, a normalized activation before
  its affine) are rounded to bf16, as a bf16 kernel that keeps its blocks
  in the case dtype does; in float32 they stay float32.
  """
  part = to_bf16 if dtype == BF16 else _ident
  out = compiled(kern.reorder, dtype, part=part)(*kern.inputs)
  note = " (bf16 partials)" if dtype == BF16 else ""
  return out, kern.reorder.__name__ + note


def _base_tf32(kern, dtype, mode):
  """TF32-rounded matmul operands, products at float32 HIGHEST."""
  if dtype != F32 or not kern.tf32:
    return None
  rnd = functools.partial(tf32_round, mode=mode)
  out = compiled(kern.math, dtype, rnd=rnd)(*kern.inputs)
  return out, f"operands to tf32 ({mode})"


def base_tf32_rne(kern, g, dtype, rng):
  """Operands rounded to TF32 to nearest-even."""
  return _base_tf32(kern, dtype, "rne")


def base_tf32_rtz(kern, g, dtype, rng):
  """Operands rounded to TF32 toward zero."""
  return _base_tf32(kern, dtype, "rtz")


def base_bf16_out(kern, g, dtype, rng):
  """Golden output rounded to bf16 (RNE or RTZ), stored as float32."""
  if dtype != F32 or not kern.bf16_out:
    return None
  if rng.random() < 0.5:
    return g.astype(BF16).astype(F32), "output to bf16 (rne)"
  bits = g.view(np.uint32) & np.uint32(0xFFFF0000)
  return bits.view(F32), "output to bf16 (rtz)"


def base_fp16_compute(kern, g, dtype, rng):
  """The op in float16 inputs and math, output cast to float32."""
  if dtype != F32 or kern.fp16 is None:
    return None
  return kern.fp16(*kern.inputs), kern.fp16.__name__


BASES = {
    "exact": (base_exact, None),
    "reordered": (base_reordered, "reordering"),
    "tf32_rne": (base_tf32_rne, "precision:tf32"),
    "tf32_rtz": (base_tf32_rtz, "precision:tf32"),
    "bf16_out": (base_bf16_out, "precision:bf16"),
    "fp16_compute": (base_fp16_compute, "precision:fp16"),
}


# ---------------------------------------------------------------- faults
# A fault takes the base output `t` and returns a list of (output, detail).


def bit_layout(dtype):
  """(unsigned view type, candidate bits: exponent and high mantissa)."""
  if dtype.itemsize == 4:
    return np.uint32, list(range(23, 31)) + list(range(17, 23))
  return np.uint16, list(range(7, 15)) + list(range(4, 7))


def as2d(a):
  """A 2-D view [rows, last axis] of a contiguous array."""
  return a.reshape(-1, a.shape[-1])


def where_str(a, flat):
  """The multi-index of a flat position, as text."""
  return str(tuple(int(i) for i in np.unravel_index(flat, a.shape)))


def live_positions(t, rng, n):
  """n distinct flat positions of finite, nonzero elements."""
  flat = t.reshape(-1).astype(F32)
  ok = np.flatnonzero(np.isfinite(flat) & (flat != 0))
  return rng.choice(ok, min(n, ok.size), replace=False)


def flip_finite(t, pos, nbits, rng):
  """Flips nbits random candidate bits at flat `pos`, result finite.

  Args:
    t: the array, changed in place.
    pos: the flat position.
    nbits: how many distinct bits to flip.
    rng: the generator.

  Returns:
    The flipped bit positions, or None if no finite choice was found.
  """
  utype, cands = bit_layout(t.dtype)
  u = t.reshape(-1).view(utype)
  for _ in range(30):
    bits = rng.choice(cands, nbits, replace=False)
    mask = utype(sum(1 << int(b) for b in bits))
    new = np.array([u[pos] ^ mask], utype).view(t.dtype)
    if np.isfinite(new.astype(F32)).all():
      u[pos] ^= mask
      return sorted(int(b) for b in bits)
  return None


def _flips(t, rng, count, most):
  """Copies t with `count` elements flipped in 1..`most` bits each."""
  out = t.copy()
  notes = []
  low = 1 if most == 1 else 2
  for pos in live_positions(out, rng, count):
    bits = flip_finite(out, pos, int(rng.integers(low, most + 1)), rng)
    if bits is not None:
      notes.append(f"{where_str(t, pos)} b{bits}")
  return [(out, "flip " + "; ".join(notes))]


def fault_bitflip_single(kern, t, g, rng):
  """1-3 elements with one flipped exponent or high-mantissa bit."""
  return _flips(t, rng, int(rng.integers(1, 4)), 1)


def fault_bitflip_multi(kern, t, g, rng):
  """4-6 elements with 2-3 flipped bits each."""
  return _flips(t, rng, int(rng.integers(4, 7)), 3)


def fault_stuck_at(kern, t, g, rng):
  """One bit forced to 1 in every element of a row or a column."""
  utype, cands = bit_layout(t.dtype)
  for _ in range(30):
    out = t.copy()
    view = as2d(out)
    axis = "row" if rng.random() < 0.5 else "col"
    index = int(rng.integers(view.shape[0 if axis == "row" else 1]))
    line = view[index] if axis == "row" else view[:, index]
    bit = int(rng.choice(cands))
    before = np.ascontiguousarray(line).view(utype)
    forced = (before | utype(1 << bit)).view(t.dtype)
    changed = np.mean(forced.view(utype) != before)
    if changed < 0.25 or not np.isfinite(forced.astype(F32)).all():
      continue
    if axis == "row":
      view[index] = forced
    else:
      view[:, index] = forced
    return [(out, f"bit {bit} stuck at 1 in {axis} {index}")]
  return []


def fault_random_value(kern, t, g, rng):
  """2-4 elements replaced by random values of the output's scale."""
  out = t.copy()
  flat = out.reshape(-1)
  g32 = g.astype(F32)
  scale = float(np.max(np.abs(g32[np.isfinite(g32)])))
  pos = rng.choice(flat.size, int(rng.integers(2, 5)), replace=False)
  flat[pos] = rng.uniform(-scale, scale, pos.size).astype(t.dtype)
  where = ", ".join(where_str(t, p) for p in pos)
  return [(out, f"random at {where}")]


def fault_zero(kern, t, g, rng):
  """A zeroed row, or a zeroed aligned 16x16 tile."""
  out = t.copy()
  view = as2d(out)
  rows, cols = view.shape
  if rng.random() < 0.5 and rows >= 16 and cols >= 16:
    i = 16 * int(rng.integers(rows // 16))
    j = 16 * int(rng.integers(cols // 16))
    view[i:i + 16, j:j + 16] = 0
    return [(out, f"zero tile rows {i}:{i + 16} cols {j}:{j + 16}")]
  live = np.flatnonzero(np.any(view.astype(F32) != 0, axis=1))
  row = int(rng.choice(live))
  view[row] = 0
  return [(out, f"zero row {row}")]


def fault_indexing(kern, t, g, rng):
  """A row rolled by a few positions, or two rows swapped."""
  out = t.copy()
  view = as2d(out)
  if rng.random() < 0.5:
    row = int(rng.integers(view.shape[0]))
    shift = int(rng.integers(1, 6))
    view[row] = np.roll(view[row].copy(), shift)
    return [(out, f"row {row} rolled by {shift}")]
  i, j = (int(v) for v in rng.choice(view.shape[0], 2, replace=False))
  view[[i, j]] = view[[j, i]]
  return [(out, f"rows {i} and {j} swapped")]


def fault_scale(kern, t, g, rng):
  """The whole output times a constant far from 1."""
  c = float(rng.choice([0.5, 1.25, 3.0, 0.7, 1.6]))
  return [((t.astype(F32) * np.float32(c)).astype(t.dtype), f"x {c}")]


def fault_nan(kern, t, g, rng):
  """NaN written into 1-3 elements."""
  out = t.copy()
  flat = out.reshape(-1)
  pos = rng.choice(flat.size, int(rng.integers(1, 4)), replace=False)
  flat[pos] = np.nan
  return [(out, "nan at " + ", ".join(where_str(t, p) for p in pos))]


def fault_lane(kern, t, g, rng):
  """Every 32nd column (or flat position) corrupted."""
  out = t.copy()
  lane = int(rng.integers(32))
  if out.shape[-1] >= 64:
    mask = np.zeros(out.shape, bool)
    mask[..., lane::32] = True
    where = f"columns = {lane} mod 32"
  else:
    mask = (np.arange(out.size) % 32 == lane).reshape(out.shape)
    where = f"flat index = {lane} mod 32"
  vals = out[mask].astype(F32)
  if rng.random() < 0.5:
    noise = 1.0 + rng.uniform(0.02, 0.2, vals.size) * rng.choice(
        [-1.0, 1.0], vals.size)
    out[mask] = (vals * noise).astype(t.dtype)
    how = "scaled by 1 +- 2..20%"
  else:
    scale = float(np.max(np.abs(vals))) or 1.0
    out[mask] = rng.uniform(-scale, scale, vals.size).astype(t.dtype)
    how = "random values"
  return [(out, f"{where}, {how}")]


def fault_wrong_formula(kern, t, g, rng):
  """Another closed form or constant of the same function."""
  dtype = t.dtype
  return [(compiled(fn, dtype)(*kern.inputs), detail)
          for detail, fn in kern.wrong]


def fault_ftz(kern, t, g, rng):
  """Outputs below 1e-30 in magnitude flushed to (signed) zero."""
  t32 = t.astype(F32)
  tiny = (np.abs(t32) < FTZ_LIMIT) & (t32 != 0)
  out = t.copy()
  out[tiny] = np.copysign(np.zeros(int(tiny.sum()), F32),
                          t32[tiny]).astype(t.dtype)
  return [(out, f"{int(tiny.sum())} outputs below {FTZ_LIMIT:g} flushed")]


@dataclasses.dataclass(frozen=True)
class Fault:
  """A fault recipe, its expected model and the bases it applies to."""
  name: str
  fn: Callable
  expected: str
  bases: Optional[tuple] = None


FAULTS = (
    Fault("bitflip_1", fault_bitflip_single, "bitflip"),
    Fault("bitflip_multi", fault_bitflip_multi, "bitflip"),
    Fault("stuck_at", fault_stuck_at, "stuck_at"),
    Fault("random_value", fault_random_value, "random_value"),
    Fault("zero", fault_zero, "zero"),
    Fault("indexing", fault_indexing, "indexing"),
    Fault("scale", fault_scale, "scale"),
    Fault("nan", fault_nan, "nan"),
    Fault("lane", fault_lane, "lane"),
    Fault("wrong_formula", fault_wrong_formula, "approximation|parameter",
          bases=("exact",)),
    Fault("ftz", fault_ftz, "ftz"),
)


# ---------------------------------------------------------------- scoring


def family(model):
  """The model's family: the part before ':'."""
  return str(model).split(":")[0]


def name_ok(expected, predicted):
  """Whether the predicted model names the expected one (top-1)."""
  for exp in expected.split("|"):
    if exp == "reordering" and predicted in ("reordering", "exact"):
      return True
    if exp.startswith("precision:"):
      if predicted == exp:
        return True
    elif family(predicted) == exp:
      return True
  return False


def verdict_ok(expected, verdict):
  """Whether the verdict is the one the expected model calls for."""
  if expected == "reordering":
    return verdict == "pass"
  if expected.startswith("precision:"):
    return verdict in ("pass", "warn")
  if expected == "ftz":
    return verdict in ("warn", "fail")
  return verdict == "fail"


def diagnose(t, g, r, kern, context):
  """Analyzes and detects one case, as an outside user would."""
  sig = peat.analyze(t, g, reference=r)
  if context == "kernel":
    return peat.detect(sig, context={"kernel": kern.site,
                                     "reduction": kern.reduction})
  return peat.detect(sig)


def make_record(kern, dtype_name, base, fault, detail, expected):
  """A record for one case, before its diagnosis."""
  return {"kernel": kern.name, "dtype": dtype_name, "base": base,
          "fault": fault, "detail": detail, "expected": expected,
          "predicted": None, "verdict": None, "secondary": None,
          "evidence": "", "params": {}}


def jsonable(value):
  """A JSON-friendly copy of a diagnosis parameter."""
  if isinstance(value, dict) or hasattr(value, "items"):
    return {str(k): jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [jsonable(v) for v in value]
  if isinstance(value, (np.generic, np.ndarray)):
    return jsonable(np.asarray(value).tolist())
  if isinstance(value, (str, int, float, bool)) or value is None:
    return value
  return str(value)


def fill(record, diag):
  """Copies a diagnosis into a record and scores it."""
  sec = getattr(diag, "secondary", None)
  params = getattr(diag, "params", None) or {}
  record.update(
      predicted=str(diag.model), verdict=str(diag.verdict),
      secondary=None if sec is None else str(getattr(sec, "model", sec)),
      evidence=str(getattr(diag, "evidence", "")),
      params=jsonable(params))
  score(record)


def fail_record(record, exc):
  """Marks a record whose case raised."""
  record.update(predicted=f"error: {type(exc).__name__}", verdict="error",
                evidence=str(exc))
  score(record)


def score(record):
  """Sets name_ok and verdict_ok on a record."""
  exp = record["expected"]
  record["name_ok"] = name_ok(exp, record["predicted"])
  record["verdict_ok"] = verdict_ok(exp, record["verdict"])


# ---------------------------------------------------------------- running


def identical(a, b):
  """Whether two arrays of one dtype are bitwise identical."""
  utype = UINT[a.dtype.itemsize]
  return a.dtype == b.dtype and np.array_equal(a.view(utype),
                                               b.view(utype))


def run_case(record, t, g, r, kern, context):
  """Diagnoses one output into its record; an exception is recorded."""
  try:
    fill(record, diagnose(t, g, r, kern, context))
  except Exception as exc:  # pylint: disable=broad-except
    fail_record(record, exc)
  return record


def run_faults(kern, dtype_name, base, t, g, r, seeds, context):
  """All faults on top of one base output."""
  records = []
  for fi, fault in enumerate(FAULTS):
    if fault.bases is not None and base not in fault.bases:
      continue
    rng = np.random.default_rng(seeds + [fi])
    try:
      outputs = fault.fn(kern, t, g, rng)
    except Exception as exc:  # pylint: disable=broad-except
      rec = make_record(kern, dtype_name, base, fault.name, "",
                        fault.expected)
      fail_record(rec, exc)
      records.append(rec)
      continue
    for out, detail in outputs:
      if identical(out, t):
        continue
      rec = make_record(kern, dtype_name, base, fault.name, detail,
                        fault.expected)
      records.append(run_case(rec, out, g, r, kern, context))
  return records


def run_base(kern, dtype_name, base, g, r, seeds, context):
  """One base alone (unless exact) and every fault on top of it."""
  fn, expected = BASES[base]
  dtype = DTYPES[dtype_name]
  try:
    made = fn(kern, g, dtype, np.random.default_rng(seeds))
  except Exception as exc:  # pylint: disable=broad-except
    rec = make_record(kern, dtype_name, base, "", "", expected or "exact")
    fail_record(rec, exc)
    return [rec]
  if made is None:
    return []
  t, detail = made
  records = []
  if expected is not None:
    rec = make_record(kern, dtype_name, base, "", detail, expected)
    records.append(run_case(rec, t, g, r, kern, context))
  return records + run_faults(kern, dtype_name, base, t, g, r,
                              seeds, context)


def run_kernel(ki, build, di, dtype_name, args):
  """Every base and fault of one kernel at one dtype."""
  dtype = DTYPES[dtype_name]
  kern = build(np.random.default_rng([args.seed, ki, di]), dtype)
  g = compiled(kern.math, dtype)(*kern.inputs)
  r = np.asarray(kern.ref(*[x.astype(np.float64) for x in kern.inputs]),
                 np.float64)
  records = []
  for bi, base in enumerate(BASES):
    seeds = [args.seed, ki, di, bi]
    records += run_base(kern, dtype_name, base, g, r, seeds, args.context)
  return records


# ---------------------------------------------------------------- report


def pct(num, den):
  """A percentage as text."""
  return f"{100.0 * num / den:.1f}%" if den else "-"


def is_fault(rec):
  """Whether a record carries a fault (not a base alone)."""
  return bool(rec["fault"])


def totals_table(records):
  """The Markdown totals table."""
  n = len(records)
  names = sum(r["name_ok"] for r in records)
  verdicts = sum(r["verdict_ok"] for r in records)
  bases = [r for r in records if not is_fault(r)]
  faults = [r for r in records if is_fault(r)]
  alarms = sum(r["verdict"] == "fail" for r in bases)
  misses = sum(r["verdict"] == "pass" for r in faults)
  return "\n".join([
      "| records | name top-1 | verdict | false alarms | misses |",
      "| --- | --- | --- | --- | --- |",
      f"| {n} | {names} ({pct(names, n)}) | {verdicts} "
      f"({pct(verdicts, n)}) | {alarms}/{len(bases)} | "
      f"{misses}/{len(faults)} |"])


def group_table(records, title, key):
  """A Markdown table of accuracy grouped by `key`."""
  groups = collections.OrderedDict()
  for rec in records:
    groups.setdefault(key(rec), []).append(rec)
  lines = [f"| {title} | cases | name top-1 | verdict |",
           "| --- | --- | --- | --- |"]
  for name, recs in groups.items():
    n = len(recs)
    lines.append(f"| {name} | {n} | "
                 f"{pct(sum(r['name_ok'] for r in recs), n)} | "
                 f"{pct(sum(r['verdict_ok'] for r in recs), n)} |")
  return "\n".join(lines)


def wrong_lines(records):
  """One line per record with a wrong name or verdict."""
  lines = []
  for r in records:
    if r["name_ok"] and r["verdict_ok"]:
      continue
    ev = " ".join(r["evidence"].split())[:120]
    lines.append(
        f"- {r['kernel']} {r['dtype']} {r['base']}+{r['fault'] or '-'} "
        f"[{r['detail']}]: expected {r['expected']}, got "
        f"{r['predicted']}/{r['verdict']} (2nd {r['secondary']}): {ev}")
  return lines


def print_report(records, quiet):
  """Prints the totals, the grouped tables and the wrong records."""
  print("\n## Totals\n")
  print(totals_table(records))
  tables = (("fault", lambda r: r["fault"] or "(base alone)"),
            ("base", lambda r: r["base"]),
            ("dtype", lambda r: r["dtype"]),
            ("kernel", lambda r: r["kernel"]))
  for title, key in tables:
    print(f"\n## By {title}\n")
    print(group_table(records, title, key))
  if quiet:
    return
  wrong = wrong_lines(records)
  print(f"\n## Wrong records ({len(wrong)})\n")
  print("\n".join(wrong) if wrong else "(none)")


def git_commit():
  """HEAD's commit, with '+dirty' when the work tree has changes."""
  root = Path(__file__).resolve().parents[1]
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root,
                          capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root,
                           capture_output=True, text=True,
                           check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("+dirty" if dirty else "")


def parse_args(argv):
  """The command line."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seed", type=int, default=0,
                      help="seed every input and fault derives from")
  parser.add_argument("--context", choices=("none", "kernel"),
                      default="none",
                      help="none: detect(sig); kernel: pass the site kind "
                      "and reduction length as context")
  parser.add_argument("--dtypes", default="float32,bfloat16",
                      help="comma-separated case dtypes")
  parser.add_argument("--json", default=None,
                      help="write all records and the commit here")
  parser.add_argument("--quiet", action="store_true",
                      help="no progress lines and no wrong-record list")
  args = parser.parse_args(argv)
  args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
  for name in args.dtypes:
    if name not in DTYPES:
      parser.error(f"unknown dtype {name!r}; use {sorted(DTYPES)}")
  return args


def main(argv=None):
  """Runs every case and prints the report."""
  args = parse_args(argv)
  start = time.time()
  commit = git_commit()
  print(f"commit {commit}")
  print(f"options seed={args.seed} context={args.context} "
        f"dtypes={','.join(args.dtypes)}")
  records = []
  for ki, build in enumerate(KERNELS):
    for di, dtype_name in enumerate(args.dtypes):
      records += run_kernel(ki, build, di, dtype_name, args)
      if not args.quiet:
        print(f"  {build.__name__[7:]} {dtype_name}: {len(records)} "
              f"records, {time.time() - start:.0f}s", file=sys.stderr)
  print_report(records, args.quiet)
  elapsed = time.time() - start
  print(f"\n{len(records)} records in {elapsed:.0f}s")
  if args.json:
    payload = {"commit": commit, "options": {
        "seed": args.seed, "context": args.context,
        "dtypes": args.dtypes}, "seconds": elapsed, "records": records}
    Path(args.json).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
  main()
