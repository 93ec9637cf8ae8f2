"""Kernels: KUT specs, golden kernels and kernels under test as JAX custom calls.

Modules: ``kut`` (KUT specs -> substitutions and callables, parsed and
checked once: ``checked``), ``_adapters`` (a site's call computed by a
native kernel: dot_general as a batched matmul, NHWC convolutions),
``native`` (the native kernels and their variants: matmul, conv2d,
softmax, layer_norm, rms_norm, silu, rope; XLA FFI custom calls, C++ for
CPU, CUDA and HIP for GPUs, sources in ``csrc/``), ``ports`` (plain-JAX
ports as a cross-framework port gets them right or wrong), ``checks`` (float64
references, tolerances and seeded inputs for checks of native variants),
``_ffi`` (every ``ffi_call`` of peat_jax, in one module), ``_variants``
(the variants' names, codes and expected error models), ``_user`` (the
user's own KUT specs: ``py:``, ``ffi:``, ``torch:<module>:<function>``) and
``_conventions`` (the KUT calling convention of each site kernel, as
data: signatures, argument forms, golden kernels) and ``_user_ffi`` (the site adapters of ``ffi:`` KUTs: the FFI calling
convention of each site kernel, docs/kernels.md). BUILD.md says how the
native libraries are built.
"""

from peat_jax.kernels._ffi import SIGNATURE_FLAG_SLOTS as SIGNATURE_FLAG_SLOTS
from peat_jax.kernels._ffi import jax_platform as jax_platform
from peat_jax.kernels._ffi import library_path as library_path
from peat_jax.kernels._ffi import signature_pass as signature_pass
from peat_jax.kernels._ffi import median_kept as median_kept
from peat_jax.kernels._variants import EXPECTED_ERROR_MODEL as EXPECTED_ERROR_MODEL
from peat_jax.kernels._variants import NONDETERMINISTIC as NONDETERMINISTIC
from peat_jax.kernels._variants import variants as variants
from peat_jax.kernels.kut import KutSpec as KutSpec
from peat_jax.kernels.kut import known_specs as known_specs
from peat_jax.kernels.kut import parse_kut as parse_kut
from peat_jax.kernels.kut import register_kut as register_kut
from peat_jax.kernels.kut import resolve_kut as resolve_kut
from peat_jax.kernels.kut import register_source as register_source
from peat_jax.kernels.kut import as_spec as as_spec
from peat_jax.kernels.kut import CheckedSpec as CheckedSpec
from peat_jax.kernels.kut import checked as checked
from peat_jax.kernels._user import ADAPTED_KERNELS as ADAPTED_KERNELS
from peat_jax.kernels._conventions import CONVENTIONS as CONVENTIONS
from peat_jax.kernels._conventions import Convention as Convention
from peat_jax.kernels._conventions import SITE_KERNELS as SITE_KERNELS
from peat_jax.kernels._conventions import check_call as check_call
from peat_jax.kernels._conventions import convention as convention
from peat_jax.kernels._conventions import signature as signature
from peat_jax.kernels._conventions import signature_table as signature_table
from peat_jax.kernels._conventions import arguments_section as arguments_section
from peat_jax.kernels._user import check_preferred as check_preferred
