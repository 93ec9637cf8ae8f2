"""Native kernels under test (KUTs): C++/CUDA/HIP kernels as JAX custom calls.

Each function has the signature of its golden kernel plus keyword-only
``variant`` (and ``tile``) arguments, trains under ``jax.grad`` (a
``jax.custom_vjp`` over forward and backward FFI targets), and works under
``jit`` and ``vmap``:

| KUT | golden |
| --- | --- |
| ``matmul(a, b)`` | ``jnp.matmul(a, b)`` (2-D and batched) |
| ``softmax(x, axis=-1)`` | ``jax.nn.softmax(x, axis)`` |
| ``layer_norm(x, scale, bias, eps)`` | layer norm over the last axis |
| ``conv2d(x, w, strides, padding)`` | ``lax.conv_general_dilated`` NHWC/HWIO |
| ``rms_norm(x, scale, eps)`` | ``flax.nnx.RMSNorm`` (float32 inside, one rounding) |
| ``silu(x, up=None)`` | ``jax.nn.silu(x)`` (times ``up``: SwiGLU) |
| ``rope(x, positions, theta=)`` | rotary embedding of the two halves (Llama-HF layout) |

The variants (``variants(kernel)``) are real implementations of the choices
ports make; ``EXPECTED_ERROR_MODEL[kernel][variant]`` names the error model
each should produce against the golden kernel. See BUILD.md.

>>> import jax.numpy as jnp
>>> from peat_jax.kernels import native
>>> a = jnp.ones((3, 5)); b = jnp.ones((5, 2))
>>> native.matmul(a, b, variant="acc_bf16").shape
(3, 2)
"""

import functools
from typing import Callable, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from peat_jax.core import PeatError
from peat_jax.kernels import _ffi
from peat_jax.kernels._variants import BROKEN_MODES
from peat_jax.kernels._variants import EXPECTED_ERROR_MODEL
from peat_jax.kernels._variants import NONDETERMINISTIC
from peat_jax.kernels._variants import VARIANT_CODES
from peat_jax.kernels._variants import variants

__all__ = [
    "EXPECTED_ERROR_MODEL", "NONDETERMINISTIC", "KERNELS", "DTYPES",
    "conv2d", "kut", "layer_norm", "matmul", "rms_norm", "rope", "silu",
    "softmax", "variants",
]

DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
          jnp.dtype(jnp.float16))
_DEFAULT_TILE = 32


# ----------------------------------------------------------------- checks


def _check_variant(kernel: str, variant: str) -> int:
  allowed = variants(kernel)
  if variant not in allowed:
    raise PeatError(
        f"native {kernel}: unknown variant {variant!r}; expected one of "
        f"{', '.join(allowed)}.")
  return VARIANT_CODES[variant]


def _check_tile(kernel: str, tile) -> int:
  if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)):
    raise PeatError(f"native {kernel}: tile must be an int, got "
                    f"{type(tile).__name__} {tile!r}.")
  if not 1 <= int(tile) <= 2**31 - 1:
    raise PeatError(f"native {kernel}: tile must be in [1, 2**31), got "
                    f"{tile}.")
  return int(tile)


def _check_dtypes(kernel: str, **arrays) -> jnp.dtype:
  """All arrays share one supported float dtype (no silent promotion)."""
  dtypes = {}
  for name, x in arrays.items():
    if not hasattr(x, "dtype"):
      raise PeatError(f"native {kernel}: {name} must be an array (jax or "
                      f"numpy), got {type(x).__name__}.")
    # The array's own dtype: a numpy float64 input is rejected, not silently
    # truncated to float32.
    dtypes[name] = jnp.dtype(x.dtype)
  for name, dt in dtypes.items():
    if dt not in DTYPES:
      raise PeatError(
          f"native {kernel}: {name} has dtype {dt}; expected one of float32, "
          "bfloat16, float16. Cast it with .astype(jnp.float32).")
  if len(set(dtypes.values())) > 1:
    got = ", ".join(f"{n}={d}" for n, d in dtypes.items())
    raise PeatError(f"native {kernel}: operands must share one dtype, got "
                    f"{got}. Cast them to a common dtype first.")
  return next(iter(dtypes.values()))


