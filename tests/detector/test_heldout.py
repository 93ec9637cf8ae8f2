"""The held-out calibration generator (peat_jax/detector/_heldout.py).

What these tests hold: the generator is bitwise deterministic for a seed;
every fault changes the output it is planted on; every expected name is
one the Detector can give; the TF32 / bf16 rounding emulations do what
their bit formulas say; a small run returns one record per produced
output. The Detector's accuracy on the split is not asserted here:
benchmarks/detector_heldout.py reports it.
"""

import numpy as np
import pytest

from peat_jax.core import PeatError
from peat_jax.detector.calibration import _heldout as heldout

#: The Detector's names (docs/detector.md): a ``<fmt>`` takes a format.
KNOWN = ("exact reordering precision:<fmt> accumulation:<fmt> truncation "
         "ftz saturation bitflip stuck_at random_value zero nan lane "
         "indexing scale nondeterminism parameter approximation "
         "unknown").split()
FORMATS = ("tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp32")


def _known(name: str) -> bool:
  head, _, fmt = name.partition(":")
  if fmt:
    return f"{head}:<fmt>" in KNOWN and fmt in FORMATS
  return name in KNOWN


def _bits(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x)
  return x.view({4: np.uint32, 2: np.uint16, 8: np.uint64}[x.dtype.itemsize])


def _same_bits(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
      _bits(a), _bits(b))


