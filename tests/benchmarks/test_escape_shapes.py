"""The shape-gated kernels under test (benchmarks/escape/escape_shapes.py).

For each kernel, in float32 and bfloat16, on seeded random inputs (no
training run): on the ``gpt`` scenario's training shape the buggy kernel
is golden to rounding noise; on the shape that exposes it, it is far off;
its ``_fixed`` twin is golden on both. Errors are RMS distances to the
float64 reference (peat_jax.analyzer), relative to the reference's RMS.
"""

import functools
import os
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "benchmarks", "escape"))

import escape_shapes  # pylint: disable=wrong-import-position

from peat_jax import analyzer  # pylint: disable=wrong-import-position
from peat_jax.models import layers  # pylint: disable=wrong-import-position

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
#: Unit roundoff of each dtype: the floor of the tolerance.
UNIT = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}
#: A kernel matches when its error is within this multiple of the golden
#: kernel's (or of the unit roundoff, when golden is exact).
MATCH = 4.0
#: On the exposing shape the buggy kernel's error exceeds the fixed twin's
#: by this factor.
FAR = 100.0

_MM = (((2,), (0,)), ((), ()))


def _randn(rng, shape, scale=1.0):
  """Standard normal float32 values times ``scale``, never zero."""
  x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
  return np.where(x == 0, np.float32(0.5), x)


def _causal(t, s, offset=0):
  """``[1, 1, t, s]`` mask keeping ``s' <= t' + offset``."""
  keep = np.arange(s)[None, :] <= np.arange(t)[:, None] + offset
  return keep[None, None]


def _packed(lengths):
  """Block-diagonal causal mask of sequences packed in one row."""
  seg = np.repeat(np.arange(len(lengths)), lengths)
  n = len(seg)
  keep = (seg[:, None] == seg[None, :]) & _causal(n, n)[0, 0]
  return keep[None, None]


def _gqa_golden(q, k, v, mask):
  """layers.attention with each kv head repeated for its query heads."""
  rep = q.shape[2] // k.shape[2]
  return layers.attention(q, jnp.repeat(k, rep, axis=2),
                          jnp.repeat(v, rep, axis=2), mask)


def _attention_inputs(rng, t, s, h, hk, mask):
  return (_randn(rng, (2, t, h, 32)), _randn(rng, (2, s, hk, 32)),
          _randn(rng, (2, s, hk, 32)), mask)


def _ln_inputs(rng, shape):
  f = shape[-1]
  return (_randn(rng, shape), 1.0 + _randn(rng, (f,), 0.1),
          _randn(rng, (f,), 0.1))


def _max_call(axes):
  return lambda kut, x: kut(x, axes=axes)


#: (call(kut, *inputs), golden(*inputs), reference(*inputs)) of a kind.
_SOFTMAX = (lambda kut, x: kut(x), layers.softmax, analyzer.reference_softmax)
_MATMUL = (
    lambda kut, a, b: kut(a, b, dimension_numbers=_MM, precision=None,
                          preferred_element_type=None, out_sharding=None),
    lambda a, b: lax.dot_general(a, b, _MM),
    lambda a, b: analyzer.reference_dot_general(a, b, _MM))

def _rows(shape):
  """Softmax inputs: rows of logits of scale 2."""
  return lambda r: (_randn(r, shape, 2.0),)


def _gemm(lhs, rhs):
  """GEMM inputs: activations ``lhs`` and weights ``rhs`` of scale 0.1."""
  return lambda r: (_randn(r, lhs), _randn(r, rhs, 0.1))


