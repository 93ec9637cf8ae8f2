"""Bad input reaches the user as PeatError; the registry and the build."""

import os
import re
import shutil
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax
from peat_jax.kernels import _ffi
from peat_jax.kernels import native
from peat_jax.kernels._variants import VARIANT_CODES

CSRC = os.path.join(os.path.dirname(native.__file__), "csrc")
F32 = jnp.ones((4, 5), jnp.float32)


@pytest.mark.parametrize("call,match", [
    (lambda: native.matmul(F32, jnp.ones((6, 3))), r"contracting dims differ"),
    (lambda: native.matmul(F32, jnp.ones(5)), r"rank >= 2"),
    (lambda: native.matmul(jnp.ones((2, 4, 5)), jnp.ones((3, 5, 2))),
     r"do not broadcast"),
    (lambda: native.matmul(np.ones((4, 5)), np.ones((5, 2))),
     r"a has dtype float64"),
    (lambda: native.matmul([[1.0]], [[1.0]]), r"must be an array"),
    (lambda: native.matmul(F32.astype(jnp.int32), F32.T.astype(jnp.int32)),
     r"int32; expected one of float32, bfloat16, float16"),
    (lambda: native.matmul(F32, F32.T.astype(jnp.bfloat16)),
     r"share one dtype"),
    (lambda: native.matmul(F32, F32.T, variant="fast"), r"unknown variant"),
    (lambda: native.matmul(F32, F32.T, tile=0), r"tile must be in"),
    (lambda: native.matmul(F32, F32.T, tile=2.5), r"tile must be an int"),
    (lambda: native.softmax(F32, variant="welford"), r"unknown variant"),
    (lambda: native.softmax(F32, axis=2), r"axis must be"),
    (lambda: native.softmax(jnp.ones(3, jnp.int8)), r"int8"),
    (lambda: native.layer_norm(F32, jnp.ones(4), jnp.ones(5)),
     r"scale \(D,\)"),
    (lambda: native.layer_norm(F32, jnp.ones(5), jnp.ones(5), eps="1e-5"),
     r"eps must be a Python or numpy float"),
    (lambda: native.layer_norm(F32, jnp.ones(5), jnp.ones(5), eps=1e300),
     r"finite in float32"),
    (lambda: native.conv2d(jnp.ones((1, 4, 4, 3)), jnp.ones((3, 3, 2, 4))),
     r"equal C"),
    (lambda: native.conv2d(jnp.ones((1, 4, 4, 3)), jnp.ones((3, 3, 3, 4)),
                           padding="FULL"), r"padding must be"),
    (lambda: native.conv2d(jnp.ones((1, 4, 4, 3)), jnp.ones((3, 3, 3, 4)),
                           strides=(0, 1)), r"strides must be"),
    (lambda: native.conv2d(jnp.ones((1, 2, 2, 3)), jnp.ones((3, 3, 3, 4)),
                           padding="VALID"), r"larger than"),
    (lambda: native.kut("attention"), r"unknown kernel"),
])
def test_bad_input_raises_peat_error(call, match):
  with pytest.raises(peat_jax.PeatError, match=match):
    call()


def test_errors_raise_before_tracing_inside_jit():
  with pytest.raises(peat_jax.PeatError, match="contracting"):
    jax.jit(native.matmul)(F32, F32)


def test_ffi_attribute_types_are_checked_by_the_handler():
  """Handler-side validation (run time): a direct FFI call with a bad
  variant code fails with the handler's message, not a crash."""
  with pytest.raises(Exception, match="unknown variant code 99"):
    _ffi.matmul_fwd(F32, F32.T, 99, 8).block_until_ready()


def test_registry_and_expected_models():
  assert set(native.KERNELS) == {"matmul", "softmax", "layer_norm", "conv2d",
                                 "rms_norm", "silu", "rope"}
  models = {"accumulation:fp16", "accumulation:bf16", "precision:bf16",
            "precision:tf32", "precision:fp16", "truncation", "ftz",
            "indexing", "nondeterminism", "reordering"}
  assert models <= set(native.EXPECTED_ERROR_MODEL["matmul"].values())
  for kernel in native.KERNELS:
    assert native.variants(kernel)[0] == "default"
    f = native.kut(kernel, native.variants(kernel)[-1])
    assert f.keywords["variant"] == native.variants(kernel)[-1]


def test_variant_codes_match_cpp_enum():
  header = open(os.path.join(CSRC, "peat_numerics.h")).read()
  enum = dict(re.findall(r"^\s+k(\w+) = (\d+),", header, re.M))
  camel = {name: "".join(p.capitalize() for p in name.split("_"))
           for name in VARIANT_CODES}
  for name, code in VARIANT_CODES.items():
    assert int(enum[camel[name]]) == code, name


def test_library_found_through_importlib():
  """The library of the platform jax runs on is found and registered."""
  platform = _ffi.jax_platform()
  assert platform == {"cpu": "cpu", "gpu": "CUDA", "cuda": "CUDA",
                      "rocm": "ROCM"}.get(jax.default_backend(), platform)
  path = _ffi.library_path(platform)
  assert os.path.exists(path), path
  assert _ffi.ensure_registered() == platform
  assert _ffi.ensure_registered(platform) == platform  # idempotent


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_sources_compile(tmp_path, request):
  """The CUDA library compiles with nvcc (no GPU needed to compile).

  About 90 s on 2 cores: runs only when selected with ``-m slow``.
  """
  if "slow" not in (request.config.getoption("markexpr") or ""):
    pytest.skip("nvcc takes ~90 s; select with: pytest -m slow")
  sources = sorted(f for f in os.listdir(CSRC) if f.endswith(".cu"))
  assert sources
  out = tmp_path / "_peat_kernels_cuda.so"
  cmd = ["nvcc", "-shared", "-std=c++17", "-O3", "-Xcompiler", "-fPIC",
         "--fmad=false", "-isystem", jax.ffi.include_dir(), f"-I{CSRC}",
         "-gencode=arch=compute_90,code=sm_90",
         *[os.path.join(CSRC, s) for s in sources], "-o", str(out)]
  start = time.time()
  subprocess.run(cmd, check=True)
  assert out.stat().st_size > 0
  symbols = subprocess.run(["nm", "-D", str(out)], capture_output=True,
                           text=True, check=True).stdout
  for name in _ffi._TARGETS:  # pylint: disable=protected-access
    assert f" T {name}" in symbols, name
  print(f"nvcc compiled {len(sources)} sources in {time.time() - start:.1f} s")