def _check_float(kernel: str, name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(
      value, (float, int, np.floating, np.integer)):
    raise PeatError(f"native {kernel}: {name} must be a Python or numpy "
                    f"float, got {type(value).__name__} {value!r}.")
  value = float(value)
  if not abs(value) <= float(np.finfo(np.float32).max):
    raise PeatError(f"native {kernel}: {name} must be finite in float32, "
                    f"got {value}.")
  return value


# ------------------------------------------------------------------ matmul


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(a, b, code, tile):
  return _ffi.matmul_fwd(a, b, code, tile)


def _matmul_fwd(a, b, code, tile):
  return _ffi.matmul_fwd(a, b, code, tile), (a, b)


def _matmul_bwd(code, tile, res, dc):
  a, b = res
  return _ffi.matmul_bwd(a, b, dc, code, tile)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(a: jax.Array, b: jax.Array, *, variant: str = "default",
           tile: int = _DEFAULT_TILE) -> jax.Array:
  """Matrix product of the native kernel, golden ``jnp.matmul(a, b)``.

  Args:
    a: (..., M, K) float32, bfloat16 or float16.
    b: (..., K, N), same dtype; batch dims broadcast as in ``jnp.matmul``.
    variant: one of ``variants("matmul")``.
    tile: tile size of ``tiled`` (k tile), ``tile_edge_bug`` (n tile) and
      ``threaded_nondet`` (k chunk per work item).

  Returns:
    (..., M, N) in the operands' dtype.

  Raises:
    PeatError: unknown variant, bad tile, unsupported or mixed dtypes, rank
      < 2 or mismatched contracting dims.
  """
  code = _check_variant("matmul", variant)
  tile = _check_tile("matmul", tile)
  _check_dtypes("matmul", a=a, b=b)
  if jnp.ndim(a) < 2 or jnp.ndim(b) < 2:
    raise PeatError(
        f"native matmul: operands must have rank >= 2, got shapes "
        f"{jnp.shape(a)} and {jnp.shape(b)}. Add a dim with x[None, :] or "
        "x[:, None].")
  if a.shape[-1] != b.shape[-2]:
    raise PeatError(
        f"native matmul: contracting dims differ: a is {a.shape} (K="
        f"{a.shape[-1]}), b is {b.shape} (K={b.shape[-2]}); expected "
        "a (..., M, K) and b (..., K, N).")
  try:
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  except ValueError as err:
    raise PeatError(f"native matmul: batch dims {a.shape[:-2]} and "
                    f"{b.shape[:-2]} do not broadcast.") from err
  a = jnp.broadcast_to(a, batch + a.shape[-2:])
  b = jnp.broadcast_to(b, batch + b.shape[-2:])
  return _matmul(a, b, code, tile)


# ----------------------------------------------------------------- softmax


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _softmax(x, code, tile):
  return _ffi.softmax_fwd(x, code, tile)


def _softmax_fwd(x, code, tile):
  y = _ffi.softmax_fwd(x, code, tile)
  return y, y


def _softmax_bwd(code, tile, y, dy):
  return (_ffi.softmax_bwd(y, dy, code, tile),)


_softmax.defvjp(_softmax_fwd, _softmax_bwd)


def softmax(x: jax.Array, axis: int = -1, *, variant: str = "default",
            tile: int = _DEFAULT_TILE) -> jax.Array:
  """Softmax of the native kernel, golden ``jax.nn.softmax(x, axis)``.

  Args:
    x: float32, bfloat16 or float16 array of rank >= 1.
    axis: the one axis to normalize over.
    variant: one of ``variants("softmax")``.
    tile: tile length of the ``tiled`` (online softmax) variant.

  Returns:
    An array like ``x``.

  Raises:
    PeatError: unknown variant, bad tile, unsupported dtype, bad axis.
  """
  code = _check_variant("softmax", variant)
  tile = _check_tile("softmax", tile)
  _check_dtypes("softmax", x=x)
  if not isinstance(axis, (int, np.integer)) or not -jnp.ndim(x) <= axis < max(
      jnp.ndim(x), 1) or jnp.ndim(x) == 0:
    raise PeatError(f"native softmax: axis must be one int in [-{jnp.ndim(x)}"
                    f", {jnp.ndim(x)}) for x of shape {jnp.shape(x)}, got "
                    f"{axis!r}.")
  x = jnp.moveaxis(x, axis, -1)
  return jnp.moveaxis(_softmax(x, code, tile), -1, axis)


# -------------------------------------------------------------- layer norm


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, scale, bias, code, eps):
  return _ffi.layer_norm_fwd(x, scale, bias, code, eps)[0]