#: kernel -> (call(kut, *inputs), golden(*inputs), reference(*inputs),
#:            {variant: inputs(rng)}); variant "train" is gpt's shape.
CASES = {
    "softmax_tail64": (
        *_SOFTMAX,
        {"train": _rows((2, 4, 40, 40)), "L=64": _rows((2, 4, 40, 64))}),
    "softmax_tail64_long": (
        *_SOFTMAX,
        {"train": _rows((2, 4, 40, 40)), "L=64": _rows((2, 4, 40, 64)),
         "L=192": _rows((2, 4, 8, 192))}),
    "matmul_ntail7": (
        *_MATMUL,
        {"train": _gemm((2, 40, 128), (128, 384)),
         "N=15": _gemm((2, 40, 128), (128, 15))}),
    "matmul_gemv": (
        *_MATMUL,
        {"train": _gemm((2, 40, 128), (128, 384)),
         "one row": _gemm((1, 1, 128), (128, 384))}),
    "attention_causal_topleft": (
        lambda kut, q, k, v, m: kut(q, k, v, m), layers.attention,
        analyzer.reference_attention,
        {"train": lambda r: _attention_inputs(r, 40, 40, 4, 4,
                                              _causal(40, 40)),
         "q_len 8, kv_len 40": lambda r: _attention_inputs(
             r, 8, 40, 4, 4, _causal(8, 40, offset=32)),
         "packed": lambda r: _attention_inputs(r, 40, 40, 4, 4,
                                               _packed((24, 16)))}),
    "attention_gqa_modulo": (
        lambda kut, q, k, v, m: kut(q, k, v, m), _gqa_golden,
        analyzer.reference_attention,
        {"train": lambda r: _attention_inputs(r, 40, 40, 4, 4,
                                              _causal(40, 40)),
         "Hk=2": lambda r: _attention_inputs(r, 40, 40, 4, 2,
                                             _causal(40, 40))}),
    "layer_norm_wide": (
        lambda kut, x, s, b: kut(x, s, b, 1e-6),
        lambda x, s, b: layers.layer_norm(x, s, b, 1e-6),
        lambda x, s, b: analyzer.reference_layer_norm(x, s, b, 1e-6),
        {"train": lambda r: _ln_inputs(r, (2, 40, 128)),
         "F=8192": lambda r: _ln_inputs(r, (2, 4, 8192))}),
    "reduce_max_two_pass": (
        _max_call((2,)), lambda x: lax.reduce_max(x, (2,)),
        lambda x: analyzer.reference(lambda y: lax.reduce_max(y, (2,)), x),
        {"train": lambda r: (_randn(r, (2, 40, 256)),),
         "16385 elements": lambda r: (_randn(r, (4, 1, 16385)),)}),
}

#: Shapes besides training's on which a kernel is right all the same.
RIGHT_TOO = {("softmax_tail64_long", "L=64")}
TRAIN = [(k, "train") for k in CASES] + sorted(RIGHT_TOO)
EXPOSE = [(k, v) for k, (_, _, _, vs) in CASES.items() for v in vs
          if v != "train" and (k, v) not in RIGHT_TOO]


def _rel(t, r) -> float:
  t = np.asarray(np.asarray(t, np.float32), np.float64)
  return float(np.linalg.norm(t - r) / np.linalg.norm(r))


@functools.lru_cache(maxsize=None)
def _errors(kernel: str, variant: str, dtype: str) -> dict:
  """Relative RMS errors of the buggy, fixed and golden kernels."""
  call, golden, ref_fn, variants = CASES[kernel]
  rng = np.random.default_rng(zlib.crc32(f"{kernel}/{variant}".encode()))
  raw = variants[variant](rng)
  xs = [jnp.asarray(a) if a.dtype == bool else
        jnp.asarray(a).astype(DTYPES[dtype]) for a in raw]
  ref = np.asarray(ref_fn(*xs), np.float64)
  g = jax.jit(golden)(*xs)
  out = {"golden": _rel(g, ref)}
  for name, fn in (("bug", getattr(escape_shapes, kernel)),
                   ("fixed", getattr(escape_shapes, kernel + "_fixed"))):
    t = jax.jit(functools.partial(call, fn))(*xs)
    assert t.shape == g.shape and t.dtype == g.dtype, (name, t.shape,
                                                       t.dtype)
    out[name] = _rel(t, ref)
  return out


def _tol(e: dict, dtype: str) -> float:
  return MATCH * max(e["golden"], UNIT[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,variant", TRAIN)
def test_buggy_kernel_is_golden_on_the_training_shape(kernel, variant,
                                                      dtype):
  e = _errors(kernel, variant, dtype)
  assert e["bug"] <= _tol(e, dtype), e


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,variant", EXPOSE)
def test_buggy_kernel_is_far_off_on_the_exposing_shape(kernel, variant,
                                                       dtype):
  e = _errors(kernel, variant, dtype)
  assert e["bug"] > FAR * max(e["fixed"], UNIT["float32"]), e
  assert e["bug"] > FAR * UNIT["float32"] and e["bug"] > 0.05, e


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,variant", TRAIN + EXPOSE)
def test_fixed_twin_is_golden_everywhere(kernel, variant, dtype):
  e = _errors(kernel, variant, dtype)
  assert e["fixed"] <= _tol(e, dtype), e


def test_every_kernel_has_its_fixed_twin():
  for kernel in CASES:
    assert callable(getattr(escape_shapes, kernel + "_fixed"))
