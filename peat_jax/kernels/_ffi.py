"""Every XLA FFI call of peat_jax, and the registration of its targets.

This is the one module that touches ``jax.ffi``: loading the shared
libraries (peat_jax's native kernels, and a user's own library named by an
``ffi:`` KUT spec), registering the handler symbols as FFI targets, and the
``ffi_call`` of each forward and backward target. Callers (``native.py``)
validate inputs first; functions here assume valid shapes and dtypes.

Target names are the same on every platform (``peat_matmul_fwd``, ...): the
CPU library registers them for platform ``cpu``, the CUDA library for
``CUDA``, the ROCm library for ``ROCM``. XLA picks the handler registered for
the platform the computation is compiled for, so the Python side selects the
backend by loading the library that matches ``jax``'s default backend.

vmap: every call uses ``vmap_method="broadcast_all"``: operands get the
vmapped dims as equal leading dims, which the handlers treat as batch dims
(matmul and conv2d require equal leading dims on all operands; layer norm
maps a scale row to each group of rows of x).
"""

import ctypes
import importlib.resources
import os
import threading
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.core import PeatError
from peat_jax.kernels import _elf

# Handler symbol in the library -> FFI target name.
_TARGETS = {
    "PeatMatmulFwd": "peat_matmul_fwd",
    "PeatMatmulBwd": "peat_matmul_bwd",
    "PeatSoftmaxFwd": "peat_softmax_fwd",
    "PeatSoftmaxBwd": "peat_softmax_bwd",
    "PeatLayerNormFwd": "peat_layer_norm_fwd",
    "PeatLayerNormBwd": "peat_layer_norm_bwd",
    "PeatConv2dFwd": "peat_conv2d_fwd",
    "PeatConv2dBwd": "peat_conv2d_bwd",
    "PeatRmsNormFwd": "peat_rms_norm_fwd",
    "PeatRmsNormBwd": "peat_rms_norm_bwd",
    "PeatSiluFwd": "peat_silu_fwd",
    "PeatSiluBwd": "peat_silu_bwd",
    "PeatRopeFwd": "peat_rope_fwd",
    "PeatRopeBwd": "peat_rope_bwd",
}

# Targets built for the CPU only: the deliberately broken kernel
# (csrc/broken.cc, reliability tests).
_CPU_ONLY_TARGETS = {"PeatBrokenFwd": "peat_broken_fwd"}

# CPU-only handlers (no CUDA/ROCm version): the Analyzer's statistics pass
# (csrc/signature.cc), registered with the CPU library.
_CPU_TARGETS = {
    "PeatSignature": "peat_signature",
    "PeatSignatureRef": "peat_signature_ref",
    "PeatMedianKept": "peat_median_kept",
}

# FFI platform name -> shared library file in peat_jax/kernels/.
_LIBRARIES = {
    "cpu": "_peat_kernels_cpu.so",
    "CUDA": "_peat_kernels_cuda.so",
    "ROCM": "_peat_kernels_rocm.so",
}

_lock = threading.Lock()
_registered: dict[str, ctypes.CDLL] = {}

_VMAP = "broadcast_all"


def library_path(platform: str) -> str:
  """Returns the path of the native library for an FFI platform.

  Found through ``importlib.resources``, so editable and wheel installs both
  work.

  Args:
    platform: ``"cpu"``, ``"CUDA"`` or ``"ROCM"``.

  Returns:
    The file path (it may not exist; see ``ensure_registered``).
  """
  files = importlib.resources.files("peat_jax.kernels")
  return str(files / _LIBRARIES[platform])


def jax_platform() -> str:
  """The FFI platform of jax's default backend: cpu, CUDA or ROCM."""
  backend = jax.default_backend()
  if backend == "cpu":
    return "cpu"
  if backend in ("cuda", "rocm"):
    return "CUDA" if backend == "cuda" else "ROCM"
  if backend == "gpu":
    version = jax.devices()[0].client.platform_version.lower()
    return "ROCM" if "rocm" in version else "CUDA"
  raise PeatError(
      f"peat_jax native kernels: jax backend {backend!r} is not supported; "
      "expected cpu, cuda or rocm. Run on one of those (e.g. "
      "JAX_PLATFORMS=cpu).")


