"""Invariance probes (peat.analyzer.invariance_probe) on real kernels.

The kernels under test are the escape suite's C++ matmuls
(benchmarks/escape/escape_kernels.cc, compiled by the ``escape_lib``
fixture and called through ``ffi:``): each does one thing beyond one
call's values, and the probe's facts must show exactly that thing.
"""

import jax
import numpy as np
import pytest
from jax import lax

import peat_jax as peat

MM = (((1,), (0,)), ((), ()))


def matmul_kut(lib: str, fwd: str, bwd: str = "EscMatmulBwd"):
  """The escape library's ``fwd`` as a jitted ``(a, b) -> a @ b``."""
  spec = peat.kernels.parse_kut(f"ffi:{lib}:{fwd}:{bwd}",
                                kernel="dot_general")
  kut = peat.resolve_kut(spec)[0].kut
  return jax.jit(lambda a, b: kut(a, b, dimension_numbers=MM, precision=None,
                                  preferred_element_type=None,
                                  out_sharding=None))


def operands(seed: int = 0, m: int = 8, k: int = 64, n: int = 10):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((m, k)).astype(np.float32),
          rng.standard_normal((k, n)).astype(np.float32))


def probe(fn, a, b):
  golden = np.asarray(lax.dot_general(a, b, MM))
  return peat.analyzer.invariance_probe(
      fn, [a, b], golden=[golden],
      reference=lambda x, w: x.astype(np.float64) @ w.astype(np.float64),
      in_axes=[0, None], out_axes=[0])


@pytest.mark.parametrize("fwd", ["EscMatmul", "golden"])
def test_a_correct_kernel_leaves_no_trace(escape_lib, fwd):
  fn = (jax.jit(lambda a, b: lax.dot_general(a, b, MM)) if fwd == "golden"
        else matmul_kut(escape_lib, fwd))
  a, b = operands(1)
  facts = probe(fn, a, b)
  out = facts["outputs"][0]
  assert facts["mutation"] == []
  assert out["repeat"]["changed"] == 0
  assert out["reuse"] == {"differ": 0, "from_earlier": 0,
                          "rows_from_earlier": 0, "rows": 8}
  ins = out["insensitive"]
  assert ins["moved"] > 40 and ins["still"] == 0 and ins["elsewhere"] == 0
  if fwd == "EscMatmul":  # k in order whatever the rows: batch invariant
    assert out["batch"]["alone"]["differ"] == 0
    assert out["batch"]["half"]["differ"] == 0


def test_zeroing_kernel_shows_its_mutation_and_spares_the_caller(escape_lib):
  a, b = operands(2)
  a0 = a.copy()
  facts = probe(matmul_kut(escape_lib, "EscMatmulZeroInput"), a, b)
  assert facts["mutation"] == [{"input": 0, "changed": a.size,
                                "size": a.size, "zeroed": a.size}]
  np.testing.assert_array_equal(a, a0)  # the probe works on copies


def test_address_cache_returns_the_earlier_bits_for_new_values(escape_lib):
  a, b = operands(3)
  out = probe(matmul_kut(escape_lib, "EscMatmulCached"), a, b)["outputs"][0]
  assert out["reuse"]["differ"] == 80
  assert out["reuse"]["from_earlier"] == 80
  # In buffers of their own the inputs are computed afresh.
  assert out["repeat"]["changed"] == 0


def test_subsampled_reduction_ignores_half_of_its_input(escape_lib):
  a, b = operands(4, m=64)
  ins = probe(matmul_kut(escape_lib, "EscMatmulSubsample",
                         "EscMatmulSubsampleBwd"), a, b)["outputs"][0][
                             "insensitive"]
  # One element per row moved: rows whose element has an odd k stay put.
  assert 0.3 < ins["still"] / ins["moved"] < 0.7
  assert ins["elsewhere"] == 0


def test_batch_split_kernel_is_batch_variant_by_rounding(escape_lib):
  a, b = operands(5)
  bat = probe(matmul_kut(escape_lib, "EscMatmulBatchSplit"), a, b)[
      "outputs"][0]["batch"]
  assert bat["rows"] == 8
  for name in ("alone", "half"):  # 1 and 4 rows: below 8, split-K
    assert bat[name]["differ"] > 0
    assert 0 < bat[name]["max_ulps"] < 1000  # rounding, not a wrong value
  assert bat["alone"]["rms"] < 16 * bat["noise_rms"]


def test_a_permuted_output_is_not_insensitive(escape_lib):
  """The strided port permutes batches: its output follows the input,
  elsewhere; the probe sees it move where the reference does not."""
  import escape_jax  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(6)
  v = rng.standard_normal((2, 40, 4, 32)).astype(np.float32)
  w = rng.random((2, 4, 40, 40)).astype(np.float32)
  dn = (((1,), (3,)), ((0, 2), (0, 1)))
  fn = jax.jit(lambda x, y: escape_jax.dot_general_by_stride(
      x, y, dimension_numbers=dn))
  facts = peat.analyzer.invariance_probe(
      fn, [v, w], reference=lambda x, y: np.einsum(
          "bshd,bhts->bhdt", x.astype(np.float64), y.astype(np.float64)))
  ins = facts["outputs"][0]["insensitive"]
  assert ins["elsewhere"] > ins["still"]
  verdicts = peat.detector.invariance_candidates(facts)
  assert "input_insensitive" not in [c.model for c in verdicts]


def test_a_failing_kernel_gives_an_error_not_an_exception():
  def broken(x):
    raise RuntimeError("kernel exploded")
  facts = peat.analyzer.invariance_probe(broken, [np.ones((4, 4), np.float32)])
  assert facts["outputs"] == [] and "kernel exploded" in facts["error"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_input_ignoring_kernel_is_caught_in_every_float_format(dtype):
  # bfloat16 is NumPy kind "V", not "f": the probe must still perturb it.
  a, b = (jax.numpy.asarray(x, dtype) for x in operands(6, m=16))
  held = np.asarray(lax.dot_general(a, b, MM))
  ignoring = lambda x, w: jax.numpy.asarray(held)  # its first call's output
  facts = peat.analyzer.invariance_probe(
      ignoring, [np.asarray(a), np.asarray(b)], golden=[held],
      reference=lambda x, w: (np.asarray(x, np.float64)
                              @ np.asarray(w, np.float64)),
      in_axes=[0, None], out_axes=[0])
  ins = facts["outputs"][0]["insensitive"]
  assert ins["moved"] > 0 and ins["still"] == ins["moved"]
  diag = peat.detector.with_invariance(
      peat.detect(peat.analyze(held, held)), facts)
  assert (diag.model, diag.verdict) == ("input_insensitive", "fail")
