"""Detector classes: an outside judge of the error model and verdict per class.

Each class below is a kind of KUT a user meets (a flush-to-zero kernel, a
softmax that stores bf16, a TF32 matmul with a fault on top, torch's own
layer norm, ...). For each class the benchmark builds ``--variants``
independent variants (seeded shapes, input distributions, roundings),
computes the KUT output ``t``, the golden output ``g`` (plain
jax.numpy/jax.nn/lax at the stated dtype, jitted) and a float64 NumPy
reference ``r`` of the same math on the inputs as given to the golden
kernel, then asks the public API for a diagnosis::

  peat.detect(peat.analyze(t, g, reference=r))

and compares its ``.model`` and ``.verdict`` with the expected name and
verdict fixed in ``CLASSES``. It is written apart from the Detector (only
``peat.analyze`` and ``peat.detect`` are used), so that it judges it
rather than mirrors it.

Prints the commit and options, a Markdown table (one row per class: the
expected name and verdict, how many variants got each right, the most
common (name, verdict) pairs observed, notes), then one line per wrong
variant.

Run::

  .venv/bin/python benchmarks/detector_classes.py [--variants=4] [--seed=0] \
      [--context=none|kernel] [--classes=ftz_tiny,random_values] \
      [--json=PATH]

``--context=kernel`` passes ``context={"kernel": <site kind>, "reduction":
<K, D or None>}`` to ``peat.detect``, as a site of a real model would;
the default calls it with no context, as an outside user does.
``tf32_base_faults`` cycles through five faults by variant index: the
default 4 variants leave out the last (a rolled row); ``--variants=10``
gives every fault with both roundings.

Note: XLA on CPU flushes subnormal results and inputs to zero, so there the
golden kernel of ``ftz_tiny`` flushes them too; the header says whether the
golden kernel keeps them, and the notes column counts variants whose KUT
output equals the golden output bit for bit (``t==g``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import time
import traceback
from typing import Callable

import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import peat_jax as peat

F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
#: The unsigned integer type of the same width, for bit manipulation.
_UINT = {F32: np.uint32, BF16: np.uint16, F16: np.uint16}
#: The smallest normal float32.
FLT_MIN = float(np.finfo(np.float32).tiny)
DISTS = ("normal", "student_t", "lognormal_rows", "post_relu", "outliers")
#: Kept explicit mantissa bits of float32 operands rounded to TF32 / bf16.
TF32_BITS, BF16_BITS = 10, 7
_CONV_DIMS = ("NHWC", "HWIO", "NHWC")


@dataclasses.dataclass
class Case:
  """One variant of a class: its arrays and what a diagnosis should say.

  Attributes:
    desc: a short description of the variant (shapes, distribution, ...).
    t: the KUT output.
    g: the golden output (same shape and dtype as ``t``).
    r: the float64 reference of the same math.
    kernel: the site kind passed with ``--context=kernel``.
    reduction: the reduction length passed with ``--context=kernel``.
    expected: the accepted error-model names.
  """
  desc: str
  t: np.ndarray
  g: np.ndarray
  r: np.ndarray
  kernel: str
  reduction: int | None
  expected: tuple[str, ...]


# --------------------------------------------------------------------------
# Bit manipulation (NumPy views).


def _bits(x: np.ndarray) -> np.ndarray:
  """A contiguous copy of ``x`` viewed as unsigned integers.

  Args:
    x: a float32, bfloat16 or float16 array.

  Returns:
    The copy's bits, as uint32 (float32) or uint16 (bf16, float16).
  """
  x = np.array(x, copy=True, order="C")
  return x.view(_UINT[x.dtype])


def round_mantissa(x: np.ndarray, keep: int, mode: str) -> np.ndarray:
  """Rounds float32 values to ``keep`` explicit mantissa bits.

  Non-finite values are left as they are; a value that rounds past the
  largest float32 becomes inf, as in IEEE arithmetic.

  Args:
    x: a float32 array.
    keep: mantissa bits kept (TF32: 10, bf16: 7).
    mode: ``"nearest"`` (to nearest, ties to even) or ``"trunc"`` (toward
      zero: the low bits cleared).

  Returns:
    A float32 array of the rounded values.
  """
  x = np.asarray(x, np.float32)
  u = _bits(x)
  drop = 23 - keep
  low = np.uint32((1 << drop) - 1)
  if mode == "trunc":
    v = u & ~low
  elif mode == "nearest":
    lsb = (u >> np.uint32(drop)) & np.uint32(1)
    v = (u + np.uint32((1 << (drop - 1)) - 1) + lsb) & ~low
  else:
    raise ValueError(f"unknown rounding mode {mode!r}")
  return np.where(np.isfinite(x), v, u).astype(np.uint32).view(np.float32)


def flip_bits(x: np.ndarray, index: np.ndarray,
              bits: list[list[int]]) -> np.ndarray:
  """Flips chosen bits of chosen elements.

  Args:
    x: a float32, bfloat16 or float16 array.
    index: flat indices of the elements to change.
    bits: for each index, the bit positions to flip (0 = lowest).

  Returns:
    A copy of ``x`` with the bits flipped.
  """
  u = _bits(x)
  flat = u.reshape(-1)
  for i, bs in zip(index, bits):
    for b in bs:
      flat[i] ^= flat.dtype.type(1 << b)
  return u.view(np.asarray(x).dtype)


def force_bit(x: np.ndarray, bit: int, value: int,
              where: np.ndarray | None = None) -> np.ndarray:
  """Forces one bit to 1 (stuck-at-1) or 0 (stuck-at-0).

  Args:
    x: a float32, bfloat16 or float16 array.
    bit: the bit position (0 = lowest).
    value: 1 or 0.
    where: a boolean mask of the elements concerned (default: all); only
      those whose bit differs change.

  Returns:
    A copy of ``x`` with the bit forced.
  """
  u = _bits(x)
  one = u.dtype.type(1 << bit)
  forced = (u | one) if value else (u & ~one)
  if where is not None:
    forced = np.where(where, forced, u).astype(u.dtype)
  return forced.view(np.asarray(x).dtype)


# --------------------------------------------------------------------------
# Inputs.


def draw(rng: np.random.Generator, shape: tuple[int, ...],
         dist: str) -> np.ndarray:
  """Draws a float32 input of one of the distributions in ``DISTS``.

  Args:
    rng: the random generator.
    shape: the array shape; "rows" are all but the last axis, "channels"
      the last axis.
    dist: ``normal``, ``student_t`` (df 4), ``lognormal_rows`` (normal
      times a lognormal scale per row), ``post_relu`` (max(normal, 0)) or
      ``outliers`` (normal with 2-4 channels times 20-100).

  Returns:
    A float32 array.
  """
  if dist == "normal":
    x = rng.standard_normal(shape)
  elif dist == "student_t":
    x = rng.standard_t(4, shape)
  elif dist == "lognormal_rows":
    x = rng.standard_normal(shape) * np.exp(
        rng.normal(0.0, 1.0, shape[:-1] + (1,)))
  elif dist == "post_relu":
    x = np.maximum(rng.standard_normal(shape), 0.0)
  elif dist == "outliers":
    x = rng.standard_normal(shape)
    cols = rng.choice(shape[-1], size=min(shape[-1], rng.integers(2, 5)),
                      replace=False)
    x[..., cols] *= rng.uniform(20.0, 100.0, size=len(cols))
  else:
    raise ValueError(f"unknown distribution {dist!r}")
  return x.astype(np.float32)


def _dist(rng: np.random.Generator) -> str:
  """Picks an input distribution.

  Args:
    rng: the random generator.

  Returns:
    One of ``DISTS``.
  """
  return DISTS[rng.integers(len(DISTS))]


def _rows_cols(rng: np.random.Generator, rows: tuple[int, int],
               cols: tuple[int, int], cap: int = 100_000) -> tuple[int, int]:
  """Draws a 2-D shape within bounds and at most ``cap`` elements.

  Args:
    rng: the random generator.
    rows: the inclusive bounds of the first axis.
    cols: the inclusive bounds of the last axis.
    cap: the most elements.

  Returns:
    (rows, cols).
  """
  c = int(rng.integers(cols[0], cols[1] + 1))
  hi = max(rows[0], min(rows[1], cap // c))
  return int(rng.integers(rows[0], hi + 1)), c


def _f64(x: np.ndarray) -> np.ndarray:
  """Upcasts an array (any float dtype) to float64.

  Args:
    x: the array.

  Returns:
    A float64 NumPy array.
  """
  return np.asarray(x).astype(np.float64)


def _rms(x: np.ndarray) -> float:
  """The root mean square of the finite values of an array.

  Args:
    x: the array.

  Returns:
    The RMS, in float64.
  """
  x = _f64(x)
  x = x[np.isfinite(x)]
  return float(np.sqrt(np.mean(np.square(x)))) if x.size else 1.0


# --------------------------------------------------------------------------
# Golden kernels (jitted once per shape and dtype) and float64 references.


@jax.jit
def _matmul(a, b):
  """Golden matmul at the operands' dtype.

  Args:
    a: [M, K].
    b: [K, N].

  Returns:
    [M, N] in the operands' dtype.
  """
  return jnp.matmul(a, b)


@jax.jit
def _matmul_highest(a, b):
  """A float32 matmul at precision HIGHEST (the TF32 KUTs' arithmetic).

  Args:
    a: [M, K] float32.
    b: [K, N] float32.

  Returns:
    [M, N] float32.
  """
  return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


@jax.jit
def _conv(x, w):
  """Golden 2-D convolution, NHWC/HWIO, stride 1, SAME padding.

  Args:
    x: [N, H, W, Cin].
    w: [KH, KW, Cin, Cout].

  Returns:
    [N, H, W, Cout].
  """
  return lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                  dimension_numbers=_CONV_DIMS)


@jax.jit
def _softmax(x):
  """Golden softmax over the last axis, at the input's dtype.

  Args:
    x: the logits.

  Returns:
    The probabilities, same dtype.
  """
  return jax.nn.softmax(x, axis=-1)


@jax.jit
def _gelu_erf(x):
  """GELU, erf form, at the input's dtype.

  Args:
    x: the input.

  Returns:
    gelu(x), same dtype.
  """
  return jax.nn.gelu(x, approximate=False)


def _ln_f32(x, w, b, eps):
  """Layer norm over the last axis in float32 arithmetic.

  Args:
    x: [..., D] float32.
    w: [D] float32 scale.
    b: [D] float32 shift.
    eps: the variance epsilon.

  Returns:
    (x - mean) * rsqrt(var + eps) * w + b, float32.
  """
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * lax.rsqrt(var + eps) * w + b


@functools.partial(jax.jit, static_argnames="eps")
def _layer_norm(x, w, b, eps):
  """Golden layer norm: float32 math, rounded to the input dtype.

  Args:
    x: [..., D].
    w: [D].
    b: [D].
    eps: the variance epsilon.

  Returns:
    The normalized array, in x's dtype.
  """
  f = jnp.float32
  return _ln_f32(x.astype(f), w.astype(f), b.astype(f), eps).astype(x.dtype)


@functools.partial(jax.jit, static_argnames="eps")
def _layer_norm_grad(x, w, b, dy, eps):
  """Golden layer-norm backward: d sum(y * dy) / dx via jax.grad.

  Args:
    x: [..., D].
    w: [D].
    b: [D].
    dy: the output cotangent, shaped like x.
    eps: the variance epsilon.

  Returns:
    dx in float32 math, rounded to x's dtype.
  """
  f = jnp.float32

  def loss(x32):
    return jnp.sum(_ln_f32(x32, w.astype(f), b.astype(f), eps) * dy.astype(f))

  return jax.grad(loss)(x.astype(f)).astype(x.dtype)


@functools.partial(jax.jit, static_argnames="kind")
def _swiglu(gate, up, kind):
  """SwiGLU-style gating: act(gate) * up in float32, rounded to bf16.

  Args:
    gate: [..., F] bf16.
    up: [..., F] bf16.
    kind: ``silu`` (the golden kernel), ``gelu_tanh`` or ``gelu_erf``.

  Returns:
    act(gate) * up, in gate's dtype.
  """
  g32, u32 = gate.astype(jnp.float32), up.astype(jnp.float32)
  if kind == "silu":
    a = jax.nn.silu(g32)
  else:
    a = jax.nn.gelu(g32, approximate=(kind == "gelu_tanh"))
  return (a * u32).astype(gate.dtype)


def _rotate(x, cos, sin):
  """Half-rotation (Llama / GPT-NeoX) of the last axis.

  Args:
    x: [B, T, H, D] float32.
    cos: [1, T, 1, D/2].
    sin: [1, T, 1, D/2].

  Returns:
    [x1 cos - x2 sin, x2 cos + x1 sin], float32.
  """
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@functools.partial(jax.jit, static_argnames=("theta", "angles"))
def _rope(x, theta, angles):
  """Rotary embedding of a bf16 x, positions 0..T-1.

  Args:
    x: [B, T, H, D] bf16.
    theta: the frequency base.
    angles: ``float32`` (the golden kernel: angles, cos and sin in float32)
      or ``bfloat16`` (positions * inv_freq, cos and sin in bf16; the
      rotation still in float32).

  Returns:
    The rotated x, bf16.
  """
  t, d = x.shape[1], x.shape[3]
  inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  pos = jnp.arange(t, dtype=jnp.float32)
  if angles == "bfloat16":
    ang = pos.astype(jnp.bfloat16)[:, None] * inv.astype(jnp.bfloat16)[None]
  else:
    ang = pos[:, None] * inv[None]
  cos = jnp.cos(ang).astype(jnp.float32)[None, :, None, :]
  sin = jnp.sin(ang).astype(jnp.float32)[None, :, None, :]
  return _rotate(x.astype(jnp.float32), cos, sin).astype(x.dtype)


def _softmax_ref(x: np.ndarray) -> np.ndarray:
  """Float64 softmax over the last axis.

  Args:
    x: the logits, any float dtype.

  Returns:
    float64 probabilities.
  """
  x = _f64(x)
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _gelu_ref(x: np.ndarray) -> np.ndarray:
  """Float64 GELU, erf form.

  Args:
    x: the input, any float dtype.

  Returns:
    float64 0.5 x (1 + erf(x / sqrt 2)).
  """
  x = _f64(x)
  return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)))


def _ln_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray,
            eps: float) -> np.ndarray:
  """Float64 layer norm over the last axis.

  Args:
    x: [..., D].
    w: [D].
    b: [D].
    eps: the variance epsilon.

  Returns:
    float64 (x - mean) / sqrt(var + eps) * w + b.
  """
  x = _f64(x)
  mean = x.mean(axis=-1, keepdims=True)
  var = np.square(x - mean).mean(axis=-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * _f64(w) + _f64(b)


def _ln_grad_ref(x: np.ndarray, w: np.ndarray, dy: np.ndarray,
                 eps: float) -> np.ndarray:
  """Float64 layer-norm backward: d sum(y * dy) / dx.

  Args:
    x: [..., D].
    w: [D].
    dy: the output cotangent, shaped like x.
    eps: the variance epsilon.

  Returns:
    float64 rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = dy w.
  """
  x = _f64(x)
  mean = x.mean(axis=-1, keepdims=True)
  rstd = 1.0 / np.sqrt(np.square(x - mean).mean(axis=-1, keepdims=True) + eps)
  xhat = (x - mean) * rstd
  gw = _f64(dy) * _f64(w)
  return rstd * (gw - gw.mean(axis=-1, keepdims=True)
                 - xhat * (gw * xhat).mean(axis=-1, keepdims=True))


def _conv_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """Float64 2-D convolution, NHWC/HWIO, stride 1, SAME padding (odd KH, KW).

  Args:
    x: [N, H, W, Cin].
    w: [KH, KW, Cin, Cout].

  Returns:
    float64 [N, H, W, Cout].
  """
  x, w = _f64(x), _f64(w)
  kh, kw = w.shape[:2]
  n, h, wd, _ = x.shape
  xp = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
  out = np.zeros((n, h, wd, w.shape[3]))
  for i in range(kh):
    for j in range(kw):
      out += xp[:, i:i + h, j:j + wd, :] @ w[i, j]
  return out


def _rope_ref(x: np.ndarray, theta: float) -> np.ndarray:
  """Float64 rotary embedding (half rotation), positions 0..T-1.

  Args:
    x: [B, T, H, D], any float dtype.
    theta: the frequency base.

  Returns:
    float64 rotated x.
  """
  x = _f64(x)
  t, d = x.shape[1], x.shape[3]
  inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
  ang = np.arange(t)[:, None] * inv[None]
  cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
  x1, x2 = x[..., :d // 2], x[..., d // 2:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _silu_ref(x: np.ndarray) -> np.ndarray:
  """Float64 SiLU.

  Args:
    x: the input, any float dtype.

  Returns:
    float64 x / (1 + exp(-x)).
  """
  x = _f64(x)
  return x / (1.0 + np.exp(-x))


def _np(x) -> np.ndarray:
  """A JAX (or NumPy) array as a NumPy array of the same dtype.

  Args:
    x: the array.

  Returns:
    A writable NumPy copy.
  """
  return np.array(x, copy=True)


# --------------------------------------------------------------------------
# Base operations shared by the fault classes.


def base_op(rng: np.random.Generator, op: str,
            dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, str, int, str]:
  """Builds a golden output and its reference for a matmul, softmax or LN.

  Args:
    rng: the random generator.
    op: ``matmul``, ``softmax`` or ``layer_norm``.
    dtype: float32 or bfloat16 (inputs and output).

  Returns:
    (g, r, site kind, reduction length, description).
  """
  dist = _dist(rng)
  name = "bf16" if dtype == BF16 else "f32"
  if op == "matmul":
    m, k, n = (int(v) for v in rng.integers((32, 64, 32), (129, 513, 129)))
    a = draw(rng, (m, k), dist).astype(dtype)
    b = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(dtype)
    return (_np(_matmul(a, b)), _f64(a) @ _f64(b), "dot_general", k,
            f"{name} matmul {m}x{k}x{n} {dist}")
  if op == "softmax":
    rows, n = _rows_cols(rng, (16, 128), (64, 1000))
    temp = rng.uniform(0.5, 4.0)
    x = (draw(rng, (rows, n), dist) * temp).astype(dtype)
    return (_np(_softmax(x)), _softmax_ref(x), "softmax", n,
            f"{name} softmax {rows}x{n} {dist} T={temp:.2f}")
  if op == "layer_norm":
    rows, d = _rows_cols(rng, (32, 256), (64, 1024))
    eps = float(rng.choice([1e-5, 1e-6]))
    x = draw(rng, (rows, d), dist).astype(dtype)
    w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    b = (0.1 * rng.standard_normal(d)).astype(dtype)
    return (_np(_layer_norm(x, w, b, eps=eps)), _ln_ref(x, w, b, eps),
            "layer_norm", d, f"{name} layer_norm {rows}x{d} {dist} eps={eps}")
  raise ValueError(f"unknown op {op!r}")


# --------------------------------------------------------------------------
# The classes: one generator per class, (rng, variant index) -> Case.


def gen_ftz_tiny(rng: np.random.Generator, i: int) -> Case:
  """Float32 matmul or conv with 1-4 tiny rows; the KUT flushes tiny outputs.

  Args:
    rng: the random generator.
    i: the variant index (even: threshold FLT_MIN, odd: 1e-36; matmul for
      i // 2 even, conv otherwise).

  Returns:
    The Case.
  """
  thr = FLT_MIN if i % 2 == 0 else 1e-36
  lo, hi = (-39.0, -37.0) if i % 2 == 0 else (-38.0, -36.0)
  dist = _dist(rng)
  n_tiny = int(rng.integers(1, 5))
  if (i // 2) % 2 == 0:
    m, k, n = (int(v) for v in rng.integers((32, 64, 32), (129, 513, 129)))
    a = _f64(draw(rng, (m, k), dist))
    b = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    rows = rng.choice(m, size=n_tiny, replace=False)
    out = a @ _f64(b)
    for row in rows:
      a[row] *= 10 ** rng.uniform(lo, hi) / max(_rms(out[row]), 1e-30)
    a = a.astype(np.float32)
    g, r = _np(_matmul(a, b)), _f64(a) @ _f64(b)
    kernel, red = "dot_general", k
    what = f"matmul {m}x{k}x{n}"
  else:
    nb = int(rng.integers(2, 7))
    h, w_, cin = (int(v) for v in rng.integers((8, 8, 4), (17, 17, 17)))
    cout = int(rng.integers(8, 33))
    x = _f64(draw(rng, (nb, h, w_, cin), dist))
    w = (rng.standard_normal((3, 3, cin, cout)) / math.sqrt(9 * cin)).astype(
        np.float32)
    rows = rng.choice(nb, size=min(n_tiny, nb - 1), replace=False)
    out = _conv_ref(x, w)
    for row in rows:
      x[row] *= 10 ** rng.uniform(lo, hi) / max(_rms(out[row]), 1e-30)
    x = x.astype(np.float32)
    g, r = _np(_conv(x, w)), _conv_ref(x, w)
    kernel, red = "conv_general_dilated", 9 * cin
    what = f"conv {nb}x{h}x{w_}x{cin}->{cout} 3x3"
  t = np.where(np.abs(g) < thr, np.copysign(np.float32(0), g), g)
  desc = (f"{what} {dist}, tiny rows {sorted(int(v) for v in rows)}, "
          f"flush |x|<{thr:.3g}")
  return Case(desc, t.astype(np.float32), g, r, kernel, red, ("ftz",))


def gen_softmax_bf16_out(rng: np.random.Generator, i: int) -> Case:
  """Float32 softmax whose KUT stores bf16-rounded values as float32.

  Args:
    rng: the random generator.
    i: the variant index (even: nearest-even, odd: truncation).

  Returns:
    The Case.
  """
  mode = "nearest" if i % 2 == 0 else "trunc"
  g, r, kernel, red, desc = base_op(rng, "softmax", F32)
  t = round_mantissa(g, BF16_BITS, mode)
  return Case(f"{desc}, bf16 {mode}", t, g, r, kernel, red,
              ("precision:bf16",))


def gen_gelu_fp16_io(rng: np.random.Generator, i: int) -> Case:
  """Float32 GELU (erf) whose KUT computes in float16.

  Args:
    rng: the random generator.
    i: the variant index (unused).

  Returns:
    The Case.
  """
  del i
  dist = _dist(rng)
  rows, n = _rows_cols(rng, (16, 256), (64, 512))
  x = draw(rng, (rows, n), dist)
  g = _np(_gelu_erf(x))
  t = _np(_gelu_erf(x.astype(np.float16))).astype(np.float32)
  return Case(f"gelu {rows}x{n} {dist}", t, g, _gelu_ref(x), "gelu", None,
              ("precision:fp16",))


_FAULTS = ("bitflip", "stuck_at", "random_value", "zero", "indexing")


def gen_tf32_base_faults(rng: np.random.Generator, i: int) -> Case:
  """A TF32 matmul KUT with one fault on top (cycling through _FAULTS).

  Args:
    rng: the random generator.
    i: the variant index (fault i % 5; nearest-even for even i, truncation
      for odd i).

  Returns:
    The Case; its expected name is the fault's.
  """
  mode = "nearest" if i % 2 == 0 else "trunc"
  fault = _FAULTS[i % len(_FAULTS)]
  dist = _dist(rng)
  m, n = (int(v) for v in rng.integers(32, 97, size=2))
  k = int(rng.integers(256, 2049))
  a = draw(rng, (m, k), dist)
  b = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
  g, r = _np(_matmul(a, b)), _f64(a) @ _f64(b)
  t = _np(_matmul_highest(round_mantissa(a, TF32_BITS, mode),
                          round_mantissa(b, TF32_BITS, mode)))
  if fault == "bitflip":
    idx = rng.choice(t.size, size=int(rng.integers(1, 4)), replace=False)
    bits = [[int(rng.choice(list(range(20, 31))))] for _ in idx]
    t = flip_bits(t, idx, bits)
    what = f"bits {[b[0] for b in bits]} of {len(idx)} elements"
  elif fault == "stuck_at":
    bit, col = int(rng.choice([21, 24, 25, 26, 27])), int(rng.integers(n))
    where = np.zeros(t.shape, bool)
    where[:, col] = True
    t = force_bit(t, bit, 1, where)
    what = f"bit {bit} stuck at 1 in column {col}"
  elif fault == "random_value":
    idx = rng.choice(t.size, size=3, replace=False)
    t.reshape(-1)[idx] = rng.standard_normal(3) * _rms(g)
    what = "3 elements"
  elif fault == "zero":
    row = int(rng.integers(m))
    t[row] = 0.0
    what = f"row {row}"
  else:
    row, shift = int(rng.integers(m)), int(rng.integers(1, 6))
    t[row] = np.roll(t[row], shift)
    what = f"row {row} rolled by {shift}"
  desc = f"matmul {m}x{k}x{n} {dist}, tf32 {mode} + {fault} ({what})"
  return Case(desc, t, g, r, "dot_general", k, (fault,))


def gen_tf32_trunc_base(rng: np.random.Generator, i: int) -> Case:
  """A float32 matmul KUT on TF32-rounded operands (no fault).

  Args:
    rng: the random generator.
    i: the variant index (even: truncation, odd: nearest-even).

  Returns:
    The Case.
  """
  mode = "trunc" if i % 2 == 0 else "nearest"
  dist = _dist(rng)
  m, n = (int(v) for v in rng.integers(32, 97, size=2))
  k = int(rng.choice([768, 1024, 2048, 4096]))
  a = draw(rng, (m, k), dist)
  b = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
  g, r = _np(_matmul(a, b)), _f64(a) @ _f64(b)
  t = _np(_matmul_highest(round_mantissa(a, TF32_BITS, mode),
                          round_mantissa(b, TF32_BITS, mode)))
  return Case(f"matmul {m}x{k}x{n} {dist}, tf32 {mode}", t, g, r,
              "dot_general", k, ("precision:tf32",))


def gen_rope_bf16_angles(rng: np.random.Generator, i: int) -> Case:
  """A bf16 rotary embedding whose KUT computes angles, cos, sin in bf16.

  Args:
    rng: the random generator.
    i: the variant index (theta 1e4 for even i, 5e5 for odd i).

  Returns:
    The Case.
  """
  theta = (1e4, 5e5)[i % 2]
  dist = _dist(rng)
  b = int(rng.integers(1, 3))
  t_len = int(rng.integers(16, 257))
  d = int(rng.choice([32, 64, 96, 128]))
  h = int(rng.integers(1, max(1, min(8, 100_000 // (b * t_len * d))) + 1))
  x = draw(rng, (b, t_len, h, d), dist).astype(BF16)
  g = _np(_rope(x, theta=theta, angles="float32"))
  t = _np(_rope(x, theta=theta, angles="bfloat16"))
  return Case(f"rope [{b},{t_len},{h},{d}] {dist} theta={theta:g}", t, g,
              _rope_ref(x, theta), "rope", None,
              ("precision:bf16", "approximation"))


def gen_swiglu_gelu_for_silu(rng: np.random.Generator, i: int) -> Case:
  """A bf16 SwiGLU whose KUT uses gelu(gate) in place of silu(gate).

  Args:
    rng: the random generator.
    i: the variant index (even: tanh GELU, odd: erf GELU).

  Returns:
    The Case.
  """
  kind = "gelu_tanh" if i % 2 == 0 else "gelu_erf"
  dist = _dist(rng)
  rows, n = _rows_cols(rng, (64, 256), (128, 512))
  gate = draw(rng, (rows, n), dist).astype(BF16)
  up = draw(rng, (rows, n), _dist(rng)).astype(BF16)
  g = _np(_swiglu(gate, up, kind="silu"))
  t = _np(_swiglu(gate, up, kind=kind))
  return Case(f"swiglu {rows}x{n} {dist}, KUT {kind}", t, g,
              _silu_ref(gate) * _f64(up), "silu", None,
              ("approximation", "parameter"))


def gen_torch_layer_norm(rng: np.random.Generator, i: int) -> Case:
  """torch's layer norm (forward or backward) against the JAX golden.

  Args:
    rng: the random generator.
    i: the variant index (i % 4: f32 forward, f32 backward, bf16 forward,
      bf16 backward).

  Returns:
    The Case.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as tf  # pylint: disable=g-import-not-at-top
  backward = i % 2 == 1
  dtype = BF16 if (i // 2) % 2 == 1 else F32
  tdt = torch.bfloat16 if dtype == BF16 else torch.float32
  dist = _dist(rng)
  rows, d = _rows_cols(rng, (32, 256), (64, 1024))
  eps = float(rng.choice([1e-5, 1e-6]))
  x = draw(rng, (rows, d), dist).astype(dtype)
  w = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
  b = (0.1 * rng.standard_normal(d)).astype(dtype)
  dy = rng.standard_normal((rows, d)).astype(dtype)

  def tt(v):
    return torch.from_numpy(np.asarray(v, np.float32)).to(tdt)

  xt = tt(x).requires_grad_(backward)
  y = tf.layer_norm(xt, (d,), tt(w), tt(b), eps)
  if backward:
    (out,) = torch.autograd.grad(y, xt, tt(dy))
    g = _np(_layer_norm_grad(x, w, b, dy, eps=eps))
    r = _ln_grad_ref(x, w, dy, eps)
  else:
    out = y
    g = _np(_layer_norm(x, w, b, eps=eps))
    r = _ln_ref(x, w, b, eps)
  t = out.detach().float().numpy().astype(dtype)
  name = "bf16" if dtype == BF16 else "f32"
  desc = (f"{name} {'backward' if backward else 'forward'} {rows}x{d} "
          f"{dist} eps={eps}")
  return Case(desc, t, g, r, "layer_norm", d, ("reordering", "exact"))


_OPS = ("matmul", "softmax", "layer_norm")


def gen_bitflip_multi(rng: np.random.Generator, i: int) -> Case:
  """5 elements of a golden output each get 3 bits flipped.

  Args:
    rng: the random generator.
    i: the variant index (op i % 3; bf16 for odd i, float32 otherwise).

  Returns:
    The Case.
  """
  dtype = BF16 if i % 2 else F32
  g, r, kernel, red, desc = base_op(rng, _OPS[i % 3], dtype)
  # High mantissa and exponent bits, never the sign.
  pool = list(range(20, 31)) if dtype == F32 else list(range(4, 15))
  idx = rng.choice(g.size, size=5, replace=False)
  bits = [sorted(int(v) for v in rng.choice(pool, 3, replace=False))
          for _ in idx]
  t = flip_bits(g, idx, bits)
  return Case(f"{desc}, bits {bits}", t, g, r, kernel, red, ("bitflip",))


def gen_random_values(rng: np.random.Generator, i: int) -> Case:
  """3 elements of a golden output replaced by normal values of its RMS.

  Args:
    rng: the random generator.
    i: the variant index (op i % 3; bf16 for odd i, float32 otherwise).

  Returns:
    The Case.
  """
  dtype = BF16 if i % 2 else F32
  g, r, kernel, red, desc = base_op(rng, _OPS[i % 3], dtype)
  t = g.copy()
  idx = rng.choice(g.size, size=3, replace=False)
  t.reshape(-1)[idx] = (rng.standard_normal(3) * _rms(g)).astype(dtype)
  return Case(f"{desc}, 3 values", t, g, r, kernel, red, ("random_value",))


# --------------------------------------------------------------------------
# Expected verdicts and the class table.


def _verdict_in(*ok: str) -> Callable[[str, str], bool]:
  """A verdict rule: the verdict is one of ``ok``, whatever the name.

  Args:
    *ok: the accepted verdicts.

  Returns:
    A function (name, verdict) -> bool.
  """
  return lambda name, verdict: verdict in ok


def _rope_verdict(name: str, verdict: str) -> bool:
  """The rope rule: warn, or fail only where the name is approximation.

  Args:
    name: the predicted error-model name.
    verdict: the predicted verdict.

  Returns:
    Whether the verdict counts as correct.
  """
  return verdict == "warn" or (verdict == "fail" and name == "approximation")


@dataclasses.dataclass(frozen=True)
class ClassSpec:
  """A class: its generator and what is expected of a diagnosis.

  Attributes:
    make: (rng, variant index) -> Case.
    names: the expected name(s), as printed.
    verdicts: the expected verdict(s), as printed.
    verdict_ok: (name, verdict) -> whether the verdict is correct.
  """
  make: Callable[[np.random.Generator, int], Case]
  names: str
  verdicts: str
  verdict_ok: Callable[[str, str], bool]


CLASSES: dict[str, ClassSpec] = {
    "ftz_tiny": ClassSpec(
        gen_ftz_tiny, "ftz", "warn|fail", _verdict_in("warn", "fail")),
    "softmax_bf16_out": ClassSpec(
        gen_softmax_bf16_out, "precision:bf16", "warn", _verdict_in("warn")),
    "gelu_fp16_io": ClassSpec(
        gen_gelu_fp16_io, "precision:fp16", "warn", _verdict_in("warn")),
    "tf32_base_faults": ClassSpec(
        gen_tf32_base_faults, "the fault's", "fail", _verdict_in("fail")),
    "tf32_trunc_base": ClassSpec(
        gen_tf32_trunc_base, "precision:tf32", "warn", _verdict_in("warn")),
    "rope_bf16_angles": ClassSpec(
        gen_rope_bf16_angles, "precision:bf16|approximation",
        "warn (fail: approximation only)", _rope_verdict),
    "swiglu_gelu_for_silu": ClassSpec(
        gen_swiglu_gelu_for_silu, "approximation|parameter", "fail",
        _verdict_in("fail")),
    "torch_layer_norm": ClassSpec(
        gen_torch_layer_norm, "reordering|exact", "pass",
        _verdict_in("pass")),
    "bitflip_multi": ClassSpec(
        gen_bitflip_multi, "bitflip", "fail", _verdict_in("fail")),
    "random_values": ClassSpec(
        gen_random_values, "random_value", "fail", _verdict_in("fail")),
}


# --------------------------------------------------------------------------
# Running and reporting.


def git_commit() -> str:
  """The repository's commit, with ``+dirty`` for uncommitted changes.

  Returns:
    The commit hash (or ``unknown``).
  """
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root,
                           check=True, capture_output=True,
                           text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("+dirty" if dirty else "")


def golden_keeps_subnormals() -> bool:
  """Whether this platform's jitted golden matmul keeps subnormal results.

  Returns:
    True where 1e-39 * 1 comes back nonzero.
  """
  a = np.full((1, 1), 1e-39, np.float32)
  return bool(np.asarray(_matmul(a, np.ones((1, 1), np.float32)))[0, 0] != 0)


def _model_of(obj) -> str | None:
  """The model name of a Diagnosis's ``.secondary`` (any shape, or None).

  Args:
    obj: the secondary object, a string, or None.

  Returns:
    Its model name, or None.
  """
  if obj is None:
    return None
  if isinstance(obj, str):
    return obj
  return getattr(obj, "model", None) or str(obj)


def run_variant(cid: str, spec: ClassSpec, seed: int, ci: int, i: int,
                context: str) -> dict:
  """Builds one variant, diagnoses it and judges the diagnosis.

  An exception (in the variant or in the diagnosis) gives a record whose
  predicted name is ``error: <ExceptionType>``.

  Args:
    cid: the class id.
    spec: the class.
    seed: the global seed.
    ci: the class's position in ``CLASSES`` (seeds its variants).
    i: the variant index.
    context: ``none`` or ``kernel``.

  Returns:
    The record (a JSON-serializable dict).
  """
  rng = np.random.default_rng([seed, ci, i])
  rec = {"class": cid, "variant": f"#{i}", "expected": None,
         "expected_verdict": spec.verdicts, "predicted": None, "verdict": "-",
         "secondary": None, "params": "", "evidence": "", "t_equals_g": None,
         "rounding": None, "seconds": 0.0}
  t0 = time.perf_counter()
  try:
    case = spec.make(rng, i)
    rec.update(variant=f"#{i} {case.desc}", expected=list(case.expected))
    rec["t_equals_g"] = bool(_bits(case.t).tobytes() == _bits(case.g).tobytes())
    sig = peat.analyze(case.t, case.g, reference=case.r)
    if context == "kernel":
      d = peat.detect(sig, context={"kernel": case.kernel,
                                    "reduction": case.reduction})
    else:
      d = peat.detect(sig)
    params = getattr(d, "params", None) or {}
    rec.update(predicted=str(d.model), verdict=str(d.verdict),
               secondary=_model_of(getattr(d, "secondary", None)),
               params=str(dict(params)) if hasattr(params, "keys")
               else str(params),
               evidence=str(getattr(d, "evidence", "")))
    if hasattr(params, "get"):
      rec["rounding"] = params.get("rounding")
      rec["rounding"] = None if rec["rounding"] is None else str(
          rec["rounding"])
  except Exception as e:  # pylint: disable=broad-except
    where = traceback.extract_tb(e.__traceback__)[-1]
    rec.update(predicted=f"error: {type(e).__name__}",
               evidence=f"{type(e).__name__}: {e} (at "
               f"{os.path.basename(where.filename)}:{where.lineno})")
  rec["seconds"] = round(time.perf_counter() - t0, 2)
  rec["name_ok"] = bool(rec["expected"] and rec["predicted"] in rec["expected"])
  rec["verdict_ok"] = bool(
      rec["verdict"] != "-" and spec.verdict_ok(rec["predicted"],
                                                rec["verdict"]))
  return rec


def _notes(cid: str, recs: list[dict]) -> str:
  """The notes column of a class row.

  Args:
    cid: the class id.
    recs: the class's records.

  Returns:
    Secondary ``precision:tf32`` counts (tf32_base_faults), the rounding
    params seen (tf32_trunc_base), and how many variants had t == g.
  """
  out = []
  if cid == "tf32_base_faults":
    n = sum(r["secondary"] == "precision:tf32" for r in recs)
    out.append(f"secondary precision:tf32 {n}/{len(recs)}")
  if cid == "tf32_trunc_base":
    seen = collections.Counter(str(r["rounding"]) for r in recs)
    out.append("rounding " + ", ".join(
        f"{k} x{v}" for k, v in seen.most_common()))
  same = sum(bool(r["t_equals_g"]) for r in recs)
  if same:
    out.append(f"t==g x{same}")
  return "; ".join(out)


def print_report(recs: list[dict]) -> None:
  """Prints the Markdown table and one line per wrong variant.

  Args:
    recs: all records, in class order.
  """
  by_class = collections.defaultdict(list)
  for r in recs:
    by_class[r["class"]].append(r)
  print("| class | variants | expected name | expected verdict | name ok "
        "| verdict ok | observed (name/verdict) | notes | s |")
  print("|---|---|---|---|---|---|---|---|---|")
  for cid, rs in by_class.items():
    spec = CLASSES[cid]
    seen = collections.Counter(f"{r['predicted']}/{r['verdict']}" for r in rs)
    obs = ", ".join(f"{k} x{v}" for k, v in seen.most_common(4))
    if len(seen) > 4:
      obs += ", ..."
    print(f"| {cid} | {len(rs)} | {spec.names} | {spec.verdicts} "
          f"| {sum(r['name_ok'] for r in rs)} "
          f"| {sum(r['verdict_ok'] for r in rs)} | {obs} "
          f"| {_notes(cid, rs)} | {sum(r['seconds'] for r in rs):.0f} |")
  tot = len(recs)
  print(f"\nTotal: names {sum(r['name_ok'] for r in recs)}/{tot}, verdicts "
        f"{sum(r['verdict_ok'] for r in recs)}/{tot}\n")
  wrong = [r for r in recs if not (r["name_ok"] and r["verdict_ok"])]
  if wrong:
    print("Wrong variants:")
  for r in wrong:
    ev = " ".join(r["evidence"].split())[:140]
    sec = f" (secondary {r['secondary']})" if r["secondary"] else ""
    print(f"- {r['class']}: {r['variant']} -> {r['predicted']}/"
          f"{r['verdict']}{sec}: {ev}")


def main(argv: list[str] | None = None) -> int:
  """Parses the options, runs the classes and prints the report.

  Args:
    argv: the command-line arguments (default: sys.argv[1:]).

  Returns:
    The exit status (0).
  """
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", type=int, default=4,
                      help="variants per class")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--context", choices=("none", "kernel"), default="none",
                      help="none: peat.detect(sig); kernel: with the site "
                      "kind and reduction length")
  parser.add_argument("--classes", default="",
                      help="comma-separated class ids (default: all): "
                      + ",".join(CLASSES))
  parser.add_argument("--json", default="", help="write all records here")
  args = parser.parse_args(argv)
  ids = [c for c in args.classes.split(",") if c] or list(CLASSES)
  unknown = [c for c in ids if c not in CLASSES]
  if unknown:
    parser.error(f"unknown classes {unknown}; known: {list(CLASSES)}")
  commit = git_commit()
  print(f"commit {commit}; --variants={args.variants} --seed={args.seed} "
        f"--context={args.context} --classes={','.join(ids)}")
  print(f"jax {jax.__version__} on {jax.default_backend()}; golden keeps "
        f"subnormals: {golden_keeps_subnormals()}\n")
  t0 = time.perf_counter()
  recs = []
  for cid in ids:
    ci = list(CLASSES).index(cid)
    for i in range(args.variants):
      recs.append(run_variant(cid, CLASSES[cid], args.seed, ci, i,
                              args.context))
  print_report(recs)
  elapsed = time.perf_counter() - t0
  print(f"\n{len(recs)} variants in {elapsed:.0f} s")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"commit": commit, "options": vars(args),
                 "seconds": round(elapsed, 1), "records": recs}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
