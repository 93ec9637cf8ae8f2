"""float64 references, golden kernels and seeded inputs for native KUT checks.

The references compute in numpy float64 from inputs upcast exactly; the
tolerance helpers are worst-case rounding bounds used by the tests in
``tests/kernels`` and usable by any check of a native variant.
"""

import zlib

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
          "float16": jnp.float16}

# Unit roundoff of the output format (round to nearest); doubled for rtz.
OUT_U = {d: _core.format_of(d).unit_roundoff for d in DTYPES}
# Smallest normal of the output format: below it rounding is absolute.
OUT_TINY = {d: _core.format_of(d).min_normal for d in DTYPES}
U32 = _core.FORMATS["fp32"].unit_roundoff


def rng_for(*key) -> np.random.Generator:
  """A fresh generator seeded (stably across processes) from ``key``."""
  return np.random.default_rng(zlib.crc32(repr(key).encode()))


def randn(rng, shape, dtype, scale=1.0, shift=0.0) -> jax.Array:
  x = rng.standard_normal(shape) * scale + shift
  return jnp.asarray(x.astype(np.float32)).astype(DTYPES[dtype])


def f64(x) -> np.ndarray:
  return np.asarray(jnp.asarray(x).astype(jnp.float32)).astype(np.float64)


def matmul_ref(a, b) -> np.ndarray:
  return np.matmul(f64(a), f64(b))


def softmax_ref(x) -> np.ndarray:
  x = f64(x)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def layer_norm_ref(x, scale, bias, eps) -> np.ndarray:
  x = f64(x)
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) / np.sqrt(v + eps) * f64(scale) + f64(bias)


def conv_ref(x, w, strides, padding) -> np.ndarray:
  """Direct float64 convolution, NHWC x HWIO, explicit or SAME/VALID pads."""
  x, w = f64(x), f64(w)
  kh, kw = w.shape[:2]
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(x.shape[1:3], (kh, kw), strides, padding)
  (pt, pb), (pl, pr) = padding
  xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
  oh = (xp.shape[1] - kh) // strides[0] + 1
  ow = (xp.shape[2] - kw) // strides[1] + 1
  out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
  for i in range(kh):
    for j in range(kw):
      patch = xp[:, i:i + strides[0] * (oh - 1) + 1:strides[0],
                 j:j + strides[1] * (ow - 1) + 1:strides[1], :]
      out += np.einsum("nhwc,co->nhwo", patch, w[i, j])
  return out


def conv_abs(x, w, strides, padding) -> np.ndarray:
  """The same convolution of |x| and |w| (the scale of rounding errors)."""
  return conv_ref(np.abs(f64(x)), np.abs(f64(w)), strides, padding)


def conv_golden(x, w, strides=(1, 1), padding="SAME"):
  return lax.conv_general_dilated(x, w, strides, padding,
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))


def layer_norm_golden(x, scale, bias, eps=1e-6):
  m = jnp.mean(x, -1, keepdims=True)
  v = jnp.mean(jnp.square(x - m), -1, keepdims=True)
  return (x - m) * lax.rsqrt(v + eps) * scale + bias


def gemm_rel_tol(variant: str, k: int, dtype: str) -> float:
  """Bound on |t - r| / (|a| @ |b|) for a GEMM variant with inner size k.

  Each term is a standard worst-case bound: k * u for a recursive sum with
  unit roundoff u, 2 * u_in for a product of two rounded inputs, and the
  output rounding (twice u for round-toward-zero); a factor 2 of margin.
  """
  u = {k: f.unit_roundoff for k, f in _core.FORMATS.items()}
  acc = {"acc_fp16": u["fp16"], "acc_bf16": u["bf16"]}.get(variant, U32)
  inp = {"in_tf32": u["tf32"], "in_fp16": u["fp16"],
         "in_bf16": u["bf16"]}.get(variant, 0.0)
  out = OUT_U[dtype] * (2 if variant == "rtz" else 1)
  if variant == "rtz" and dtype == "float32":
    acc = 2.0**-53
  return 2 * (k * acc + 2 * inp + out)
