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


# ------------------------------------------- the Llama kernels' formulas
#
# Each variant's own formula, written once over an array module ``xp``
# (numpy or jax.numpy): with numpy on float64 arrays it is the float64
# reference of the forward; with jax.numpy under ``jax.enable_x64(True)``
# ``jax.grad`` of it is the float64 reference of the backward. Variants that
# only round differently (``pairwise``, ``hf``, ``acc_bf16``, ``tanh``,
# ``bf16``, ``fast_exp``) have the default formula; the slips have their own.

RMS_PORT_EPS = 1e-5          # rms_norm variant "eps": the port's constant
ROPE_BASE_500K = 500000.0    # rope variant "theta_500k"


def rms_norm_formula(x, scale, eps, variant="default", xp=np):
  """x * rsqrt(mean(x**2) + eps) * scale as the variant computes it."""
  if variant == "eps":
    eps = RMS_PORT_EPS
  if variant == "layer_norm":
    x = x - xp.mean(x, axis=-1, keepdims=True)
  return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def silu_formula(x, up=None, variant="default", xp=np):
  """silu(x) [* up]; ``swapped``: silu(up) * x."""
  if up is None:
    return x / (1 + xp.exp(-x))
  if variant == "swapped":
    x, up = up, x
  return x / (1 + xp.exp(-x)) * up


def rope_angles(positions, d, theta, variant="default", xp=np, dtype=None):
  """(..., T, 1, D/2) angles positions * theta**(-2i/D) of the variant."""
  dtype = dtype or np.float64
  if variant == "theta_500k":
    theta = ROPE_BASE_500K
  if variant == "offset":
    positions = positions + 1
  inv = float(theta) ** (-2.0 * xp.arange(d // 2, dtype=dtype) / d)
  return positions.astype(dtype)[..., :, None, None] * inv


def rope_formula(x, positions, theta, variant="default", xp=np):
  """Rotary embedding of x (B, T, H, D) at positions (T,) or (B, T)."""
  d = x.shape[-1]
  a = rope_angles(positions, d, theta, variant, xp, x.dtype)
  c, s = xp.cos(a), xp.sin(a)
  if variant == "interleaved":  # GPT-J: pairs (2i, 2i + 1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return xp.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(
        x.shape)
  x1, x2 = x[..., :d // 2], x[..., d // 2:]
  return xp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _wide(x):
  """float32 for 16-bit and float32 x; float64 (the reference) stays."""
  return jnp.promote_types(x.dtype, jnp.float32)


def rms_norm_golden(x, scale, eps=1e-6):
  """``nnx.RMSNorm`` as a bf16 model builds it: x's dtype, a float32
  scale (the llama scenario's and the stock model's norm)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  layer = nnx.RMSNorm(x.shape[-1], epsilon=eps, dtype=x.dtype,
                      param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  layer.scale[...] = scale
  return layer(x)


def silu_golden(x, up=None):
  """jax.nn.silu in x's dtype; SwiGLU: float32 inside (float64 for a
  float64 reference), one rounding."""
  if up is None:
    return jax.nn.silu(x)
  w = _wide(x)
  return (jax.nn.silu(x.astype(w)) * up.astype(w)).astype(x.dtype)


def rope_golden(x, positions, theta=10000.0):
  """The two halves rotated (docs/kernels.md) as ``models.layers.rope``
  does, float32 (float64 for a float64 reference), one rounding."""
  d = x.shape[-1]
  h = d // 2
  w = _wide(x)
  inv = theta ** (-jnp.arange(h, dtype=w) * (2.0 / d))
  ang = positions.astype(w)[:, None] * inv[None, :]
  cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
  xf = x.astype(w)
  x1, x2 = xf[..., :h], xf[..., h:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                         -1).astype(x.dtype)


LLAMA_FORMULAS = {"rms_norm": rms_norm_formula, "silu": silu_formula,
                  "rope": rope_formula}


def llama_reference(kernel, *args, variant="default", **kwargs):
  """float64 numpy forward of a Llama kernel's variant formula.

  Float operands are upcast exactly (``f64``); integer ones (positions) and
  scalars pass through.
  """
  args = [f64(a) if _is_float_array(a) else (np.asarray(a) if hasattr(
      a, "dtype") else a) for a in args]
  return LLAMA_FORMULAS[kernel](*args, variant=variant, xp=np, **kwargs)


def llama_vjp_reference(kernel, args, cotangent, argnums, *,
                        variant="default", **kwargs):
  """float64 gradients (numpy) of a variant formula by ``jax.vjp``.

  Args:
    kernel: ``rms_norm``, ``silu`` or ``rope``.
    args: the operands as given to the native kernel (any float dtype).
    cotangent: the output cotangent.
    argnums: positions in ``args`` of the operands to differentiate.
    variant: the native variant whose formula is differentiated.
    **kwargs: other arguments of the formula (eps, theta).

  Returns:
    A tuple of float64 arrays, one per argnum.
  """
  with jax.enable_x64(True):
    vals = [jnp.asarray(f64(a)) if _is_float_array(a) else a for a in args]

    def fn(*diff):
      full = list(vals)
      for i, v in zip(argnums, diff):
        full[i] = v
      return LLAMA_FORMULAS[kernel](*full, variant=variant, xp=jnp, **kwargs)

    _, vjp = jax.vjp(fn, *[vals[i] for i in argnums])
    grads = vjp(jnp.asarray(f64(cotangent)))
    return tuple(np.asarray(g, np.float64) for g in grads)


def _is_float_array(a) -> bool:
  return hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)
