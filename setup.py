"""Build script for peat_jax's native kernels (XLA FFI custom calls).

Metadata lives in pyproject.toml; this file only adds the native build:
every C++ source in ``peat_jax/kernels/csrc/*.cc`` is compiled into one plain
shared library ``peat_jax/kernels/_peat_kernels_cpu.so`` (not a Python
extension module: it has no ``PyInit``; Python loads it with ctypes and hands
its handler symbols to ``jax.ffi.register_ffi_target``). The XLA FFI headers
come from the jaxlib in the build environment, included with ``-isystem``;
pyproject.toml pins that jaxlib to the runtime version.

The CUDA sources ``peat_jax/kernels/csrc/*.cu`` are compiled with ``nvcc``
into ``peat_jax/kernels/_peat_kernels_cuda.so`` when asked, or when nvcc is
found and jax has a CUDA plugin; one ``peat_jax:`` log line says what was done
(``pip install -v`` shows it). See BUILD.md. Environment:

  PEAT_BUILD_CUDA=0|1     skip / force the CUDA library. Default (unset):
                          build it when nvcc is found and a jax CUDA plugin
                          is installed (the library is only usable then);
                          a failed optional build only warns, a forced one
                          fails the install.
  PEAT_CUDA_ARCH=...      nvcc -gencode list (default: sm_90 SASS plus
                          compute_90 PTX, one cheap target).
  NVCC=/path/to/nvcc      the compiler to use.
"""

import concurrent.futures
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import time

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("peat_jax", "kernels", "csrc")
CPU_LIB = "peat_jax.kernels._peat_kernels_cpu"


def _jax_has_cuda_plugin() -> bool:
  return any(importlib.util.find_spec(name) is not None
             for name in ("jax_cuda13_plugin", "jax_cuda12_plugin"))


def _ffi_include_dir() -> str:
  import jax.ffi  # pylint: disable=g-import-not-at-top

  return jax.ffi.include_dir()


