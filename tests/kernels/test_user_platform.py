"""A user's FFI library is registered only for a platform it has code for.

On a GPU a CPU handler registered for CUDA is given device pointers and
crashes the process (the first GPU check: 20 pytest workers lost to
segmentation faults). ``load_user_library`` reads the library's ELF file
first and refuses it with an error naming the fix. The libraries here are
real builds: peat_jax's own CPU kernels, a g++ library that needs the CUDA
runtime, and (slow) an nvcc library with a device kernel, stripped too.
"""

import os
import shutil
import subprocess

import pytest

from peat_jax.core import PeatError
from peat_jax.kernels import _elf
from peat_jax.kernels import _ffi

CPU_LIB = _ffi.library_path("cpu")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

KERNEL_CU = r"""
#include <cstdint>
__global__ void Twice(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
extern "C" void LaunchTwice(const float* x, float* y, int64_t n,
                            cudaStream_t s) {
  Twice<<<(n + 255) / 256, 256, 0, s>>>(x, y, n);
}
"""

RUNTIME_CC = r"""
#include <cstddef>
extern "C" int cudaMalloc(void** p, size_t n);
extern "C" int PeatTestAlloc(void** p) { return cudaMalloc(p, 16); }
"""


@pytest.mark.parametrize("platform,word", [("CUDA", "CUDA"),
                                           ("ROCM", "ROCm")])
def test_a_cpu_library_is_refused_for_a_gpu_platform(platform, word):
  assert not _elf.library_code(CPU_LIB).serves(platform)
  with pytest.raises(PeatError) as err:
    _ffi.load_user_library(CPU_LIB, ["PeatMatmulFwd"], platform=platform)
  text = str(err.value)
  assert f"holds no {word} code" in text
  assert "JAX_PLATFORMS=cpu" in text
  assert ("nvcc" if platform == "CUDA" else "hipcc") in text
  assert CPU_LIB not in _ffi._user_libraries  # nothing was registered


def test_the_cpu_platform_takes_any_library():
  assert _elf.library_code(CPU_LIB).serves("cpu")
  _ffi.check_user_platform(CPU_LIB, "cpu")


def test_a_library_that_needs_the_cuda_runtime_serves_cuda(tmp_path):
  gxx = shutil.which("g++")
  cudart = os.path.join(CUDA_HOME, "lib64")
  if gxx is None or not os.path.isdir(cudart):
    pytest.skip("g++ or the CUDA runtime library is not installed")
  src = tmp_path / "alloc.cc"
  src.write_text(RUNTIME_CC)
  out = str(tmp_path / "liballoc.so")
  subprocess.run([gxx, "-shared", "-fPIC", str(src), "-o", out,
                  f"-L{cudart}", "-lcudart"], check=True)
  code = _elf.library_code(out)
  assert any(n.startswith("libcudart") for n in code.needed), code.needed
  assert code.serves("CUDA") and not code.serves("ROCM")
  _ffi.check_user_platform(out, "CUDA")
  with pytest.raises(PeatError, match="holds no ROCm code"):
    _ffi.check_user_platform(out, "ROCM")


@pytest.mark.slow
def test_a_library_with_device_code_serves_cuda_stripped_or_not(tmp_path):
  nvcc = shutil.which("nvcc")
  if nvcc is None:
    pytest.skip("nvcc is not installed")
  src = tmp_path / "twice.cu"
  src.write_text(KERNEL_CU)
  out = str(tmp_path / "libtwice.so")
  subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", str(src), "-o",
                  out], check=True)
  stripped = str(tmp_path / "libtwice_stripped.so")
  shutil.copy(out, stripped)
  subprocess.run(["strip", stripped], check=True)
  for path in (out, stripped):
    code = _elf.library_code(path)
    assert ".nv_fatbin" in code.sections, code.sections
    assert code.serves("CUDA") and not code.serves("ROCM")
    _ffi.check_user_platform(path, "CUDA")


@pytest.mark.parametrize("content,message", [
    (b"not a library at all", "is not an ELF file"),
    (b"\x7fELF\x01\x01" + b"\0" * 60, "not a 64-bit little-endian"),
])
def test_a_file_that_is_no_elf_library_is_named(tmp_path, content, message):
  path = tmp_path / "bad.so"
  path.write_bytes(content)
  with pytest.raises(PeatError, match=message):
    _ffi.check_user_platform(str(path), "CUDA")


def test_a_library_cut_short_is_named(tmp_path):
  with open(CPU_LIB, "rb") as f:
    head = f.read(4096)  # the ELF header; its section headers are at the end
  path = tmp_path / "cut.so"
  path.write_bytes(head)
  with pytest.raises(PeatError, match="section headers lie beyond the file"):
    _ffi.check_user_platform(str(path), "CUDA")


def test_on_a_gpu_the_default_platform_refuses_a_cpu_library():
  platform = _ffi.jax_platform()
  if platform == "cpu":
    pytest.skip("jax computes on the CPU; the refusal is tested above with "
                "platform= given")
  with pytest.raises(PeatError, match="JAX_PLATFORMS=cpu"):
    _ffi.load_user_library(CPU_LIB, ["PeatMatmulFwd"])
