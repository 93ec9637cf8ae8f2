"""The CUDA library where jax computes on an NVIDIA GPU (skipped elsewhere).

The other tests of this folder run on whatever platform jax computes on;
these check that on a GPU they really ran the CUDA kernels (the computation
is on the GPU, the CUDA library is the one registered, the compiled program
calls the custom call) and compare the CUDA GEMM with the CPU library: both
add each element's K products in increasing k order from +0 with the same
rounding helpers (peat_numerics.h), so every deterministic matmul variant
must agree bit for bit, forward and backward. ``scripts/gpu_check.sh`` runs
them with ``JAX_PLATFORMS=cuda,cpu`` (the CPU device is needed for the
comparison) and ``PEAT_EXPECT_PLATFORM=CUDA`` (conftest.py); the file's
name sorts first in this folder, so its results are in the log even when
a run is stopped before the end.
"""

import jax
import numpy as np
import pytest

from peat_jax.kernels import _ffi
from peat_jax.kernels import native
from peat_jax.kernels.checks import randn, rng_for


def _on_cuda() -> bool:
  try:
    return _ffi.jax_platform() == "CUDA"
  except Exception:  # pylint: disable=broad-except
    return False


pytestmark = pytest.mark.skipif(
    not _on_cuda(), reason="jax does not compute on CUDA here (these tests "
    "run on an NVIDIA GPU: scripts/gpu_check.sh)")

DETERMINISTIC = [v for v in native.variants("matmul")
                 if v not in native.NONDETERMINISTIC]
TILE = 16


def _cpu_device():
  try:
    return jax.devices("cpu")[0]
  except RuntimeError as e:
    pytest.fail(f"no CPU device next to the GPU ({e}); run with "
                "JAX_PLATFORMS=cuda,cpu")


def test_native_kernels_run_on_the_gpu():
  rng = rng_for("cuda-device")
  a, b = randn(rng, (40, 70), "float32"), randn(rng, (70, 30), "float32")
  f = jax.jit(lambda a, b: native.matmul(a, b, variant="in_tf32"))
  out = f(a, b)
  assert {d.platform for d in out.devices()} == {"gpu"}, out.devices()
  assert "CUDA" in _ffi._registered  # pylint: disable=protected-access
  hlo = f.lower(a, b).compile().as_text()
  assert "peat_matmul_fwd" in hlo
  ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shapes", [((37, 50), (50, 45)),
                                    ((3, 19, 130), (3, 130, 21))],
                         ids=["37x50x45", "3x19x130x21"])
@pytest.mark.parametrize("variant", DETERMINISTIC)
def test_cuda_matmul_equals_the_cpu_library_bitwise(variant, shapes, dtype):
  cpu = _cpu_device()
  _ffi.ensure_registered("cpu")
  rng = rng_for("cuda-vs-cpu", variant, shapes, dtype)
  a = np.asarray(randn(rng, shapes[0], dtype))
  b = np.asarray(randn(rng, shapes[1], dtype))
  dc = np.asarray(randn(rng, shapes[0][:-1] + shapes[1][-1:], dtype))

  def run(device):
    args = [jax.device_put(x, device) for x in (a, b, dc)]
    fwd = lambda a, b: native.matmul(a, b, variant=variant, tile=TILE)
    out, vjp = jax.vjp(jax.jit(fwd), args[0], args[1])
    da, db = vjp(args[2])
    assert {d.platform for d in out.devices()} == {device.platform}
    return [np.asarray(x) for x in (out, da, db)]

  gpu = jax.devices()[0]
  for name, g, c in zip(("c", "da", "db"), run(gpu), run(cpu)):
    np.testing.assert_array_equal(g, c, err_msg=f"{variant} {name}")


def test_cuda_threaded_nondet_changes_bits_across_calls():
  """Split-K with atomics whose partials come from many blocks: the order
  of the atomic adds, hence the bits, changes between identical calls.
  (test_native_matmul.py's determinism test asks the same of a small
  product, whose 13 chunks per element lie in one or two warps.)"""
  rng = rng_for("cuda-nondet")
  a, b = randn(rng, (16, 8192), "float32"), randn(rng, (8192, 16), "float32")
  f = jax.jit(lambda a, b: native.matmul(a, b, variant="threaded_nondet",
                                         tile=TILE))
  seen = {np.asarray(f(a, b)).tobytes()}
  for _ in range(300):
    seen.add(np.asarray(f(a, b)).tobytes())
    if len(seen) > 1:
      break
  assert len(seen) > 1, "threaded_nondet gave identical bits 301 times"
