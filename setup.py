"""Build script for peat_jax's native kernels (XLA FFI custom calls).

Metadata lives in pyproject.toml; this file only adds the native build:
every C++ source in ``peat_jax/kernels/csrc/*.cc`` is compiled into one plain
shared library ``peat_jax/kernels/_peat_kernels_cpu.so`` (not a Python
extension module: it has no ``PyInit``; Python loads it with ctypes and hands
its handler symbols to ``jax.ffi.register_ffi_target``). The XLA FFI headers
come from the jaxlib in the build environment, included with ``-isystem``;
pyproject.toml pins that jaxlib to the runtime version.
"""

import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("peat_jax", "kernels", "csrc")
CPU_LIB = "peat_jax.kernels._peat_kernels_cpu"


def _ffi_include_dir() -> str:
  import jax.ffi  # pylint: disable=g-import-not-at-top

  return jax.ffi.include_dir()


class BuildFfi(build_ext):
  """Compiles FFI libraries as plain ``.so`` files with the FFI headers."""

  def build_extensions(self):
    include = _ffi_include_dir()
    for ext in self.extensions:
      ext.extra_compile_args = [
          f"-isystem{include}", "-std=c++17", "-O2", "-fPIC",
          "-fvisibility=hidden",
      ] + list(ext.extra_compile_args or [])
    super().build_extensions()

  def get_ext_filename(self, fullname):
    # A plain shared object: no Python ABI tag, so one name for every build.
    return os.path.join(*fullname.split(".")) + ".so"

  def get_export_symbols(self, ext):
    return []  # not a Python module: no PyInit_* symbol to export


def _extensions():
  sources = sorted(glob.glob(os.path.join(CSRC, "*.cc")))
  if not sources:
    return []
  return [Extension(CPU_LIB, sources=sources, language="c++",
                    include_dirs=[CSRC])]


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildFfi})
