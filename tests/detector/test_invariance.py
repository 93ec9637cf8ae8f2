"""The Detector's invariance models: stale, input_mutation,
input_insensitive, batch_variance.

Each model is produced by a real kernel under test (the escape suite's C++
matmuls, benchmarks/escape/escape_kernels.cc), probed as playback probes a
site (peat.analyzer.invariance_probe) and diagnosed as playback diagnoses a
record (peat.detect of the signature, then peat.detector.with_invariance).
The rules' thresholds are checked on facts at both sides of them.
"""

import jax
import numpy as np
import pytest
from jax import lax

import peat_jax as peat

MM = (((1,), (0,)), ((), ()))

# (forward symbol, backward symbol, model, verdict, secondary or None)
KERNELS = [
    ("EscMatmulCached", "EscMatmulBwd", "stale", "fail", "reordering"),
    ("EscMatmulZeroInput", "EscMatmulBwd", "input_mutation", "fail", None),
    ("EscMatmulSubsample", "EscMatmulSubsampleBwd", "input_insensitive",
     "fail", None),
    ("EscMatmulBatchSplit", "EscMatmulBwd", "batch_variance", "warn",
     "reordering"),
]


def _diagnose(lib, fwd, bwd, seed=0):
  spec = peat.kernels.parse_kut(f"ffi:{lib}:{fwd}:{bwd}",
                                kernel="dot_general")
  kut = peat.resolve_kut(spec)[0].kut
  fn = jax.jit(lambda a, b: kut(a, b, dimension_numbers=MM, precision=None,
                                preferred_element_type=None,
                                out_sharding=None))
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((16, 64)).astype(np.float32)
  b = rng.standard_normal((64, 24)).astype(np.float32)
  ref = lambda x, w: x.astype(np.float64) @ w.astype(np.float64)
  g = np.asarray(lax.dot_general(a, b, MM))
  facts = peat.analyzer.invariance_probe(fn, [a, b], reference=ref,
                                         golden=[g], in_axes=[0, None],
                                         out_axes=[0])
  t = np.asarray(fn(a.copy(), b.copy()))
  diag = peat.detect(peat.analyze(t, g, ref(a, b)),
                     context={"kernel": "dot_general", "reduction": 64})
  return diag, peat.detector.with_invariance(diag, facts)


@pytest.mark.parametrize("fwd,bwd,model,verdict,secondary", KERNELS)
def test_escape_kernel_is_named_with_its_verdict(escape_lib, fwd, bwd, model,
                                                  verdict, secondary):
  before, diag = _diagnose(escape_lib, fwd, bwd)
  assert diag.model == model, diag.evidence
  assert diag.verdict == verdict
  assert diag.model in peat.detector.INVARIANCE_MODELS
  if secondary is not None:  # the signature's own model stays, second
    assert diag.secondary is not None and diag.secondary.model == secondary
  assert before.model in [c.model for c in diag.candidates]


def test_correct_kernel_keeps_its_diagnosis(escape_lib):
  before, diag = _diagnose(escape_lib, "EscMatmul", "EscMatmulBwd")
  assert diag is before  # no invariance model holds: nothing changes
  assert diag.model == "reordering"


def test_zeroing_evidence_names_the_input_and_the_count(escape_lib):
  _, diag = _diagnose(escape_lib, "EscMatmulZeroInput", "EscMatmulBwd")
  assert "input 0: 1024 of 1024 elements (1024 now zero)" in diag.evidence


def _batch_facts(rms, noise=1e-7, differ=5):
  probe = {"rows": 1, "n": 10, "differ": differ, "max_ulps": 12, "rms": rms}
  return {"mutation": [], "outputs": [{"batch": {
      "rows": 8, "alone": probe, "noise_rms": noise}}]}


def _exact():
  c = peat.detector.Candidate("exact", 1.0, "all equal", {})
  return peat.detector.Diagnosis("exact", 1.0, "all equal", {}, (c,), "pass")


@pytest.mark.parametrize("rms,verdict", [(1e-7, "warn"), (1.5e-6, "warn"),
                                         (1.7e-6, "fail"), (1e-3, "fail")])