def _wide_floats(seed: int, n: int = 4096) -> np.ndarray:
  """float32 of both signs over many binades, none zero, some exact ties."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(
      np.float32)
  x[x == 0] = np.float32(0.75)
  u = x.view(np.uint32)
  u[:64] = (u[:64] & np.uint32(~0x1FFF & 0xFFFFFFFF)) | np.uint32(0x1000)
  u[64:128] = (u[64:128] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
  return x


@pytest.fixture(scope="module")
def cases():
  return heldout.heldout_cases(0)


# ---------------------------------------------------------- determinism


def test_cases_are_bitwise_the_same_for_a_seed(cases):
  again = heldout.heldout_cases(0)
  assert [c.source for c in again] == [c.source for c in cases]
  for a, b in zip(cases, again):
    for x, y in zip(a.inputs, b.inputs):
      if isinstance(x, float):
        assert x == y
      else:
        assert _same_bits(x, y), a.source


def test_another_seed_draws_other_inputs(cases):
  other = heldout.heldout_cases(1)
  assert not _same_bits(other[0].inputs[0], cases[0].inputs[0])


def test_produced_outputs_are_bitwise_the_same_for_a_seed(cases):
  for index in (0, 14):
    case = cases[index]
    xs = heldout.cast_inputs(case.inputs, "float32")
    first = list(heldout.produce(case, "float32", xs, 0, index))
    second = list(heldout.produce(case, "float32", xs, 0, index))
    assert [(p.base.name, p.fault and p.fault.name) for p in first] == [
        (p.base.name, p.fault and p.fault.name) for p in second]
    for p, q in zip(first, second):
      assert _same_bits(p.output, q.output), (p.base.name, p.fault)


def test_cases_stay_small_and_cover_every_kernel(cases):
  assert {c.kernel for c in cases} == {
      "matmul", "softmax", "layer_norm", "rms_norm", "gelu", "silu", "conv"}
  for c in cases:
    assert all(np.size(x) < 300_000 for x in c.inputs), c.source


# --------------------------------------------------------------- faults


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_fault_changes_its_output(cases, dtype):
  exact = heldout.BASES["exact"]
  for index, case in enumerate(cases):
    xs = heldout.cast_inputs(case.inputs, dtype)
    out = exact.fn(case, xs)
    for base, fault in heldout.plan(case, dtype):
      if base is not exact or fault is None or fault.name == "flush_tiny":
        continue  # flush_tiny: below, on outputs that have tiny values
      rng = np.random.default_rng(index)
      faulted, _ = heldout.apply_fault(fault, rng, case, base, xs, out)
      assert faulted.dtype == out.dtype and faulted.shape == out.shape
      assert not _same_bits(faulted, out), (case.source, fault.name)


def test_flush_tiny_flushes_tiny_values_to_signed_zero():
  out = np.array([[1e-39, -3e-39, 2.5, -0.5], [1.1e-38, 1.3e-38, -7e-37,
                                               0.25]], np.float32)
  t, detail = heldout.fault_flush_tiny(np.random.default_rng(0), out)
  assert not _same_bits(t, out) and detail.startswith("3 values")
  assert _same_bits(t[0, :2], np.array([0.0, -0.0], np.float32))
  assert t[1, 0] == 0 and _same_bits(t[:, 2:], out[:, 2:])
  assert t[1, 1] == out[1, 1]
  normal = np.array([-1.5e-38, 0.5], np.float32)
  assert _same_bits(heldout.fault_flush_tiny(None, normal)[0], normal)


def test_bit_faults_hit_the_bits_they_name(cases):
  out = heldout.BASES["exact"].fn(cases[0], cases[0].inputs)
  rng = np.random.default_rng(5)
  t, _ = heldout.fault_bitflip_multi(rng, out)
  diff = _bits(t) ^ _bits(out)
  changed = diff[diff != 0]
  assert changed.size == 5
  assert all(bin(int(d)).count("1") == 3 for d in changed)
  assert np.all(np.isfinite(t))
  t, detail = heldout.fault_stuck_at(np.random.default_rng(6), out)
  bit = np.uint32(1 << int(detail.split()[1]))
  diff = _bits(t) ^ _bits(out)
  assert np.all((diff == 0) | (diff == bit))  # only that bit, set to 1
  assert np.all(_bits(t)[diff != 0] & bit)
  assert 0.05 < (diff != 0).mean() <= 0.35


def test_wrong_formula_is_the_other_activation(cases):
  gelu_case = next(c for c in cases if c.kernel == "gelu")
  exact = heldout.BASES["exact"]
  fault = heldout.FAULTS["wrong_formula"]
  t, _ = heldout.apply_fault(fault, None, gelu_case, exact, gelu_case.inputs,
                             exact.fn(gelu_case, gelu_case.inputs))
  silu = heldout.run_golden(heldout.silu, gelu_case.inputs)
  assert _same_bits(t, silu)


# -------------------------------------------------------- expected names


def test_every_expected_name_is_a_detector_name():
  names = [b.expected for b in heldout.BASES.values()] + [
      f.expected for f in heldout.FAULTS.values()]
  assert all(_known(n) for n in names), [n for n in names if not _known(n)]


def test_benign_names_are_exact_reordering_and_precision():
  assert heldout.is_benign("exact") and heldout.is_benign("reordering")
  assert heldout.is_benign("precision:tf32")
  assert not any(heldout.is_benign(f.expected)
                 for f in heldout.FAULTS.values())


# ------------------------------------------------------------ rounding


def test_tf32_toward_zero_clears_13_bits_and_never_grows():
  x = _wide_floats(1)
  y = heldout.round_tf32(x, "rtz")
  assert y.dtype == np.float32
  assert np.all(_bits(y) & np.uint32(0x1FFF) == 0)
  assert np.all(np.abs(y) <= np.abs(x))
  assert np.all(np.signbit(y) == np.signbit(x))


def test_tf32_nearest_even_is_the_bit_formula():
  x = _wide_floats(2)
  u = x.view(np.uint32)
  want = (u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) \
      & np.uint32(~0x1FFF & 0xFFFFFFFF)
  y = heldout.round_tf32(x, "rne")
  assert np.array_equal(_bits(y), want)
  ulp = np.abs(x.astype(np.float64)) * 2.0**-10
  assert np.all(np.abs(y.astype(np.float64) - x) <= ulp)


def test_bf16_rounding_matches_ml_dtypes():
  import ml_dtypes
  x = _wide_floats(3)
  near = heldout.round_bf16(x, "rne")
  assert _same_bits(near, x.astype(ml_dtypes.bfloat16).astype(np.float32))
  zero = heldout.round_bf16(x, "rtz")
  assert np.all(_bits(zero) & np.uint32(0xFFFF) == 0)
  assert np.all(np.abs(zero) <= np.abs(x))


def test_unknown_rounding_mode_names_the_fix():
  with pytest.raises(PeatError, match="Fix"):
    heldout.round_tf32(np.ones(3, np.float32), "up")


# ----------------------------------------------------------------- runs


def test_unknown_path_or_dtype_is_refused():
  with pytest.raises(PeatError, match="unknown held-out path"):
    heldout.run_heldout(path="playback")
  with pytest.raises(PeatError, match="unknown held-out dtypes"):
    heldout.run_heldout(dtypes=("float8",))


def test_a_small_run_has_one_record_per_produced_output(cases):
  picked = [0, 18]  # a K 96 matmul and a small-magnitude SiLU
  expected = []
  for index in picked:
    case = cases[index]
    xs = heldout.cast_inputs(case.inputs, "float32")
    produced = list(heldout.produce(case, "float32", xs, 0, index))
    assert len(produced) <= len(heldout.plan(case, "float32"))
    expected += [(case.source, p.base.name,
                  "none" if p.fault is None else p.fault.name)
                 for p in produced]
  lines = []
  result = heldout.run_heldout(
      (0,), "output", ("float32",), lines.append,
      cases=lambda seed: [cases[i] for i in picked])
  got = [(r.source, r.base, heldout.family(r)) for r in result.records]
  assert got == expected
  assert len(lines) == 2
  assert {r.origin for r in result.records} == {"heldout"}
  assert all(r.verdict in ("pass", "warn", "fail") for r in result.records)
  tables = heldout.heldout_tables(result)
  for title in ("family", "base", "dtype", "kernel"):
    assert f"### by {title}" in tables