class BuildFfi(build_ext):
  """Compiles FFI libraries as plain ``.so`` files with the FFI headers."""

  def build_extensions(self):
    include = _ffi_include_dir()
    for ext in self.extensions:
      ext.extra_compile_args = [
          f"-isystem{include}", "-std=c++17", "-O3", "-fPIC",
          "-fvisibility=hidden",
          # One rounding per multiply and per add unless a variant asks for
          # a fused multiply-add explicitly (variant "fma").
          "-ffp-contract=off", "-pthread", "-g0",
      ] + list(ext.extra_compile_args or [])
      ext.extra_link_args = ["-pthread"] + list(ext.extra_link_args or [])
    # Compile the C++ sources of the library in parallel (one compiler
    # process per source); distutils would run them one after another.
    serial = self.compiler.compile

    def parallel_compile(sources, *args, **kwargs):
      with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        parts = list(pool.map(lambda src: serial([src], *args, **kwargs),
                              sources))
      return [obj for part in parts for obj in part]

    self.compiler.compile = parallel_compile
    super().build_extensions()
    self._build_cuda(include)

  def _build_cuda(self, include):
    """Compiles the CUDA library (see BUILD.md for when and how)."""
    mode = os.environ.get("PEAT_BUILD_CUDA", "auto").strip().lower()
    if mode in ("0", "off", "false", "no"):
      print("peat_jax: CUDA library skipped (PEAT_BUILD_CUDA=0)")
      return
    forced = mode in ("1", "on", "true", "yes")
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if nvcc is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
      nvcc = "/usr/local/cuda/bin/nvcc"
    sources = sorted(glob.glob(os.path.join(HERE, CSRC, "*.cu")))
    if nvcc is None or not sources:
      msg = "peat_jax: CUDA library skipped (nvcc not found)"
      if forced:
        raise RuntimeError(msg + " but PEAT_BUILD_CUDA=1")
      print(msg)
      return
    if not forced and not _jax_has_cuda_plugin():
      # nvcc alone cannot run the library: without a CUDA jaxlib plugin it
      # is never loaded, and compiling it costs about a minute.
      print(f"peat_jax: CUDA library skipped: {nvcc} found but no jax CUDA "
            "plugin is installed; set PEAT_BUILD_CUDA=1 to build it anyway")
      return
    cpu_path = self.get_ext_fullpath(CPU_LIB)
    out = os.path.join(os.path.dirname(cpu_path), "_peat_kernels_cuda.so")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    arch = os.environ.get(
        "PEAT_CUDA_ARCH",
        "-gencode=arch=compute_90,code=sm_90 "
        "-gencode=arch=compute_90,code=compute_90").split()
    flags = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Xcompiler",
             "-fvisibility=hidden", "--fmad=false", "-isystem", include,
             f"-I{os.path.join(HERE, CSRC)}", *arch]
    objdir = os.path.join(self.build_temp, "cuda")
    os.makedirs(objdir, exist_ok=True)
    objects = [os.path.join(objdir, os.path.basename(src) + ".o")
               for src in sources]
    start = time.time()
    try:
      # One nvcc per source, in parallel (the heavy part), then one link.
      with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(
            lambda so: subprocess.run([nvcc, *flags, "-c", so[0], "-o", so[1]],
                                      check=True),
            zip(sources, objects)))
      subprocess.run([nvcc, "-shared", *arch, *objects, "-o", out],
                     check=True)
    except (OSError, subprocess.CalledProcessError) as err:
      if forced:
        raise
      print(f"peat_jax: WARNING: CUDA library build failed ({err}); the CPU "
            "library is unaffected", file=sys.stderr)
      return
    self._cuda_out = out
    print(f"peat_jax: built CUDA library {out} from {len(sources)} sources "
          f"with {nvcc} ({' '.join(arch)}) in {time.time() - start:.1f} s")

  _cuda_out = None

  def run(self):
    super().run()  # builds into build_lib; in place (editable) it copies ext
    if self.inplace and self._cuda_out:
      # The CUDA library is not an Extension: copy it next to the CPU one.
      build_py = self.get_finalized_command("build_py")
      dest = os.path.join(build_py.get_package_dir("peat_jax.kernels"),
                          os.path.basename(self._cuda_out))
      self.copy_file(self._cuda_out, dest, level=self.verbose)

  def get_outputs(self):
    outputs = super().get_outputs()
    if self._cuda_out and not self.inplace:
      outputs.append(self._cuda_out)
    return outputs

  def get_ext_filename(self, fullname):
    # A plain shared object: no Python ABI tag, so one name for every build.
    return os.path.join(*fullname.split(".")) + ".so"

  def get_export_symbols(self, ext):
    return []  # not a Python module: no PyInit_* symbol to export


# bridges/, models/ and tools/ are installed inside the peat_jax namespace,
# never as top-level `bridges`, `models` or `tools` modules.
_MAPPED = ("bridges", "models", "tools")


def _packages() -> tuple[list[str], dict[str, str]]:
  """Every package, found (not listed): a new folder cannot go missing.

  Returns:
    ``(packages, package_dir)`` for setuptools: ``peat_jax`` and each of its
    subpackages, and ``peat_jax.<name>`` for bridges/, models/, tools/ and
    their subpackages.
  """
  packages = find_packages(HERE, include=["peat_jax", "peat_jax.*"])
  package_dir = {"peat_jax": "peat_jax"}
  for name in _MAPPED:
    packages.append(f"peat_jax.{name}")
    package_dir[f"peat_jax.{name}"] = name
    for sub in find_packages(os.path.join(HERE, name)):
      packages.append(f"peat_jax.{name}.{sub}")
  return sorted(packages), package_dir


def _extensions():
  sources = sorted(glob.glob(os.path.join(CSRC, "*.cc")))
  if not sources:
    return []
  return [Extension(CPU_LIB, sources=sources, language="c++",
                    include_dirs=[CSRC])]


_PACKAGES, _PACKAGE_DIR = _packages()
setup(packages=_PACKAGES, package_dir=_PACKAGE_DIR,
      ext_modules=_extensions(), cmdclass={"build_ext": BuildFfi})