def ensure_registered(platform: str | None = None) -> str:
  """Loads the native library for ``platform`` and registers its targets once.

  Args:
    platform: FFI platform; default: the one jax runs on.

  Returns:
    The platform registered.

  Raises:
    PeatError: the library was not built (with the command that builds it).
  """
  platform = platform or jax_platform()
  with _lock:
    if platform in _registered:
      return platform
    path = library_path(platform)
    if not os.path.exists(path):
      raise PeatError(
          f"peat_jax native kernels for platform {platform}: library {path} "
          "not found. Rebuild with `pip install --no-build-isolation -e .` "
          "(CUDA: nvcc on PATH or PEAT_BUILD_CUDA=1; ROCm: see BUILD.md).")
    lib = ctypes.cdll.LoadLibrary(path)
    for symbol, target in _TARGETS.items():
      jax.ffi.register_ffi_target(
          target, jax.ffi.pycapsule(getattr(lib, symbol)), platform=platform)
    if platform == "cpu":
      # A library built before signature.cc lacks these; signature_pass
      # says so.
      for symbol, target in _CPU_TARGETS.items():
        if hasattr(lib, symbol):
          jax.ffi.register_ffi_target(
              target, jax.ffi.pycapsule(getattr(lib, symbol)),
              platform=platform)
    if platform == "cpu":
      # A library built before broken.cc lacks these; broken_fwd says so.
      for symbol, target in _CPU_ONLY_TARGETS.items():
        if hasattr(lib, symbol):
          jax.ffi.register_ffi_target(
              target, jax.ffi.pycapsule(getattr(lib, symbol)),
              platform=platform)
    _registered[platform] = lib
    return platform


def _require_cpu_symbol(symbol: str, source: str, what: str = "") -> None:
  """Registers the CPU library's targets; raises where the library was
  built before ``source`` and lacks ``symbol`` (its optional targets are
  registered only when present: ``ensure_registered``)."""
  ensure_registered("cpu")
  if not hasattr(_registered["cpu"], symbol):
    raise PeatError(
        f"the native library {library_path('cpu')} was built without "
        f"{source}{what}; expected a library with {symbol}. Rebuild with "
        "`pip install --no-build-isolation -e .`.")


def _call(target, result_shapes, *args, **attrs):
  ensure_registered()
  return jax.ffi.ffi_call(target, result_shapes, vmap_method=_VMAP)(*args,
                                                                  **attrs)


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def matmul_fwd(a: jax.Array, b: jax.Array, variant: int,
               tile: int) -> jax.Array:
  """c = a @ b for a (..., M, K), b (..., K, N) with equal leading dims."""
  shape = a.shape[:-1] + b.shape[-1:]
  return _call("peat_matmul_fwd", _sds(shape, a.dtype), a, b,
               variant=np.int32(variant), tile=np.int32(tile))


def matmul_bwd(a: jax.Array, b: jax.Array, dc: jax.Array, variant: int,
               tile: int) -> tuple[jax.Array, jax.Array]:
  """(da, db) of c = a @ b given the cotangent dc."""
  return _call("peat_matmul_bwd",
               (_sds(a.shape, a.dtype), _sds(b.shape, b.dtype)), a, b, dc,
               variant=np.int32(variant), tile=np.int32(tile))


def softmax_fwd(x: jax.Array, variant: int, tile: int) -> jax.Array:
  """Softmax over the last axis."""
  return _call("peat_softmax_fwd", _sds(x.shape, x.dtype), x,
               variant=np.int32(variant), tile=np.int32(tile))


def softmax_bwd(y: jax.Array, dy: jax.Array, variant: int,
                tile: int) -> jax.Array:
  """dx from the forward output y and the cotangent dy."""
  return _call("peat_softmax_bwd", _sds(y.shape, y.dtype), y, dy,
               variant=np.int32(variant), tile=np.int32(tile))


