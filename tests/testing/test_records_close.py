"""``peat.testing.assert_records_close``: records across machines.

Another machine rounds the same computations differently in their last
bits. The comparison must accept exactly that (golden and KUT outputs a few
ulps apart, here drawn at random) and refuse what a change of peat_jax or
of the kernel would make (a larger error, another model, a field gained or
lost, a count that moved).
"""

import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import detector


def _record(t, g, r, step=0):
  sig = peat.analyze(jnp.asarray(t), jnp.asarray(g), jnp.asarray(r))
  diag = peat.detect(sig, context={"kernel": "dot_general", "reduction": 96})
  return {"kind": "site", "kut": "native:matmul:in_bf16", "step": step,
          "site": "fwd/dot_general:0", "kernel": "dot_general",
          "phase": "fwd", "reduction": 96,
          "signature": peat.profiler.signature_record(sig),
          "diagnosis": detector.diagnosis_record(diag)}


def _ulps(x, rng, share=0.3, most=2):
  """``x`` moved by up to ``most`` ulps at a ``share`` of its elements."""
  bits = x.view(np.int32).copy()
  hit = rng.random(x.shape) < share
  bits[hit] += rng.integers(-most, most + 1, int(hit.sum())).astype(np.int32)
  return bits.view(np.float32)


@pytest.fixture(scope="module")
def pair():
  """Records of one bf16-input matmul on "two machines" and its inputs."""
  rng = np.random.default_rng(2024)
  a = rng.standard_normal((48, 96)).astype(np.float32)
  b = rng.standard_normal((96, 40)).astype(np.float32)
  g = (a @ b).astype(np.float32)
  bf = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
  t = (bf(a) @ bf(b)).astype(np.float32)
  r = a.astype(np.float64) @ b.astype(np.float64)
  other = np.random.default_rng(7)
  here = _record(t, g, r)
  there = _record(_ulps(t, other), _ulps(g, other), r)
  return here, there, (t, g, r)


def test_another_machines_rounding_is_accepted(pair):
  here, there, _ = pair
  assert here != there  # the last bits did move the float fields
  assert peat.testing.records_differences([here], [there]) == []
  peat.testing.assert_records_close([here], [there])


def test_every_field_of_todays_records_has_a_class(pair):
  here, _, _ = pair
  missing = [k for k in here["signature"] if k not in peat.testing.FIELD_CLASSES]
  assert missing == []


@pytest.mark.parametrize("change,field", [
    (lambda rec: rec["signature"].__setitem__(
        "abs_rms", 2 * rec["signature"]["abs_rms"]), "abs_rms"),
    (lambda rec: rec["diagnosis"].__setitem__("model", "reordering"),
     "diagnosis.model"),
    (lambda rec: rec["diagnosis"].__setitem__("verdict", "fail"),
     "diagnosis.verdict"),
    (lambda rec: rec["signature"].__setitem__(
        "n_nan_test", rec["signature"]["n_nan_test"] + 1), "n_nan_test"),
    (lambda rec: rec["signature"].pop("bias"), "keys differ"),
    (lambda rec: rec["signature"].__setitem__("new_field", 1.0),
     "keys differ"),
    (lambda rec: rec.__setitem__("site", "fwd/dot_general:1"), "site"),
    (lambda rec: rec["signature"].__setitem__(
        "noise_ratio", 5 * rec["signature"]["noise_ratio"]), "noise_ratio"),
    (lambda rec: rec["diagnosis"].__setitem__(
        "evidence", rec["diagnosis"]["evidence"] + " and more"), "evidence"),
], ids=("error_x2", "model", "verdict", "nan_count", "field_lost",
        "field_gained", "site", "noise_x5", "evidence_words"))
def test_what_a_change_makes_is_refused(pair, change, field):
  here, there, _ = pair
  changed = {k: (dict(v) if isinstance(v, dict) else v)
             for k, v in there.items()}
  change(changed)
  found = peat.testing.records_differences([here], [changed])
  assert found and field in found[0], found
  with pytest.raises(AssertionError, match="beyond the cross-machine"):
    peat.testing.assert_records_close([here], [changed])


def test_a_field_without_a_class_is_refused(pair):
  here, _, _ = pair
  a = {**here, "mystery": 1.5}
  b = {**here, "mystery": 1.5}
  found = peat.testing.records_differences([a], [b])
  assert found and "has no class" in found[0]


def test_record_counts_must_match(pair):
  here, there, _ = pair
  assert peat.testing.records_differences([here], [there, there]) == [
      "expected 1 records, got 2"]


def test_a_larger_kut_error_on_another_machine_is_refused(pair):
  """The KUT's error itself (not only the last bits) changed: the same
  golden, a KUT twice as far from it."""
  here, _, (t, g, r) = pair
  worse = _record(g + 2 * (t - g), g, r)
  found = peat.testing.records_differences([here], [worse])
  assert any("abs_rms" in line for line in found), found