def _layer_norm_fwd(x, scale, bias, code, eps):
  y, mean, rstd = _ffi.layer_norm_fwd(x, scale, bias, code, eps)
  return y, (x, scale, mean, rstd)


def _layer_norm_bwd(code, eps, res, dy):
  del eps
  x, scale, mean, rstd = res
  return _ffi.layer_norm_bwd(x, scale, mean, rstd, dy, code)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
               eps: float = 1e-6, *, variant: str = "default") -> jax.Array:
  """Layer norm over the last axis: ``(x - mean) / sqrt(var + eps) * scale
  + bias``, golden ``flax.nnx.LayerNorm`` (biased variance).

  Args:
    x: (..., D) float32, bfloat16 or float16.
    scale: (D,), x's dtype, or float32 for 16-bit x (a bf16 model keeps
      float32 parameters): then cast to x's dtype, as a fused layer norm
      takes its weights in the dtype it computes in.
    bias: (D,), as scale.
    eps: added to the variance (a Python or numpy float).
    variant: one of ``variants("layer_norm")``.

  Returns:
    An array like ``x``.

  Raises:
    PeatError: unknown variant, bad eps, dtypes, or shapes.
  """
  code = _check_variant("layer_norm", variant)
  eps = _check_float("layer_norm", "eps", eps)
  xdt = jnp.result_type(x)
  if jnp.dtype(xdt).itemsize == 2:
    f32 = jnp.dtype(jnp.float32)
    if jnp.result_type(scale) == f32:
      scale = jnp.asarray(scale).astype(xdt)
    if jnp.result_type(bias) == f32:
      bias = jnp.asarray(bias).astype(xdt)
  _check_dtypes("layer_norm", x=x, scale=scale, bias=bias)
  d = jnp.shape(x)[-1] if jnp.ndim(x) else None
  if jnp.ndim(x) < 1 or jnp.shape(scale) != (d,) or jnp.shape(bias) != (d,):
    raise PeatError(
        f"native layer_norm: expected x (..., D), scale (D,), bias (D,), got "
        f"{jnp.shape(x)}, {jnp.shape(scale)}, {jnp.shape(bias)}.")
  return _layer_norm(x, scale, bias, code, eps)


# ------------------------------------------------------------------ conv2d


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _conv2d(x, w, out_hw, strides, pad_tl, code, tile):
  return _ffi.conv2d_fwd(x, w, out_hw, strides, pad_tl, code, tile)


def _conv2d_fwd(x, w, out_hw, strides, pad_tl, code, tile):
  return _ffi.conv2d_fwd(x, w, out_hw, strides, pad_tl, code, tile), (x, w)


def _conv2d_bwd(out_hw, strides, pad_tl, code, tile, res, dy):
  del out_hw
  x, w = res
  return _ffi.conv2d_bwd(x, w, dy, strides, pad_tl, code, tile)


_conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


