"""The platform the native-kernel tests must run on.

The tests in this folder are platform-agnostic: they call
``peat_jax.kernels.native``, which runs the library of the platform jax
computes on (CPU, CUDA or ROCm). Set ``PEAT_EXPECT_PLATFORM`` (``cpu``,
``CUDA`` or ``ROCM``; ``scripts/gpu_check.sh`` sets ``CUDA``) to make sure
they run where intended: the session stops before this folder's first
test, with the reason, when jax computes elsewhere (e.g. a CPU-only jaxlib,
a plugin that failed to load) or when that platform's native library was
not built or does not load.

On a GPU the XLA goldens these tests compare with compute float32 dots at
full float32 precision (``jax_default_matmul_precision="highest"``): at
XLA's default a Hopper or Ampere GPU multiplies TF32 operands, 10 fraction
bits, and a float32 kernel then looks ~1e-3 wrong (the first GPU check:
the backward and adapter tests). On the CPU the setting changes nothing.
"""

import os

import pytest

EXPECT = "PEAT_EXPECT_PLATFORM"


def expected_platform() -> str | None:
  """The FFI platform named by ``PEAT_EXPECT_PLATFORM`` (None when unset)."""
  want = os.environ.get(EXPECT, "").strip()
  if not want:
    return None
  names = {"cpu": "cpu", "cuda": "CUDA", "gpu": "CUDA", "rocm": "ROCM"}
  if want.lower() not in names:
    pytest.exit(f"{EXPECT}={want!r}: expected cpu, CUDA or ROCM",
                returncode=4)
  return names[want.lower()]


def platform_problem(want: str) -> str | None:
  """Why the native kernels would not run on ``want`` (None: they will)."""
  import jax  # pylint: disable=g-import-not-at-top
  from peat_jax.kernels import _ffi  # pylint: disable=g-import-not-at-top

  try:
    got = _ffi.jax_platform()
  except Exception as e:  # pylint: disable=broad-except
    return f"jax has no usable backend ({type(e).__name__}: {e})"
  if got != want:
    return (f"jax computes on {jax.default_backend()} ({got}, devices "
            f"{jax.devices()}), not {want}")
  path = _ffi.library_path(want)
  if not os.path.exists(path):
    return (f"the {want} native library {path} is missing; build it "
            "(BUILD.md; CUDA: PEAT_BUILD_CUDA=1 pip install --no-deps "
            "--no-build-isolation -e .)")
  try:
    _ffi.ensure_registered(want)
  except Exception as e:  # pylint: disable=broad-except
    return f"the {want} native library {path} does not load: {e}"
  return None


@pytest.fixture(scope="session", autouse=True)
def _expected_platform():
  """Stops the session before this folder's first test on the wrong platform."""
  want = expected_platform()
  if want is not None:
    problem = platform_problem(want)
    if problem:
      pytest.exit(f"{EXPECT}={os.environ[EXPECT]}: {problem}", returncode=3)
  yield


@pytest.fixture(scope="session", autouse=True)
def _full_float32_goldens():
  """float32 goldens at float32 precision on a GPU (see module doc)."""
  import jax  # pylint: disable=g-import-not-at-top
  from peat_jax.kernels import _ffi  # pylint: disable=g-import-not-at-top

  if _ffi.jax_platform() == "cpu":
    yield
    return
  with jax.default_matmul_precision("highest"):
    yield
