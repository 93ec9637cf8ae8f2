"""Held-out Detector calibration: a test split that nobody tunes on.

The calibration that the Detector's thresholds were tuned on
(:func:`~peat_jax.detector.run_calibration`) draws its errors from the
project's injectors on captured model activations. This module is a second
generator, written apart from it, so that its numbers say how the Detector
does on errors and inputs it has never seen:

* inputs are drawn fresh from a seeded :func:`numpy.random.default_rng`,
  from distributions unlike captured activations (Student-t with 3 degrees
  of freedom, lognormal-scaled rows, post-ReLU sparse, LLM-like outlier
  channels, magnitudes near 1e-3, mean-offset rows for the norms, and a
  matmul with rows near 1e-38);
* a *base* is the golden computation or a benign / precision behaviour of
  it, emulated here in NumPy and jax.numpy (another summation order, TF32
  operands, bf16 outputs, fp16 inputs and outputs);
* a *fault* is planted on a base's output by the functions below (bit
  flips, a stuck bit, random values, a zeroed or rolled row, a scale,
  subnormals flushed, the wrong activation formula).

Every base output, and every base output with every fault that changes it,
is diagnosed through the public analysis (``peat.analyze`` and
``peat.detect``) or the playback path (``_calibration.diagnose`` with the
port probe), and comes back as :class:`CalibrationRecord` rows.
:func:`heldout_tables` renders the accuracies as Markdown;
benchmarks/detector_heldout.py is the command line.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.core import PeatError
from peat_jax.detector.calibration import _calibration
from peat_jax.detector import hypotheses as _detect

#: The record's origin field for every held-out case.
ORIGIN = "heldout"
#: The diagnosis paths :func:`run_heldout` knows.
PATHS = ("output", "probe")
#: The dtypes a held-out run computes the golden kernels in.
DTYPES = ("float32", "bfloat16")
#: The Profiler's site kind of each held-out kernel (the Detector's
#: context); composites are their own kind.
SITE_KIND = {"matmul": "dot_general", "conv": "conv_general_dilated"}
#: Magnitudes below this (float32's smallest normal, 1.18e-38, rounded up)
#: are what the flush-to-zero fault sets to zero.
FLUSH_BELOW = 1.2e-38
#: The predicted names that count as the right name for a wrong formula.
FORMULA_FAMILIES = ("approximation", "parameter")

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(jnp.bfloat16)


class HeldoutCase(NamedTuple):
  """One kernel call of the held-out split.

  Attributes:
    kernel: the kernel (``matmul``, ``softmax``, ``layer_norm``,
      ``rms_norm``, ``gelu``, ``silu``, ``conv``).
    source: a name of the case: its layout, distribution and sizes.
    golden_fn: the golden computation on the inputs (jax.numpy).
    inputs: its positional arguments, float32 arrays (and an epsilon).
    reduction: the length of the reduction (None for elementwise kernels).
    reference_fn: the float64 reference of ``golden_fn`` on inputs
      (``peat.analyzer.reference`` of it).
  """

  kernel: str
  source: str
  golden_fn: Callable[..., jax.Array]
  inputs: tuple[Any, ...]
  reduction: int | None
  reference_fn: Callable[..., np.ndarray]


class Base(NamedTuple):
  """A benign or precision behaviour of the golden computation.

  Attributes:
    name: the base's name (the record's ``base``).
    expected: the Detector's name for the base alone.
    kernels: the kernels it applies to.
    dtypes: the dtypes it applies to.
    fn: ``fn(case, inputs) -> output`` (inputs in the run's dtype).
  """

  name: str
  expected: str
  kernels: tuple[str, ...]
  dtypes: tuple[str, ...]
  fn: Callable[[HeldoutCase, tuple], np.ndarray]


class Fault(NamedTuple):
  """A fault planted on a base's output.

  Attributes:
    name: the fault's name (its family in the tables).
    expected: the Detector's name for it.
    kernels: the kernels it applies to (None: every kernel).
    apply: ``apply(rng, out) -> (faulted, detail)``; None for a fault that
      recomputes the base (``wrong_formula``).
  """

  name: str
  expected: str
  kernels: tuple[str, ...] | None
  apply: Callable[[np.random.Generator, np.ndarray],
                  tuple[np.ndarray, str]] | None


# ------------------------------------------------------------ bit helpers


def _uint(dtype: np.dtype) -> type:
  """The unsigned integer type of a float's width.

  Raises:
    PeatError: not a 16- or 32-bit float.
  """
  dtype = np.dtype(dtype)
  if dtype.itemsize == 4:
    return np.uint32
  if dtype.itemsize == 2:
    return np.uint16
  raise PeatError(f"held-out faults need a 16- or 32-bit float, got {dtype}. "
                  "Fix: run with dtypes float32 or bfloat16.")


def _bits(x: np.ndarray) -> np.ndarray:
  """A copy of ``x``'s bit patterns as unsigned integers."""
  return np.array(x).view(_uint(x.dtype))


def _float_of(bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """The floats of the bit patterns ``bits`` in ``dtype``."""
  return bits.view(np.dtype(dtype))


def _check_mode(mode: str) -> None:
  """Raises PeatError unless ``mode`` is ``rne`` or ``rtz``."""
  if mode not in ("rne", "rtz"):
    raise PeatError(f"unknown rounding mode {mode!r}. Fix: use 'rne' (round "
                    "to nearest even) or 'rtz' (toward zero).")


def _round_low_bits(x: np.ndarray, drop: int, mode: str) -> np.ndarray:
  """float32 ``x`` with its ``drop`` low mantissa bits rounded away.

  Args:
    x: a float32 array.
    drop: how many low mantissa bits become zero.
    mode: ``rne`` (nearest, ties to even) or ``rtz`` (toward zero).

  Returns:
    float32 array, low ``drop`` bits zero.

  Raises:
    PeatError: unknown mode.
  """
  _check_mode(mode)
  u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  keep = np.uint64((0xFFFFFFFF >> drop) << drop)
  if mode == "rne":
    half = np.uint64((1 << (drop - 1)) - 1)
    u = u + half + ((u >> np.uint64(drop)) & np.uint64(1))
  return (u & keep).astype(np.uint32).view(np.float32)


def round_tf32(x: np.ndarray, mode: str = "rne") -> np.ndarray:
  """float32 ``x`` rounded to TF32 (10 explicit mantissa bits).

  Args:
    x: a float32 array.
    mode: ``rne`` (``(u + 0xFFF + ((u >> 13) & 1)) & ~0x1FFF``) or ``rtz``
      (``u & ~0x1FFF``, never a larger magnitude).

  Returns:
    float32 array whose low 13 bits are zero.

  Raises:
    PeatError: unknown mode.
  """
  return _round_low_bits(x, 13, mode)


def round_bf16(x: np.ndarray, mode: str = "rne") -> np.ndarray:
  """float32 ``x`` rounded to bf16 (7 explicit mantissa bits), kept float32.

  Args:
    x: a float32 array.
    mode: ``rne`` or ``rtz``.

  Returns:
    float32 array whose low 16 bits are zero.

  Raises:
    PeatError: unknown mode.
  """
  return _round_low_bits(x, 16, mode)


# ------------------------------------------------------- golden functions


def _f32(x: jax.Array) -> jax.Array:
  """``x`` in float32 when it is narrower (else ``x``)."""
  return x.astype(jnp.float32) if jnp.finfo(x.dtype).bits < 32 else x


def matmul_nn(a: jax.Array, b: jax.Array) -> jax.Array:
  """``a @ b`` for ``a`` [M, K] and ``b`` [K, N]."""
  return jnp.matmul(a, b)


def matmul_nt(a: jax.Array, bt: jax.Array) -> jax.Array:
  """``a @ bt.T`` for ``a`` [M, K] and ``bt`` [N, K]."""
  return jnp.matmul(a, bt.T)


def matmul_batched(a: jax.Array, b: jax.Array) -> jax.Array:
  """The batched einsum ``bmk,bkn->bmn``."""
  return jnp.einsum("bmk,bkn->bmn", a, b)


#: (a's, b's) contracted axis of each matmul layout.
CONTRACTED = {matmul_nn: (-1, -2), matmul_nt: (-1, -1),
              matmul_batched: (-1, -2)}


def softmax(x: jax.Array) -> jax.Array:
  """Softmax over the last axis (float32 inside, rounded once)."""
  return jax.nn.softmax(_f32(x), axis=-1).astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
               eps: float) -> jax.Array:
  """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis."""
  xf = _f32(x)
  mean = jnp.mean(xf, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
  y = (xf - mean) * lax.rsqrt(var + eps) * _f32(scale) + _f32(bias)
  return y.astype(x.dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """``x / sqrt(mean(x^2) + eps) * scale`` over the last axis."""
  xf = _f32(x)
  ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
  return (xf * lax.rsqrt(ms + eps) * _f32(scale)).astype(x.dtype)


def gelu(x: jax.Array) -> jax.Array:
  """GELU in its erf form, ``x * Phi(x)``."""
  return jax.nn.gelu(_f32(x), approximate=False).astype(x.dtype)


def silu(x: jax.Array) -> jax.Array:
  """SiLU, ``x * sigmoid(x)``."""
  return jax.nn.silu(_f32(x)).astype(x.dtype)


def conv_nhwc(x: jax.Array, w: jax.Array) -> jax.Array:
  """A stride-1 SAME convolution, NHWC input and HWIO filter."""
  return lax.conv_general_dilated(
      x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


#: The other activation of each activation (the wrong formula).
OTHER_FORMULA = {gelu: silu, silu: gelu}


# ------------------------------------------------------------ input draws


def draw(rng: np.random.Generator, dist: str,
         shape: tuple[int, ...]) -> np.ndarray:
  """float32 samples of one held-out distribution.

  Args:
    rng: the seeded generator.
    dist: ``student_t`` (df 3), ``lognormal`` (normal rows scaled by
      lognormal factors), ``relu_sparse`` (``max(N(0, 1) - 0.5, 0)``),
      ``outlier_channels`` (normal, 3 last-axis columns 50x larger),
      ``small`` (normal times 1e-3) or ``offset_rows`` (normal rows shifted
      by a mean in [-20, 20]).
    shape: the sample's shape.

  Returns:
    float32 array of ``shape``.

  Raises:
    PeatError: unknown distribution.
  """
  row = shape[:-1] + (1,)
  if dist == "student_t":
    x = rng.standard_t(3, shape)
  elif dist == "lognormal":
    x = rng.standard_normal(shape) * rng.lognormal(0.0, 1.0, row)
  elif dist == "relu_sparse":
    x = np.maximum(rng.standard_normal(shape) - 0.5, 0.0)
  elif dist == "outlier_channels":
    x = rng.standard_normal(shape)
    x[..., rng.choice(shape[-1], 3, replace=False)] *= 50.0
  elif dist == "small":
    x = rng.standard_normal(shape) * 1e-3
  elif dist == "offset_rows":
    x = rng.standard_normal(shape) + rng.uniform(-20.0, 20.0, row)
  else:
    raise PeatError(f"unknown held-out distribution {dist!r}. Fix: use one "
                    "of student_t, lognormal, relu_sparse, outlier_channels, "
                    "small, offset_rows.")
  return x.astype(np.float32)


# ------------------------------------------------------------------ cases


def _case(kernel: str, source: str, fn: Callable[..., jax.Array],
          inputs: tuple, reduction: int | None) -> HeldoutCase:
  """A HeldoutCase whose reference is ``fn``'s float64 run."""
  return HeldoutCase(kernel, source, fn, inputs, reduction,
                     functools.partial(_analyzer.reference, fn))


def matmul_case(rng: np.random.Generator, layout: str, dims: tuple[int, ...],
                dists: tuple[str, str]) -> HeldoutCase:
  """One matmul of a layout.

  Args:
    rng: the seeded generator.
    layout: ``nn`` (a @ b), ``nt`` (a @ b.T) or ``batched`` (einsum).
    dims: (M, K, N), or (B, M, K, N) for ``batched``.
    dists: the distributions of a and b.

  Returns:
    The case; b is scaled by 1 / sqrt(K).

  Raises:
    PeatError: unknown layout.
  """
  shapes = {"nn": lambda m, k, n: ((m, k), (k, n)),
            "nt": lambda m, k, n: ((m, k), (n, k)),
            "batched": lambda bt, m, k, n: ((bt, m, k), (bt, k, n))}
  fns = {"nn": matmul_nn, "nt": matmul_nt, "batched": matmul_batched}
  if layout not in shapes:
    raise PeatError(f"unknown matmul layout {layout!r}. Fix: use nn, nt or "
                    "batched.")
  sa, sb = shapes[layout](*dims)
  k = sa[-1]
  a = draw(rng, dists[0], sa)
  b = (draw(rng, dists[1], sb) / np.float32(math.sqrt(k))).astype(np.float32)
  name = f"matmul_{layout}_{dists[0]}_k{k}_n{dims[-1]}"
  return _case("matmul", name, fns[layout], (a, b), k)


def tiny_matmul_case(rng: np.random.Generator) -> HeldoutCase:
  """A matmul with one row of ``a`` scaled by 1e-38 and another by 1e-37
  (those output rows near 1e-39..1e-36, the first about half subnormal:
  what flushing to zero removes).

  Args:
    rng: the seeded generator.

  Returns:
    The case (K 200, N 33; b scaled by 1 / sqrt(K)).
  """
  a = draw(rng, "student_t", (32, 200))
  b = (draw(rng, "student_t", (200, 33))
       / np.float32(math.sqrt(200))).astype(np.float32)
  rows = rng.choice(32, 2, replace=False)
  a[rows[0]] *= np.float32(1e-38)
  a[rows[1]] *= np.float32(1e-37)
  return _case("matmul", "matmul_nn_tiny_rows_k200_n33", matmul_nn, (a, b),
               200)


def softmax_case(rng: np.random.Generator, dist: str, rows: int,
                 length: int) -> HeldoutCase:
  """Softmax over rows of ``length`` logits (float32 storage).

  Args:
    rng: the seeded generator.
    dist: the logits' distribution.
    rows: how many rows.
    length: the row length (the reduction).

  Returns:
    The case.
  """
  x = draw(rng, dist, (rows, length)) * np.float32(2.0)
  return _case("softmax", f"softmax_{dist}_len{length}", softmax, (x,),
               length)


def _norm_params(rng: np.random.Generator, d: int) -> tuple:
  """A norm's scale (near 1) and bias (near 0), float32 [d]."""
  scale = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
  bias = (0.1 * rng.standard_normal(d)).astype(np.float32)
  return scale, bias


def norm_case(kind: str, rng: np.random.Generator, dist: str, rows: int,
              d: int) -> HeldoutCase:
  """A layer norm (eps 1e-5) or RMS norm (eps 1e-6) over rows of ``d``.

  Args:
    kind: ``layer_norm`` or ``rms_norm``.
    rng: the seeded generator.
    dist: the input's distribution.
    rows: how many rows.
    d: the normalized length.

  Returns:
    The case; inputs ``(x, scale, bias, 1e-5)`` or ``(x, scale, 1e-6)``.
  """
  x = draw(rng, dist, (rows, d))
  scale, bias = _norm_params(rng, d)
  if kind == "layer_norm":
    fn, inputs = layer_norm, (x, scale, bias, 1e-5)
  else:
    fn, inputs = rms_norm, (x, scale, 1e-6)
  return _case(kind, f"{kind}_{dist}_d{d}", fn, inputs, d)


def activation_case(rng: np.random.Generator, kernel: str, dist: str,
                    shape: tuple[int, int]) -> HeldoutCase:
  """GELU (erf form) or SiLU on one input.

  Args:
    rng: the seeded generator.
    kernel: ``gelu`` or ``silu``.
    dist: the input's distribution.
    shape: the input's shape.

  Returns:
    The case (no reduction).

  Raises:
    PeatError: an unknown activation.
  """
  fns = {"gelu": gelu, "silu": silu}
  if kernel not in fns:
    raise PeatError(f"unknown activation {kernel!r}. Fix: use gelu or silu.")
  x = draw(rng, dist, shape) * np.float32(2.0)
  return _case(kernel, f"{kernel}_{dist}_{shape[0]}x{shape[1]}", fns[kernel],
               (x,), None)


def conv_case(rng: np.random.Generator, dist: str, x_shape: tuple[int, ...],
              out_channels: int) -> HeldoutCase:
  """A 3x3 NHWC convolution (lax.conv_general_dilated).

  Args:
    rng: the seeded generator.
    dist: the input's distribution.
    x_shape: (N, H, W, C) of the input.
    out_channels: the filter's output channels.

  Returns:
    The case; the reduction is 9 C.
  """
  x = draw(rng, dist, x_shape)
  c = x_shape[-1]
  w = (draw(rng, "student_t", (3, 3, c, out_channels))
       / np.float32(math.sqrt(9 * c))).astype(np.float32)
  return _case("conv", f"conv_nhwc_{dist}_c{c}_o{out_channels}", conv_nhwc,
               (x, w), 9 * c)


def heldout_cases(seed: int) -> list[HeldoutCase]:
  """The held-out split's cases, inputs drawn fresh for ``seed``.

  Args:
    seed: the seed of ``np.random.default_rng``; the same seed gives
      bitwise the same inputs.

  Returns:
    The cases (each array under 300k elements): seven matmuls (three
    layouts, K 96..2048, odd N), three softmaxes, two layer norms, two RMS
    norms, three GELUs, two SiLUs and two convolutions.
  """
  rng = np.random.default_rng(seed)
  return [
      matmul_case(rng, "nn", (48, 96, 17), ("student_t", "student_t")),
      matmul_case(rng, "nt", (40, 200, 33), ("lognormal", "student_t")),
      matmul_case(rng, "batched", (3, 16, 768, 33), ("small", "student_t")),
      matmul_case(rng, "nn", (24, 1000, 130), ("relu_sparse", "student_t")),
      matmul_case(rng, "nt", (16, 2048, 33),
                  ("outlier_channels", "student_t")),
      matmul_case(rng, "nn", (16, 768, 130), ("outlier_channels",
                                              "lognormal")),
      tiny_matmul_case(rng),
      softmax_case(rng, "student_t", 32, 77),
      softmax_case(rng, "lognormal", 24, 130),
      softmax_case(rng, "outlier_channels", 16, 500),
      norm_case("layer_norm", rng, "offset_rows", 16, 768),
      norm_case("layer_norm", rng, "outlier_channels", 32, 200),
      norm_case("rms_norm", rng, "student_t", 16, 1000),
      norm_case("rms_norm", rng, "offset_rows", 40, 130),
      activation_case(rng, "gelu", "student_t", (64, 130)),
      activation_case(rng, "gelu", "outlier_channels", (32, 200)),
      activation_case(rng, "gelu", "relu_sparse", (48, 77)),
      activation_case(rng, "silu", "lognormal", (48, 200)),
      activation_case(rng, "silu", "small", (32, 77)),
      conv_case(rng, "student_t", (2, 12, 12, 16), 17),
      conv_case(rng, "relu_sparse", (2, 10, 10, 32), 33),
  ]


# ------------------------------------------------------------------ bases


def _is_array(x: Any) -> bool:
  """Whether ``x`` is an array argument (not an epsilon)."""
  return hasattr(x, "dtype") and np.ndim(x) > 0


def cast_inputs(inputs: tuple, dtype: str) -> tuple:
  """The case's array inputs in ``dtype`` (constants unchanged).

  Args:
    inputs: a case's inputs (float32 arrays and constants).
    dtype: ``float32``, ``bfloat16`` or ``float16``.

  Returns:
    The inputs, arrays cast to ``dtype`` (host NumPy arrays).
  """
  target = np.dtype(jnp.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
  return tuple(np.asarray(x).astype(target) if _is_array(x) else x
               for x in inputs)


def run_golden(fn: Callable[..., jax.Array], inputs: tuple) -> np.ndarray:
  """``fn`` on the inputs, as a host array.

  Args:
    fn: a golden function.
    inputs: its arguments (host arrays and constants).

  Returns:
    The output as a NumPy array in the computation's dtype.
  """
  args = [jnp.asarray(x) if _is_array(x) else x for x in inputs]
  return np.asarray(jax.device_get(fn(*args)))


def base_exact(case: HeldoutCase, inputs: tuple) -> np.ndarray:
  """The golden output itself."""
  return run_golden(case.golden_fn, inputs)


def base_reordered(case: HeldoutCase, inputs: tuple) -> np.ndarray:
  """The matmul with its K sum split into 4 chunks, each chunk's product in
  float32, the chunks summed in float32 last to first.

  Args:
    case: a matmul case.
    inputs: ``(a, b)`` in the run's dtype.

  Returns:
    The output in the run's dtype.

  Raises:
    PeatError: not a matmul layout.
  """
  if case.golden_fn not in CONTRACTED:
    raise PeatError(f"the reordered base needs a matmul case, got "
                    f"{case.source}. Fix: apply it to kernel 'matmul'.")
  a, b = inputs[:2]
  ka, kb = CONTRACTED[case.golden_fn]
  chunks = np.array_split(np.arange(a.shape[ka]), 4)
  parts = [run_golden(case.golden_fn, (
      np.take(a, c, axis=ka).astype(np.float32),
      np.take(b, c, axis=kb).astype(np.float32))) for c in chunks]
  total = parts[-1]
  for p in parts[-2::-1]:
    total = (total + p).astype(np.float32)
  return total.astype(a.dtype)


def _base_tf32(mode: str) -> Callable[[HeldoutCase, tuple], np.ndarray]:
  """The base that rounds every operand to TF32 (``mode``) first."""

  def fn(case: HeldoutCase, inputs: tuple) -> np.ndarray:
    rounded = tuple(round_tf32(x, mode) if _is_array(x) else x
                    for x in inputs)
    return run_golden(case.golden_fn, rounded)
  return fn


def _base_bf16_out(mode: str) -> Callable[[HeldoutCase, tuple], np.ndarray]:
  """The base that rounds the float32 output to bf16 (``mode``)."""

  def fn(case: HeldoutCase, inputs: tuple) -> np.ndarray:
    return round_bf16(run_golden(case.golden_fn, inputs), mode)
  return fn


def base_fp16_io(case: HeldoutCase, inputs: tuple) -> np.ndarray:
  """The kernel on fp16 inputs with an fp16 output, cast back to float32."""
  out = run_golden(case.golden_fn, cast_inputs(inputs, "float16"))
  return out.astype(np.float32)


_MATMULS = ("matmul", "conv")
_ALL = ("matmul", "softmax", "layer_norm", "rms_norm", "gelu", "silu", "conv")

#: The bases, by name.
BASES = {b.name: b for b in (
    Base("exact", "exact", _ALL, DTYPES, base_exact),
    Base("reordered", "reordering", ("matmul",), DTYPES, base_reordered),
    Base("tf32_rne", "precision:tf32", _MATMULS, ("float32",),
         _base_tf32("rne")),
    Base("tf32_rtz", "precision:tf32", _MATMULS, ("float32",),
         _base_tf32("rtz")),
    Base("bf16_out_rne", "precision:bf16", ("softmax", "gelu"), ("float32",),
         _base_bf16_out("rne")),
    Base("bf16_out_rtz", "precision:bf16", ("softmax", "gelu"), ("float32",),
         _base_bf16_out("rtz")),
    Base("fp16_io", "precision:fp16", ("gelu", "silu"), ("float32",),
         base_fp16_io),
)}


# ----------------------------------------------------------------- faults

#: Bits a flip may hit: the exponent and the top 3 mantissa bits.
_FLIP_BITS = {4: tuple(range(20, 31)), 2: tuple(range(4, 15))}
#: Bits a stuck-at-1 fault may hold: top mantissa bits, low exponent bits.
_STUCK_BITS = {4: tuple(range(17, 25)), 2: tuple(range(1, 9))}


def _rows(x: np.ndarray) -> np.ndarray:
  """``x`` as [rows, last axis] (a view)."""
  return x.reshape(-1, x.shape[-1])


def _large_elements(out: np.ndarray) -> np.ndarray:
  """Flat indices of the nonzero elements at or above the median nonzero
  magnitude (where a flip is not hidden by the row's rounding)."""
  mag = np.abs(out.astype(np.float64)).ravel()
  nonzero = np.flatnonzero(mag > 0)
  if not nonzero.size:
    return np.arange(mag.size)
  return nonzero[mag[nonzero] >= np.median(mag[nonzero])]


def _flip(rng: np.random.Generator, out: np.ndarray, elements: int,
          bits: int) -> tuple[np.ndarray, str]:
  """``bits`` distinct bits flipped in each of ``elements`` large elements,
  every result finite.

  Args:
    rng: the fault's generator.
    out: a base output (float32 or bf16).
    elements: how many elements.
    bits: how many bits in each.

  Returns:
    (faulted output, description).
  """
  u = _bits(out).ravel()
  where = rng.choice(_large_elements(out), elements, replace=False)
  hit = []
  for i in where:
    for _ in range(16):  # an exponent flip into Inf/NaN: other bits
      chosen = rng.choice(_FLIP_BITS[out.dtype.itemsize], bits, replace=False)
      mask = sum(1 << int(b) for b in chosen)
      v = u[i] ^ u.dtype.type(mask)
      if np.isfinite(_float_of(np.array([v]), out.dtype)[0].astype(np.float32)):
        u[i] = v
        hit.append(sorted(int(b) for b in chosen))
        break
  detail = f"{len(hit)} element(s), bits {hit}"
  return _float_of(u, out.dtype).reshape(out.shape), detail


def fault_bitflip(rng: np.random.Generator,
                  out: np.ndarray) -> tuple[np.ndarray, str]:
  """One exponent or top-mantissa bit flipped in each of 1-3 elements."""
  return _flip(rng, out, int(rng.integers(1, 4)), 1)


def fault_bitflip_multi(rng: np.random.Generator,
                        out: np.ndarray) -> tuple[np.ndarray, str]:
  """Three bits flipped in each of 5 elements."""
  return _flip(rng, out, 5, 3)


def fault_stuck_at(rng: np.random.Generator,
                   out: np.ndarray) -> tuple[np.ndarray, str]:
  """One mantissa or exponent bit forced to 1 in 30% of the elements."""
  bit = int(rng.choice(_STUCK_BITS[out.dtype.itemsize]))
  u = _bits(out)
  hit = rng.random(out.shape) < 0.3
  u[hit] |= u.dtype.type(1 << bit)
  return _float_of(u, out.dtype), f"bit {bit} forced to 1 in {hit.mean():.0%}"


def fault_random_value(rng: np.random.Generator,
                       out: np.ndarray) -> tuple[np.ndarray, str]:
  """Three elements replaced by draws from N(0, 10 x the output's RMS)."""
  scale = float(np.sqrt(np.mean(np.square(out.astype(np.float64)))))
  t = np.array(out).ravel()
  where = rng.choice(t.size, 3, replace=False)
  t[where] = rng.normal(0.0, 10.0 * scale, 3).astype(t.dtype)
  return t.reshape(out.shape), f"3 elements ~ N(0, {10 * scale:.3g})"


def fault_zero_row(rng: np.random.Generator,
                   out: np.ndarray) -> tuple[np.ndarray, str]:
  """One row (last axis) with a nonzero element set to zero."""
  t = np.array(out)
  rows = _rows(t)
  row = int(rng.choice(np.flatnonzero(np.any(rows != 0, axis=1))))
  rows[row] = 0
  return t, f"row {row} zeroed"


def fault_rolled_row(rng: np.random.Generator,
                     out: np.ndarray) -> tuple[np.ndarray, str]:
  """One row (last axis) whose values differ, rolled by one."""
  t = np.array(out)
  rows = _rows(t)
  varied = np.flatnonzero(np.any(rows != rows[:, :1], axis=1))
  row = int(rng.choice(varied)) if varied.size else 0
  rows[row] = np.roll(rows[row], 1)
  return t, f"row {row} rolled by 1"


def fault_scale(rng: np.random.Generator,
                out: np.ndarray) -> tuple[np.ndarray, str]:
  """The whole output times 1.5."""
  del rng
  return (out.astype(np.float32) * np.float32(1.5)).astype(out.dtype), "x1.5"


def fault_flush_tiny(rng: np.random.Generator,
                     out: np.ndarray) -> tuple[np.ndarray, str]:
  """Nonzero magnitudes below 1.2e-38 set to a zero of their sign (flush to
  zero); zeros keep their bits."""
  del rng
  mag = np.abs(out.astype(np.float32))
  tiny = (mag < FLUSH_BELOW) & (mag > 0)
  u = _bits(out)
  sign = u.dtype.type(1 << (8 * out.dtype.itemsize - 1))
  u[tiny] &= sign
  return _float_of(u, out.dtype), (
      f"{int(tiny.sum())} values below 1.2e-38 flushed")


#: The faults, by name.
FAULTS = {f.name: f for f in (
    Fault("bitflip", "bitflip", None, fault_bitflip),
    Fault("bitflip_multi", "bitflip", None, fault_bitflip_multi),
    Fault("stuck_at", "stuck_at", None, fault_stuck_at),
    Fault("random_value", "random_value", None, fault_random_value),
    Fault("zero_row", "zero", None, fault_zero_row),
    Fault("rolled_row", "indexing", None, fault_rolled_row),
    Fault("scale", "scale", None, fault_scale),
    Fault("flush_tiny", "ftz", None, fault_flush_tiny),
    Fault("wrong_formula", "approximation", ("gelu", "silu"), None),
)}


def apply_fault(fault: Fault, rng: np.random.Generator, case: HeldoutCase,
                base: Base, inputs: tuple,
                out: np.ndarray) -> tuple[np.ndarray, str]:
  """A fault planted on a base's output.

  Args:
    fault: the fault.
    rng: its generator.
    case: the case.
    base: the base that produced ``out``.
    inputs: the case's inputs in the run's dtype.
    out: the base's output.

  Returns:
    (faulted output, description); the wrong formula reruns the base with
    the other activation.
  """
  if fault.apply is not None:
    return fault.apply(rng, out)
  other = OTHER_FORMULA[case.golden_fn]
  wrong = base.fn(case._replace(golden_fn=other), inputs)
  return wrong, f"{other.__name__} instead of {case.golden_fn.__name__}"


# ------------------------------------------------------------- expectation


def is_benign(expected: str) -> bool:
  """Whether an expected name is benign (its verdict must not be fail).

  Args:
    expected: a record's expected name.

  Returns:
    True for ``exact``, ``reordering`` and ``precision:<fmt>``.
  """
  return expected in ("exact", "reordering") or expected.startswith(
      "precision")


def name_correct(r: _calibration.CalibrationRecord) -> bool:
  """Whether a record's predicted name is right.

  Args:
    r: a held-out record.

  Returns:
    True for the expected name, ``exact`` where ``reordering`` was
    expected (the order happened to match), and an ``approximation`` or
    ``parameter`` family name for a wrong formula.
  """
  if r.expected == "approximation":
    return r.predicted.split(":")[0] in FORMULA_FAMILIES
  return _calibration.is_correct(r)


def verdict_correct(r: _calibration.CalibrationRecord) -> bool:
  """Whether a record's verdict is right: benign -> not fail, flushed
  outputs (``ftz``: a precision model, docs/detector.md) -> not pass,
  fault -> fail."""
  if is_benign(r.expected):
    return r.verdict != "fail"
  if r.expected == "ftz":
    return r.verdict != "pass"
  return r.verdict == "fail"


def family(r: _calibration.CalibrationRecord) -> str:
  """A record's fault family (``none`` for a base alone)."""
  return r.error.split(":")[0]


# -------------------------------------------------------------- the runs


class Produced(NamedTuple):
  """One output to diagnose: a base alone or a base with a fault."""

  base: Base
  fault: Fault | None
  output: np.ndarray
  detail: str


def plan(case: HeldoutCase, dtype: str) -> list[tuple[Base, Fault | None]]:
  """The (base, fault) pairs that apply to a case in a dtype (fault None:
  the base alone), before any is skipped for leaving its output unchanged.

  Args:
    case: the case.
    dtype: the run's dtype.

  Returns:
    The pairs, bases in :data:`BASES` order, each base alone first.
  """
  pairs = []
  for base in BASES.values():
    if case.kernel not in base.kernels or dtype not in base.dtypes:
      continue
    pairs.append((base, None))
    pairs += [(base, f) for f in FAULTS.values()
              if f.kernels is None or case.kernel in f.kernels]
  return pairs


def _fault_rng(seed: int, index: int, dtype: str, base: Base,
               fault: Fault) -> np.random.Generator:
  """A generator of its own for each (seed, case, dtype, base, fault)."""
  key = (seed, index, DTYPES.index(dtype), list(BASES).index(base.name),
         list(FAULTS).index(fault.name))
  return np.random.default_rng(key)


def bit_equal(a: np.ndarray, b: np.ndarray) -> bool:
  """Whether two outputs have the same dtype, shape and bit patterns."""
  return (a.dtype == b.dtype and a.shape == b.shape
          and bool(np.array_equal(_bits(a), _bits(b))))


def produce(case: HeldoutCase, dtype: str, inputs: tuple, seed: int,
            index: int) -> Iterator[Produced]:
  """The outputs of a case in a dtype: each base alone, then with each
  fault; a base that reproduces golden bitwise (but is not ``exact``) and a
  fault that leaves its base's output bitwise unchanged are skipped.

  Args:
    case: the case.
    dtype: the run's dtype.
    inputs: the case's inputs in ``dtype``.
    seed: the run's seed.
    index: the case's index in :func:`heldout_cases`.

  Yields:
    :class:`Produced` outputs.
  """
  golden = base_exact(case, inputs)
  outs: dict[str, np.ndarray | None] = {}
  for base, fault in plan(case, dtype):
    if fault is None:
      out = base.fn(case, inputs)
      keep = base.name == "exact" or not bit_equal(out, golden)
      outs[base.name] = out if keep else None
      if keep:
        yield Produced(base, None, out, "none")
      continue
    out = outs[base.name]
    if out is None:
      continue
    rng = _fault_rng(seed, index, dtype, base, fault)
    faulted, detail = apply_fault(fault, rng, case, base, inputs, out)
    if not bit_equal(faulted, out):
      yield Produced(base, fault, faulted, detail)


def _context(case: HeldoutCase) -> dict[str, Any]:
  """The Detector's context of a case (the Profiler's site kind)."""
  ctx: dict[str, Any] = {"kernel": SITE_KIND.get(case.kernel, case.kernel)}
  if case.reduction is not None:
    ctx["reduction"] = case.reduction
  return ctx


def diagnose(path: str, case: HeldoutCase, inputs: tuple, t: np.ndarray,
             g: np.ndarray, r: np.ndarray):
  """The Detector's diagnosis of one output.

  Args:
    path: ``output`` (``peat.analyze`` and ``peat.detect``) or ``probe``
      (the playback path with the port probe on the inputs).
    case: the case.
    inputs: its inputs in the run's dtype.
    t: the output under test.
    g: the golden output.
    r: the float64 reference.

  Returns:
    The Diagnosis.
  """
  ctx = _context(case)
  if path == "output":
    return _detect.detect(_analyzer.analyze(t, g, reference=r), context=ctx)
  probe = (ctx["kernel"], inputs, {}, case.reference_fn)
  return _calibration.diagnose(t, g, r, ctx, dtype=np.dtype(t.dtype).name,
                               probe=probe)


def _record(case: HeldoutCase, dtype: str, p: Produced,
            diag) -> _calibration.CalibrationRecord:
  """The CalibrationRecord of one diagnosed output."""
  fault = p.fault
  error = "none" if fault is None else f"{fault.name}: {p.detail}"
  expected = p.base.expected if fault is None else fault.expected
  secondary = getattr(diag, "secondary", None)
  secondary = getattr(secondary, "model", secondary) or ""
  return _calibration.CalibrationRecord(
      case.kernel, case.source, dtype, ORIGIN, error, expected,
      diag.model, float(diag.confidence), diag.verdict, diag.evidence,
      p.base.name, str(secondary))


def check_options(path: str, dtypes: Sequence[str]) -> None:
  """Raises PeatError for an unknown path or dtype.

  Args:
    path: the diagnosis path.
    dtypes: the run's dtypes.

  Raises:
    PeatError: the path or a dtype is unknown, or no dtype is given.
  """
  if path not in PATHS:
    raise PeatError(f"unknown held-out path {path!r}. Fix: use 'output' "
                    "(peat.analyze + peat.detect) or 'probe' (playback's "
                    "diagnose with the port probe).")
  bad = [d for d in dtypes if d not in DTYPES]
  if bad or not dtypes:
    raise PeatError(f"unknown held-out dtypes {bad or list(dtypes)}. Fix: "
                    f"use one or more of {', '.join(DTYPES)}.")


def run_case(case: HeldoutCase, dtype: str, seed: int, index: int,
             path: str) -> list[_calibration.CalibrationRecord]:
  """Every output of one case in one dtype, diagnosed.

  Args:
    case: the case.
    dtype: the run's dtype.
    seed: the run's seed.
    index: the case's index in its list.
    path: the diagnosis path.

  Returns:
    One record per produced output.
  """
  inputs = cast_inputs(case.inputs, dtype)
  g = base_exact(case, inputs)
  r = case.reference_fn(*inputs)
  return [_record(case, dtype, p, diagnose(path, case, inputs, p.output, g, r))
          for p in produce(case, dtype, inputs, seed, index)]


def run_heldout(seeds: Sequence[int] = (0,), path: str = "output",
                dtypes: Sequence[str] = DTYPES,
                progress: Callable[[str], None] | None = None, *,
                cases: Callable[[int], Sequence[HeldoutCase]] = heldout_cases
                ) -> _calibration.CalibrationResult:
  """Diagnoses the held-out split.

  Args:
    seeds: the seeds; each draws its own inputs (:func:`heldout_cases`).
    path: ``output`` or ``probe`` (see :func:`diagnose`).
    dtypes: the golden computations' dtypes (``float32``, ``bfloat16``);
      bf16 runs cast the float inputs to bf16 and take the reference from
      float64 copies of them.
    progress: called with one line per case done.
    cases: the cases of a seed (a subset for a quick run).

  Returns:
    The CalibrationResult (``peat_jax.detector.summarize``) of all records.

  Raises:
    PeatError: unknown path or dtype, or no records.
  """
  check_options(path, dtypes)
  records: list[_calibration.CalibrationRecord] = []
  for seed in seeds:
    for index, case in enumerate(cases(seed)):
      for dtype in dtypes:
        done = run_case(case, dtype, seed, index, path)
        records += done
        if progress is not None:
          progress(f"seed {seed} {dtype} {case.source}: {len(done)} records")
  return _calibration.summarize(records)


# ----------------------------------------------------------------- tables


def _group_rows(records: Sequence[_calibration.CalibrationRecord],
                key: Callable[[_calibration.CalibrationRecord], str]
                ) -> list[str]:
  """Markdown rows of accuracies per group of ``key``."""
  groups: dict[str, list] = {}
  for r in records:
    groups.setdefault(key(r), []).append(r)
  rows = []
  for name in sorted(groups):
    rs = groups[name]
    benign = [r for r in rs if is_benign(r.expected)]
    faults = [r for r in rs if not is_benign(r.expected)]
    alarms = sum(r.verdict == "fail" for r in benign)
    misses = sum(r.verdict == "pass" for r in faults)
    rows.append(
        f"| {name} | {len(rs)} | {_pct(sum(map(name_correct, rs)), len(rs))}"
        f" | {_pct(sum(map(verdict_correct, rs)), len(rs))} | "
        f"{alarms}/{len(benign)} | {misses}/{len(faults)} |")
  return rows


def _pct(k: int, n: int) -> str:
  """``k / n`` as a percentage with the counts."""
  return f"{k / n:.1%} ({k}/{n})" if n else "-"


def _table(title: str, records: Sequence[_calibration.CalibrationRecord],
           key: Callable[[_calibration.CalibrationRecord], str]) -> str:
  """One Markdown table of accuracies per group."""
  head = [f"### by {title}", "",
          f"| {title} | cases | name top-1 | verdict | false alarms "
          "(benign -> fail) | misses (fault -> pass) |",
          "|---|---:|---:|---:|---:|---:|"]
  return "\n".join(head + _group_rows(records, key))


def _totals(records: Sequence[_calibration.CalibrationRecord]) -> str:
  """The Markdown table of the run's totals."""
  n = len(records)
  benign = [r for r in records if is_benign(r.expected)]
  faults = [r for r in records if not is_benign(r.expected)]
  alone = [r for r in records if r.error == "none"]
  rows = [
      ("records", str(n)),
      ("name top-1", _pct(sum(map(name_correct, records)), n)),
      ("verdict", _pct(sum(map(verdict_correct, records)), n)),
      ("false alarms (benign base alone -> fail)",
       _pct(sum(r.verdict == "fail" for r in alone), len(alone))),
      ("benign -> fail (all benign records)",
       _pct(sum(r.verdict == "fail" for r in benign), len(benign))),
      ("misses (fault -> pass)",
       _pct(sum(r.verdict == "pass" for r in faults), len(faults))),
      ("faults -> warn",
       _pct(sum(r.verdict == "warn" for r in faults), len(faults)))]
  lines = ["### totals", "", "| measure | value |", "|---|---:|"]
  return "\n".join(lines + [f"| {k} | {v} |" for k, v in rows])


def heldout_tables(result: _calibration.CalibrationResult) -> str:
  """Markdown tables of a held-out run.

  Args:
    result: what :func:`run_heldout` returned.

  Returns:
    The totals, then name top-1 and verdict accuracy (fault -> fail,
    benign -> not fail), false alarms and misses per fault family, base,
    dtype and kernel.
  """
  rs = result.records
  return "\n\n".join([
      _totals(rs),
      _table("family", rs, family),
      _table("base", rs, lambda r: r.base),
      _table("dtype", rs, lambda r: r.dtype),
      _table("kernel", rs, lambda r: r.kernel)])


def wrong_records(result: _calibration.CalibrationResult
                  ) -> list[_calibration.CalibrationRecord]:
  """The records with a wrong name or a wrong verdict.

  Args:
    result: what :func:`run_heldout` returned.

  Returns:
    Those records, in run order.
  """
  return [r for r in result.records
          if not (name_correct(r) and verdict_correct(r))]
