"""The native kernels' variants: names, FFI codes, and expected error models.

Each variant is a real implementation of a kernel the way some port does it
(see BUILD.md for what each looks like in real code), not noise added after
the fact. The code is the int32 FFI attribute ``variant``; it matches the
``peat::Variant`` enum in ``csrc/peat_numerics.h`` (a test compares them).
"""

import types

VARIANT_CODES: types.MappingProxyType = types.MappingProxyType({
    "default": 0,
    "tiled": 1,
    "fma": 2,
    "acc_fp16": 3,
    "acc_bf16": 4,
    "in_tf32": 5,
    "in_bf16": 6,
    "in_fp16": 7,
    "rtz": 8,
    "ftz": 9,
    "tile_edge_bug": 10,
    "threaded_nondet": 11,
    "fast_exp": 20,
    "recip": 21,
    "welford": 22,
    "naive_var": 23,
    "pairwise": 24,
    "hf": 25,
    "eps": 26,
    "layer_norm": 27,
    "tanh": 28,
    "bf16": 29,
    "swapped": 30,
    "interleaved": 31,
    "theta_500k": 32,
    "offset": 33,
})

_GEMM = {
    "default": "reordering",
    "tiled": "reordering",
    "fma": "reordering",
    "acc_fp16": "accumulation:fp16",
    "acc_bf16": "accumulation:bf16",
    "in_tf32": "precision:tf32",
    "in_bf16": "precision:bf16",
    "in_fp16": "precision:fp16",
    "rtz": "truncation",
    "ftz": "ftz",
    "tile_edge_bug": "indexing",
    "threaded_nondet": "nondeterminism",
}

# kernel -> variant -> the error model the Detector should name when the
# variant is compared with the golden kernel. "default" is "reordering": a
# correct kernel whose summation order differs from XLA's. "ftz" shows only on
# data with subnormals (elsewhere it equals default). "fast_exp" and
# "naive_var" are another closed form of the same function
# ("approximation"): a cubic exp; the variance as E[x^2] - E[x]^2, whose
# cancellation is within rounding on centred rows (the calibration expects
# "reordering" there) and an approximation's dense error beyond it.
EXPECTED_ERROR_MODEL: types.MappingProxyType = types.MappingProxyType({
    "matmul": types.MappingProxyType(dict(_GEMM)),
    "conv2d": types.MappingProxyType(dict(_GEMM)),
    "softmax": types.MappingProxyType({
        "default": "reordering",
        "tiled": "reordering",
        "recip": "reordering",
        "fast_exp": "approximation",
        "acc_bf16": "accumulation:bf16",
        "in_bf16": "precision:bf16",
        "rtz": "truncation",
        "ftz": "ftz",
    }),
    "layer_norm": types.MappingProxyType({
        "default": "reordering",
        "welford": "reordering",
        "naive_var": "approximation",
        "acc_bf16": "accumulation:bf16",
        "in_bf16": "precision:bf16",
        "rtz": "truncation",
        "ftz": "ftz",
    }),
    # The Llama-style kernels (csrc/rms_norm.cc, silu.cc, rope.cc; BUILD.md).
    # Their golden kernels are the plain-JAX model code in the model's dtype
    # (bf16 in a bf16 Llama): float32 inside, rounded once. The slips
    # (rms_norm eps / layer_norm, rope theta_500k / offset) are "parameter":
    # a constant of the computation differs.
    "rms_norm": types.MappingProxyType({
        "default": "reordering",
        "pairwise": "reordering",
        "hf": "reordering",
        "acc_bf16": "accumulation:bf16",
        "eps": "parameter",
        "layer_norm": "parameter",
    }),
    "silu": types.MappingProxyType({
        "default": "reordering",
        "tanh": "reordering",
        "bf16": "precision:bf16",
        "fast_exp": "approximation",
        # The SwiGLU gate and up projections swapped: silu(up) * x, the
        # port probe's swapped_operands (values in the wrong place).
        "swapped": "indexing",
    }),
    "rope": types.MappingProxyType({
        "default": "reordering",
        "hf": "reordering",
        "interleaved": "indexing",
        "theta_500k": "parameter",
        "offset": "parameter",
    }),
})

# Variants whose output is bitwise reproducible for identical inputs.
NONDETERMINISTIC = frozenset({"threaded_nondet"})

# Deliberately broken variants (csrc/broken.cc; docs/reliability.md): they
# crash the process, hang or exhaust memory instead of computing, to test
# campaign isolation. Variant name -> the FFI attribute ``mode``. They are not
# in EXPECTED_ERROR_MODEL nor in variants(): nothing that enumerates the
# variants (calibration, tests, known_specs) picks them up.
BROKEN_MODES: types.MappingProxyType = types.MappingProxyType({
    "crash_segv": 1,
    "crash_abort": 2,
    "hang": 3,
    "oom": 4,
})

# Native kernels that have the broken variants (their KUT specs are
# ``native:<kernel>:<broken variant>[@<reduction>]``).
BROKEN_KERNELS = ("matmul", "conv2d")


def variants(kernel: str) -> tuple[str, ...]:
  """Returns the variant names of one native kernel, ``default`` first."""
  return tuple(EXPECTED_ERROR_MODEL[kernel])