def conv2d(x: jax.Array, w: jax.Array, strides: Sequence[int] = (1, 1),
           padding: str | Sequence[tuple[int, int]] = "SAME", *,
           variant: str = "default", tile: int = _DEFAULT_TILE) -> jax.Array:
  """2-D convolution, NHWC input and HWIO filter (Flax's layout).

  Golden: ``lax.conv_general_dilated(x, w, strides, padding,
  dimension_numbers=("NHWC", "HWIO", "NHWC"))``. Lowered as im2col + GEMM,
  so the GEMM variants apply.

  Args:
    x: (N, H, W, C) float32, bfloat16 or float16.
    w: (KH, KW, C, O), same dtype.
    strides: (stride_h, stride_w), positive ints.
    padding: "SAME", "VALID" or ((top, bottom), (left, right)), ints >= 0.
    variant: one of ``variants("conv2d")``.
    tile: as for ``matmul`` (on the GEMM of the lowering).

  Returns:
    (N, OH, OW, O).

  Raises:
    PeatError: unknown variant, bad strides/padding, dtypes or shapes.
  """
  code = _check_variant("conv2d", variant)
  tile = _check_tile("conv2d", tile)
  _check_dtypes("conv2d", x=x, w=w)
  if jnp.ndim(x) != 4 or jnp.ndim(w) != 4 or x.shape[3] != w.shape[2]:
    raise PeatError(
        f"native conv2d: expected x (N, H, W, C) and w (KH, KW, C, O) with "
        f"equal C, got {jnp.shape(x)} and {jnp.shape(w)}.")
  strides = tuple(strides)
  if len(strides) != 2 or not all(
      isinstance(s, (int, np.integer)) and s >= 1 for s in strides):
    raise PeatError(f"native conv2d: strides must be two ints >= 1, got "
                    f"{strides!r}.")
  if isinstance(padding, str):
    if padding not in ("SAME", "VALID"):
      raise PeatError(f"native conv2d: padding must be 'SAME', 'VALID' or "
                      f"((top, bottom), (left, right)), got {padding!r}.")
    pads = lax.padtype_to_pads(x.shape[1:3], w.shape[:2], strides, padding)
  else:
    pads = [tuple(p) for p in padding]
    if len(pads) != 2 or any(len(p) != 2 or min(p) < 0 for p in pads):
      raise PeatError(f"native conv2d: explicit padding must be ((top, "
                      f"bottom), (left, right)) of ints >= 0, got {padding!r}.")
  out_hw = tuple(
      (x.shape[1 + i] + pads[i][0] + pads[i][1] - w.shape[i]) // strides[i] + 1
      for i in range(2))
  if min(out_hw) < 1:
    raise PeatError(f"native conv2d: filter {w.shape[:2]} larger than the "
                    f"padded input {x.shape[1:3]} with padding {pads}.")
  pad_tl = (int(pads[0][0]), int(pads[1][0]))
  strides = (int(strides[0]), int(strides[1]))
  return _conv2d(x, w, out_hw, strides, pad_tl, code, tile)


# ---------------------------------------------------------------- rms norm


def _check_float_array(kernel: str, name: str, x) -> jnp.dtype:
  """One array of a supported float dtype (dtypes of operands may differ)."""
  return _check_dtypes(kernel, **{name: x})


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, scale, code, eps):
  return _ffi.rms_norm_fwd(x, scale, code, eps)[0]


def _rms_norm_fwd(x, scale, code, eps):
  y, mean, rstd = _ffi.rms_norm_fwd(x, scale, code, eps)
  return y, (x, scale, mean, rstd)


def _rms_norm_bwd(code, eps, res, dy):
  del eps  # in rstd
  x, scale, mean, rstd = res
  return _ffi.rms_norm_bwd(x, scale, mean, rstd, dy, code)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def rms_norm(x: jax.Array, scale: jax.Array | None, eps: float = 1e-6, *,
             variant: str = "default") -> jax.Array:
  """RMS norm over the last axis: ``x * rsqrt(mean(x**2) + eps) * scale``.

  Golden: ``flax.nnx.RMSNorm`` (float32 statistics and product, rounded once
  to the output dtype). The KUT of ``rms_norm`` sites (``kut(x, scale,
  eps)``).

  Args:
    x: (..., D) float32, bfloat16 or float16.
    scale: (D,) float32, bfloat16 or float16 (may differ from x's dtype: a
      bf16 model keeps a float32 scale), or None (no scale: ones).
    eps: added to the mean square (a Python or numpy float; variant ``eps``
      ignores it and uses 1e-5).
    variant: one of ``variants("rms_norm")``.

  Returns:
    An array of x's shape and dtype.

  Raises:
    PeatError: unknown variant, bad eps, dtypes or shapes.
  """
  code = _check_variant("rms_norm", variant)
  eps = _check_float("rms_norm", "eps", eps)
  _check_float_array("rms_norm", "x", x)
  if jnp.ndim(x) < 1:
    raise PeatError(f"native rms_norm: x must have rank >= 1 (..., D), got "
                    f"shape {jnp.shape(x)}.")
  d = jnp.shape(x)[-1]
  if scale is None:
    scale = jnp.ones((d,), x.dtype)
  _check_float_array("rms_norm", "scale", scale)
  if jnp.shape(scale) != (d,):
    raise PeatError(f"native rms_norm: expected x (..., D) and scale (D,), "
                    f"got {jnp.shape(x)} and {jnp.shape(scale)}.")
  return _rms_norm(x, scale, code, eps)