def test_batch_variance_warns_within_the_envelope_fails_beyond(rms, verdict):
  diag = peat.detector.with_invariance(_exact(), _batch_facts(rms))
  assert diag.model == "batch_variance" and diag.verdict == verdict
  assert "up to 12 ulps" in diag.evidence
  assert diag.secondary is None  # the signature was exact


def test_no_difference_is_no_batch_variance():
  base = _exact()
  assert peat.detector.with_invariance(base, _batch_facts(0, differ=0)) is base


@pytest.mark.parametrize("moved,still,elsewhere,named", [
    (100, 100, 0, True),    # a constant result
    (100, 13, 0, True),     # 1/8 ignored: a subsample
    (100, 12, 0, False),    # below 1/8
    (100, 7, 0, False),     # fewer than 8
    (100, 50, 40, False),   # it moved elsewhere: a permutation
])
def test_insensitive_thresholds(moved, still, elsewhere, named):
  facts = {"mutation": [], "outputs": [{"insensitive": {
      "moved": moved, "still": still, "elsewhere": elsewhere, "n": 200}}]}
  models = [c.model for c in peat.detector.invariance_candidates(facts)]
  assert ("input_insensitive" in models) == named


@pytest.mark.parametrize("changed,previous,model", [
    (80, 80, "stale"), (80, 72, "stale"), (80, 71, "nondeterminism"),
    (4, 4, "stale"), (80, 0, "nondeterminism")])
def test_repeat_stale_or_nondeterministic(changed, previous, model):
  facts = {"mutation": [], "outputs": [{"repeat": {
      "changed": changed, "from_previous": previous,
      "rows_from_previous": 1, "rows": 8}}]}
  diag = peat.detector.with_invariance(_exact(), facts)
  assert diag.model == model
  assert diag.verdict == ("fail" if model == "stale" else "warn")


def test_history_names_the_other_buffer():
  facts = {"mutation": [], "outputs": [{"history": {
      "stale_rows": 64, "rows": 320, "source": "fwd/attention:1 at step 0"}}]}
  diag = peat.detector.with_invariance(_exact(), facts)
  assert diag.model == "stale" and diag.verdict == "fail"
  assert "fwd/attention:1 at step 0" in diag.evidence


def test_new_nan_on_a_dense_error_is_named_nan(escape_lib):
  """The fp16 softmax: fp16 rounding everywhere (a dense error the
  decomposition reads) and NaN in the rows whose scores pass 11.09."""
  spec = peat.kernels.parse_kut(
      f"ffi:{escape_lib}:EscSoftmaxF16:EscSoftmaxBwd", kernel="softmax")
  kut = jax.jit(peat.resolve_kut(spec)[0].kut)
  rng = np.random.default_rng(7)
  x = (3 * rng.standard_normal((64, 40))).astype(np.float32)
  x[:4, 0] = 14.0  # four rows overflow fp16 in exp
  t, g = np.asarray(kut(x)), np.asarray(jax.nn.softmax(x, axis=-1))
  with jax.enable_x64(True):
    r = np.asarray(jax.nn.softmax(jax.numpy.asarray(x, jax.numpy.float64),
                                  axis=-1))
  diag = peat.detect(peat.analyze(t, g, r),
                     context={"kernel": "softmax", "reduction": 40})
  assert diag.model == "nan" and diag.verdict == "fail"
  assert np.isnan(t[:4]).any() and np.isfinite(t[4:]).all()


def test_permuted_batches_on_a_reference_are_indexing(escape_lib):
  """The strided port's output is golden's bits in other places; with a
  float64 reference the record is decomposed, and still indexing."""
  import escape_jax  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(8)
  q = rng.standard_normal((2, 40, 4, 32)).astype(np.float32)
  k = rng.standard_normal((2, 40, 4, 32)).astype(np.float32)
  dn = (((3,), (3,)), ((0, 2), (0, 2)))
  g = np.asarray(lax.dot_general(q, k, dn))
  t = np.asarray(escape_jax.dot_general_by_stride(q, k, dimension_numbers=dn))
  r = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64))
  diag = peat.detect(peat.analyze(t, g, r),
                     context={"kernel": "dot_general", "reduction": 32})
  assert diag.model == "indexing" and diag.verdict == "fail"
  assert "multiset of golden bit patterns" in diag.evidence