def layer_norm_fwd(x: jax.Array, scale: jax.Array, bias: jax.Array,
                   variant: int,
                   eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(y, mean, rstd) of layer norm over the last axis; mean, rstd float32."""
  stats = _sds(x.shape[:-1], jnp.float32)
  return _call("peat_layer_norm_fwd", (_sds(x.shape, x.dtype), stats, stats),
               x, scale, bias, variant=np.int32(variant), eps=np.float32(eps))


def layer_norm_bwd(x: jax.Array, scale: jax.Array, mean: jax.Array,
                   rstd: jax.Array, dy: jax.Array,
                   variant: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(dx, dscale, dbias) of layer norm."""
  return _call("peat_layer_norm_bwd",
               (_sds(x.shape, x.dtype), _sds(scale.shape, scale.dtype),
                _sds(scale.shape, scale.dtype)),
               x, scale, mean, rstd, dy, variant=np.int32(variant))


def conv2d_fwd(x: jax.Array, w: jax.Array, out_hw: tuple[int, int],
               strides: tuple[int, int], pad_tl: tuple[int, int],
               variant: int, tile: int) -> jax.Array:
  """NHWC x HWIO -> NHWC convolution with explicit top/left padding."""
  shape = x.shape[:-3] + tuple(out_hw) + w.shape[-1:]
  return _call("peat_conv2d_fwd", _sds(shape, x.dtype), x, w,
               variant=np.int32(variant), tile=np.int32(tile),
               stride_h=np.int32(strides[0]), stride_w=np.int32(strides[1]),
               pad_top=np.int32(pad_tl[0]), pad_left=np.int32(pad_tl[1]))


def conv2d_bwd(x: jax.Array, w: jax.Array, dy: jax.Array,
               strides: tuple[int, int], pad_tl: tuple[int, int],
               variant: int, tile: int) -> tuple[jax.Array, jax.Array]:
  """(dx, dw) of the convolution given the cotangent dy."""
  return _call("peat_conv2d_bwd",
               (_sds(x.shape, x.dtype), _sds(w.shape, w.dtype)), x, w, dy,
               variant=np.int32(variant), tile=np.int32(tile),
               stride_h=np.int32(strides[0]), stride_w=np.int32(strides[1]),
               pad_top=np.int32(pad_tl[0]), pad_left=np.int32(pad_tl[1]))


def rms_norm_fwd(x: jax.Array, scale: jax.Array, variant: int,
                 eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(y, mean, rstd) of RMS norm over the last axis; mean, rstd float32.

  ``scale`` is (..., D) with rows dividing x's rows; its dtype may differ
  from x's. ``mean`` is the row mean subtracted (variant layer_norm; else 0).
  """
  stats = _sds(x.shape[:-1], jnp.float32)
  return _call("peat_rms_norm_fwd", (_sds(x.shape, x.dtype), stats, stats),
               x, scale, variant=np.int32(variant), eps=np.float32(eps))


def rms_norm_bwd(x: jax.Array, scale: jax.Array, mean: jax.Array,
                 rstd: jax.Array, dy: jax.Array,
                 variant: int) -> tuple[jax.Array, jax.Array]:
  """(dx, dscale) of RMS norm, dscale in scale's dtype."""
  return _call("peat_rms_norm_bwd",
               (_sds(x.shape, x.dtype), _sds(scale.shape, scale.dtype)),
               x, scale, mean, rstd, dy, variant=np.int32(variant))


def silu_fwd(x: jax.Array, up: jax.Array | None, variant: int) -> jax.Array:
  """silu(x), or silu(x) * up (SwiGLU) when ``up`` is given."""
  args = (x,) if up is None else (x, up)
  return _call("peat_silu_fwd", _sds(x.shape, x.dtype), *args,
               variant=np.int32(variant))


def silu_bwd(dy: jax.Array, x: jax.Array, up: jax.Array | None,
             variant: int) -> tuple[jax.Array, ...]:
  """(dx,) or (dx, dup) of :func:`silu_fwd` given the cotangent dy."""
  if up is None:
    return (_call("peat_silu_bwd", _sds(x.shape, x.dtype), dy, x,
                  variant=np.int32(variant)),)
  return tuple(_call("peat_silu_bwd",
                     (_sds(x.shape, x.dtype), _sds(up.shape, up.dtype)),
                     dy, x, up, variant=np.int32(variant)))


def rope_fwd(x: jax.Array, positions: jax.Array, variant: int,
             theta: float) -> jax.Array:
  """Rotary embedding of x (..., T, H, D) at int32 positions (..., T)."""
  return _call("peat_rope_fwd", _sds(x.shape, x.dtype), x, positions,
               variant=np.int32(variant), theta=np.float32(theta))


def rope_bwd(dy: jax.Array, positions: jax.Array, variant: int,
             theta: float) -> jax.Array:
  """dx of :func:`rope_fwd`: the inverse rotation of dy."""
  return _call("peat_rope_bwd", _sds(dy.shape, dy.dtype), dy, positions,
               variant=np.int32(variant), theta=np.float32(theta))


def broken_fwd(x: jax.Array, w: jax.Array, out: jax.ShapeDtypeStruct,
               mode: int) -> jax.Array:
  """The deliberately broken kernel: crashes, hangs or exhausts memory.

  CPU only (csrc/broken.cc). ``out`` is the golden output's shape and dtype;
  the kernel never computes it.
  """
  if jax_platform() != "cpu":
    raise PeatError(
        f"the deliberately broken kernels are built for the CPU only; jax "
        f"runs on {jax.default_backend()}. Run them with JAX_PLATFORMS=cpu.")
  _require_cpu_symbol("PeatBrokenFwd", "csrc/broken.cc")
  return _call("peat_broken_fwd", out, x, w, mode=np.int32(mode))


# Slots of the statistics pass's int32 output (csrc/signature.h).
SIGNATURE_FLAG_SLOTS = 32
SIGNATURE_REF_COUNTS = 7
SIGNATURE_FLOATS = 22
SIGNATURE_HIST = 1024
SIGNATURE_SAMPLE_COUNTS = 12


def signature_pass(t: jax.Array, g: jax.Array, ref_hi: jax.Array | None,
                   ref_lo: jax.Array | None, dims: jax.Array | None = None,
                   *, rows_cap: int | None = None, cols_cap: int | None = None,
                   tiles_cap: int | None = None) -> tuple[jax.Array, ...]:
  """The Analyzer's one-pass statistics of an (R, C) record (CPU only).

  Args:
    t: test record, float32, bfloat16, float16 or float64: shape (R, C),
      or any shape whose first R * C elements (row-major) are the record
      and the rest padding (a size bucket; ``dims`` gives R and C).
    g: golden record, same dtype and shape.
    ref_hi: None, or the float32 high half of the reference, t's shape.
    ref_lo: None, or the float32 low half (reference = ref_hi + ref_lo).
    dims: int32[2] (R, C), traced or not; default t's 2-D shape.
    rows_cap, cols_cap, tiles_cap: lengths of the row, column and tile
      outputs (at least R, C and (R // 8) * (C // 8); zero beyond), default
      those of t's 2-D shape.

  Returns:
    (ints int32[32 + 3 * nbits + 7], hashes uint32[4], floats c[22],
    row_ndiff int32[rows_cap], row_abs_max c[rows_cap], row_abs_sum
    c[rows_cap], row_abs_sqs c[rows_cap], col_ndiff int32[cols_cap],
    col_abs_sum c[cols_cap], tile_ndiff int32[tiles_cap] holding the
    (R // 8, C // 8) tiles row-major then zeros, hist_abs int32[1024], hist_rel int32[1024], sample_counts
    int32[12]) with c float64 for float64 records, else float32; layouts
    in csrc/signature.h.
  """
  _require_cpu_symbol("PeatSignature", "csrc/signature.cc",
                      " (the Analyzer's CPU statistics pass)")
  if dims is None:
    rows, cols = t.shape
    dims = np.array([rows, cols], np.int32)
  rows = rows_cap if rows_cap is not None else t.shape[0]
  cols = cols_cap if cols_cap is not None else t.shape[-1]
  tiles = (tiles_cap if tiles_cap is not None
           else (t.shape[0] // 8) * (t.shape[-1] // 8))
  nbits = jnp.dtype(t.dtype).itemsize * 8
  cdt = jnp.float64 if t.dtype == jnp.float64 else jnp.float32
  i32 = jnp.int32
  outs = (
      _sds((SIGNATURE_FLAG_SLOTS + 3 * nbits + SIGNATURE_REF_COUNTS,), i32),
      _sds((4,), jnp.uint32), _sds((SIGNATURE_FLOATS,), cdt),
      _sds((rows,), i32), _sds((rows,), cdt), _sds((rows,), cdt),
      _sds((rows,), cdt), _sds((cols,), i32), _sds((cols,), cdt),
      _sds((tiles,), i32), _sds((SIGNATURE_HIST,), i32),
      _sds((SIGNATURE_HIST,), i32), _sds((SIGNATURE_SAMPLE_COUNTS,), i32))
  dims = jnp.asarray(dims, i32)
  if ref_hi is None:
    return jax.ffi.ffi_call("peat_signature", outs,
                            vmap_method="sequential")(t, g, dims)
  return jax.ffi.ffi_call("peat_signature_ref", outs,
                          vmap_method="sequential")(t, g, ref_hi, ref_lo,
                                                    dims)


def median_kept(*xs: jax.Array) -> jax.Array:
  """The exact median of each float64 array's kept elements (CPU only).

  ``np.median(x[~np.isnan(x)])`` of every ``x`` bit for bit (the mean of
  the two middle elements for an even count, +inf where nothing is kept),
  in one native call whose arrays are shared among XLA's intra-op threads
  (csrc/median.cc), traced: the port probe's ratios never leave the
  device.

  Args:
    *xs: float64 arrays, NaN where an element is not kept; the kept ones
      non-negative (+inf allowed).

  Returns:
    float64[len(xs)]: the medians, in order.

  Raises:
    PeatError: no array, an array that is not float64, or a library built
      without csrc/median.cc. A negative kept element fails the call
      (XLA's error names the input).
  """
  if not xs:
    raise PeatError("median_kept of no array; pass one or more float64 "
                    "arrays")
  bad = [i for i, x in enumerate(xs) if jnp.dtype(x.dtype) != jnp.float64]
  if bad:
    raise PeatError(
        f"median_kept: inputs {bad} are {[str(xs[i].dtype) for i in bad]}; "
        "expected float64 (trace with jax.enable_x64(True))")
  _require_cpu_symbol("PeatMedianKept", "csrc/median.cc")
  return jax.ffi.ffi_call("peat_median_kept",
                          _sds((len(xs),), jnp.float64),
                          vmap_method="sequential")(*xs)


# ------------------------------------------------- a user's own library

_user_libraries: dict[str, tuple[ctypes.CDLL, dict[str, str]]] = {}


def load_user_library(path: str, symbols, platform: str | None = None
                      ) -> dict[str, str]:
  """Loads a user's XLA FFI library and registers handler symbols as targets.

  Each symbol (a handler defined with ``XLA_FFI_DEFINE_HANDLER_SYMBOL``) is
  registered once per process under a target name unique to the library's
  path, so two libraries may use the same symbol names.

  Args:
    path: absolute path of the shared library.
    symbols: handler symbol names in it.
    platform: FFI platform; default: the one jax runs on.

  Returns:
    ``{symbol: target name}`` of the registered symbols.

  Raises:
    PeatError: the library cannot be loaded, lacks a symbol, or shows no
      code for a GPU ``platform`` (:func:`check_user_platform`).
  """
  platform = platform or jax_platform()
  with _lock:
    lib, targets = _user_libraries.get(path, (None, {}))
    if lib is None:
      check_user_platform(path, platform)
      try:
        lib = ctypes.cdll.LoadLibrary(path)
      except OSError as err:
        raise PeatError(
            f"ffi KUT: cannot load {path} ({err}); expected a shared "
            "library built for this machine with -shared -fPIC against "
            "jax.ffi.include_dir() (docs/kernels.md)") from err
    for symbol in symbols:
      if symbol in targets:
        continue
      if not hasattr(lib, symbol):
        raise PeatError(
            f"ffi KUT: {path} has no symbol {symbol!r}; expected a handler "
            f"defined with XLA_FFI_DEFINE_HANDLER_SYMBOL({symbol}, ...) and "
            f"exported (list them with `nm -D --defined-only {path}`)")
      digest = zlib.crc32(path.encode()) & 0xFFFFFFFF
      target = f"peat_user_{digest:08x}_{symbol}"
      jax.ffi.register_ffi_target(
          target, jax.ffi.pycapsule(getattr(lib, symbol)), platform=platform)
      targets[symbol] = target
    _user_libraries[path] = (lib, targets)
    return {s: targets[s] for s in symbols}


_PLATFORM_WORDS = {"CUDA": "CUDA", "ROCM": "ROCm"}


def check_user_platform(path: str, platform: str) -> None:
  """Refuses a user's library that holds no code for a GPU ``platform``.

  XLA would give its handlers that platform's device buffers: a CPU
  handler reads them as host memory and crashes the process, where this
  names the problem before anything is registered (``peat_jax.kernels._elf``
  says what counts as GPU code). The CPU platform takes any library.

  Args:
    path: the library's file.
    platform: the FFI platform it would be registered for.

  Raises:
    PeatError: ``platform`` is CUDA or ROCM and the file shows neither
      device code nor a runtime library of it, or is no 64-bit ELF file.
  """
  if platform == "cpu":
    return
  try:
    code = _elf.library_code(path)
  except (OSError, ValueError) as err:
    raise PeatError(f"ffi KUT: cannot read {path} as a shared library "
                    f"({err}); expected one built for this machine "
                    "(docs/kernels.md)") from None
  if code.serves(platform):
    return
  word = _PLATFORM_WORDS.get(platform, platform)
  tool = "nvcc" if platform == "CUDA" else "hipcc"
  raise PeatError(
      f"ffi KUT: {path} holds no {word} code (no device fat binary, no "
      f"{word} runtime library among its needed libraries) but jax "
      f"computes on {word}: XLA would hand its handlers {word} device "
      "buffers, which a CPU handler reads as host memory, crashing the "
      "process. Run on the CPU (JAX_PLATFORMS=cpu), or build the handlers "
      f"for {word} with {tool} (kernels that take the call's stream, "
      "ffi::PlatformStream; docs/kernels.md)")


def user_call(target: str, result_shapes, *args, **attrs):
  """``ffi_call`` of a user's target (see :func:`load_user_library`).

  ``vmap_method="sequential"``: the user's handler need not know batching.
  """
  return jax.ffi.ffi_call(target, result_shapes,
                          vmap_method="sequential")(*args, **attrs)