# -------------------------------------------------------------------- silu


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _silu(x, code):
  return _ffi.silu_fwd(x, None, code)


def _silu_fwd(x, code):
  return _ffi.silu_fwd(x, None, code), x


def _silu_bwd(code, x, dy):
  return _ffi.silu_bwd(dy, x, None, code)


_silu.defvjp(_silu_fwd, _silu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _swiglu(x, up, code):
  return _ffi.silu_fwd(x, up, code)


def _swiglu_fwd(x, up, code):
  return _ffi.silu_fwd(x, up, code), (x, up)


def _swiglu_bwd(code, res, dy):
  x, up = res
  return _ffi.silu_bwd(dy, x, up, code)


_swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def silu(x: jax.Array, up: jax.Array | None = None, *,
         variant: str = "default") -> jax.Array:
  """SiLU ``x * sigmoid(x)``, or the SwiGLU activation ``silu(x) * up``.

  Golden: ``jax.nn.silu(x)`` (times ``up``). The KUT of ``silu`` sites
  (``kut(x)`` or ``kut(x, up)``).

  Args:
    x: float32, bfloat16 or float16 array (the gate projection).
    up: None, or the up projection: x's shape and dtype.
    variant: one of ``variants("silu")`` (``swapped`` computes
      ``silu(up) * x``; without ``up`` it is ``default``).

  Returns:
    An array of x's shape and dtype.

  Raises:
    PeatError: unknown variant, dtypes or shapes.
  """
  code = _check_variant("silu", variant)
  if up is None:
    _check_dtypes("silu", x=x)
    return _silu(x, code)
  _check_dtypes("silu", x=x, up=up)
  if jnp.shape(x) != jnp.shape(up):
    raise PeatError(f"native silu: up must have x's shape, got x "
                    f"{jnp.shape(x)} and up {jnp.shape(up)}.")
  return _swiglu(x, up, code)


# -------------------------------------------------------------------- rope


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rope(x, positions, code, theta):
  return _ffi.rope_fwd(x, positions, code, theta)


def _rope_fwd(x, positions, code, theta):
  return _ffi.rope_fwd(x, positions, code, theta), positions


def _rope_bwd(code, theta, positions, dy):
  # positions are integers: no cotangent.
  return _ffi.rope_bwd(dy, positions, code, theta), None


_rope.defvjp(_rope_fwd, _rope_bwd)


def rope(x: jax.Array, positions: jax.Array, theta: float = 10000.0, *,
         variant: str = "default") -> jax.Array:
  """Rotary position embedding of the two halves (GPT-NeoX / Llama-HF).

  With ``h = D // 2``, ``inv_freq[i] = theta ** (-2 i / D)`` and
  ``angle[t, i] = positions[t] * inv_freq[i]`` (float32): ``out[..., :h] =
  x1 * cos - x2 * sin``, ``out[..., h:] = x2 * cos + x1 * sin`` (``x1, x2``
  the halves), float32 inside, rounded once to x's dtype. The KUT of
  ``rope`` sites (``kut(x, positions, *, theta)``; theta may also come
  third positionally, as a model's ``rope(x, positions, theta)`` call
  passes it).

  Args:
    x: (B, T, H, D) float32, bfloat16 or float16, D even.
    positions: int32 (T,), or (B, T) per sequence.
    theta: the rotary base (positive float; ``theta_500k`` ignores it).
    variant: one of ``variants("rope")``.

  Returns:
    An array of x's shape and dtype.

  Raises:
    PeatError: unknown variant, bad theta, dtypes or shapes (odd D,
      positions not of length T).
  """
  code = _check_variant("rope", variant)
  theta = _check_float("rope", "theta", theta)
  if not theta > 0:
    raise PeatError(f"native rope: theta must be positive, got {theta}.")
  _check_dtypes("rope", x=x)
  if jnp.ndim(x) != 4:
    raise PeatError(f"native rope: expected x (B, T, H, D), got shape "
                    f"{jnp.shape(x)}.")
  b, t, _, d = jnp.shape(x)
  if d % 2:
    raise PeatError(f"native rope: the head dim D must be even (two halves "
                    f"rotate), got x {jnp.shape(x)} with D={d}.")
  if not hasattr(positions, "dtype"):
    raise PeatError(f"native rope: positions must be an int32 array, got "
                    f"{type(positions).__name__}.")
  if jnp.dtype(positions.dtype) != jnp.int32:
    raise PeatError(f"native rope: positions has dtype {positions.dtype}; "
                    "expected int32. Cast it with .astype(jnp.int32).")
  if jnp.shape(positions) not in ((t,), (b, t)):
    raise PeatError(f"native rope: positions must be (T,) or (B, T) = "
                    f"({t},) or ({b}, {t}) for x {jnp.shape(x)}, got "
                    f"{jnp.shape(positions)}.")
  return _rope(x, positions, code, theta)


# ------------------------------------------------------------------ broken


def broken(x: jax.Array, w: jax.Array, out: jax.ShapeDtypeStruct, *,
           variant: str) -> jax.Array:
  """A deliberately broken kernel: it crashes, hangs or exhausts memory.

  For reliability tests of campaigns (docs/reliability.md); CPU only. It
  never computes: ``crash_segv`` dies with SIGSEGV, ``crash_abort`` with
  SIGABRT, ``hang`` sleeps until killed, ``oom`` allocates until an
  allocation fails (or its ``PEAT_BROKEN_OOM_CAP_MB`` cap, default 2048) and
  then raises RESOURCE_EXHAUSTED. Run it only in a worker process
  (``peat_jax.profiler.isolation._isolate``): in-process it takes the caller down with it.

  Args:
    x: first operand (any dtype; only passed through).
    w: second operand.
    out: shape and dtype of the result it would have.
    variant: one of ``BROKEN_MODES`` (crash_segv, crash_abort, hang, oom).

  Returns:
    Never returns normally (``oom`` raises at run time).

  Raises:
    PeatError: unknown variant, or not on the CPU.
  """
  if variant not in BROKEN_MODES:
    raise PeatError(f"native broken kernel: unknown variant {variant!r}; "
                    f"expected one of {', '.join(BROKEN_MODES)}.")
  return _ffi.broken_fwd(x, w, out, BROKEN_MODES[variant])


# ---------------------------------------------------------------- registry

KERNELS: dict[str, Callable[..., jax.Array]] = {
    "matmul": matmul,
    "softmax": softmax,
    "layer_norm": layer_norm,
    "conv2d": conv2d,
    "rms_norm": rms_norm,
    "silu": silu,
    "rope": rope,
}


def kut(kernel: str, variant: str = "default",
        **options) -> Callable[..., jax.Array]:
  """Returns a KUT callable with the golden kernel's signature.

  Args:
    kernel: one of ``KERNELS``.
    variant: one of ``variants(kernel)``.
    **options: keyword options of the kernel (e.g. ``tile=16``).

  Returns:
    ``functools.partial(KERNELS[kernel], variant=variant, **options)``.

  Raises:
    PeatError: unknown kernel or variant.
  """
  if kernel not in KERNELS:
    raise PeatError(f"native: unknown kernel {kernel!r}; expected one of "
                    f"{', '.join(KERNELS)}.")
  _check_variant(kernel, variant)
  return functools.partial(KERNELS[kernel], variant=variant, **options)
