"""Training-level significance of runtime FI (profiler/_weights.py,
profiler/_significance.py, the runtime records and the report's verdict).

Weight distances are checked against float64 references (numpy for the
relative L2, scipy's Wasserstein distance for W1), the bf16 proxy against a
float64 computation of the same rounded training step, and the runtime
records against an independent re-run of the KUT's trajectory.
"""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from scipy import stats

import peat_jax as peat
from peat_jax import profiler
from peat_jax import report
from peat_jax.kernels import kut
from peat_jax.profiler.runtime_fi import _significance
from peat_jax.profiler.runtime_fi import _weights
from peat_jax.report import _training as _rtraining

KUT = "native:matmul:in_bf16"
_spec = importlib.util.spec_from_file_location(
    "peat_old_campaign_tiny",
    os.path.join(os.path.dirname(os.path.dirname(__file__)), "old_campaign", "tiny.py"))
_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tiny)
TASK = _tiny.get_task()  # one dense layer: a forward and a backward matmul


def _r(x):
  """Round to nearest bfloat16, as float64."""
  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(
      np.float64)


# ------------------------------------------------------------ distances


def test_distances_match_float64_references():
  rng = np.random.default_rng(3)
  gold = {"dense": {"kernel": rng.standard_normal((37, 5)).astype(np.float32),
                    "bias": rng.standard_normal(11).astype(np.float32)}}
  run = jax.tree.map(
      lambda x: (x + 0.01 * rng.standard_normal(x.shape)).astype(np.float32),
      gold)
  d = _weights.distances(jax.tree.map(jnp.asarray, run),
                         jax.tree.map(jnp.asarray, gold))
  assert d["layers"] == ["dense/bias", "dense/kernel"]
  leaves = [(run["dense"][k], gold["dense"][k]) for k in ("bias", "kernel")]
  for i, (a, b) in enumerate(leaves):
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    np.testing.assert_allclose(
        d["rel_l2"][i], np.linalg.norm(a64 - b64) / np.linalg.norm(b64),
        rtol=1e-5)
    np.testing.assert_allclose(d["w1"][i],
                               stats.wasserstein_distance(a64, b64),
                               rtol=1e-5)
  sizes = np.array([11, 185])
  np.testing.assert_allclose(d["w1_total"],
                             np.sum(sizes * np.array(d["w1"])) / 196,
                             rtol=1e-6)
  a_all = np.concatenate([a.astype(np.float64).ravel() for a, _ in leaves])
  b_all = np.concatenate([b.astype(np.float64).ravel() for _, b in leaves])
  np.testing.assert_allclose(
      d["rel_l2_total"],
      np.linalg.norm(a_all - b_all) / np.linalg.norm(b_all), rtol=1e-5)
  same = _weights.distances(gold, gold)
  assert same["w1"] == [0.0, 0.0] and same["rel_l2_total"] == 0.0


def test_wasserstein_ignores_permutations_l2_does_not():
  rng = np.random.default_rng(4)
  w = rng.standard_normal((64, 8)).astype(np.float32)
  shuffled = rng.permutation(w.ravel()).reshape(w.shape)
  d = _weights.distances({"w": shuffled}, {"w": w})
  assert d["w1"] == [0.0] and d["rel_l2"][0] > 1.0


def test_significance_ratios_and_missing_yardsticks():
  def rec(scale):
    return {"steps": [2, 4], "layers": ["a", "b"],
            "w1": [[1 * scale, 2 * scale], [3 * scale, 4 * scale]],
            "rel_l2": [[scale, scale], [2 * scale, 2 * scale]],
            "w1_total": [1.5 * scale, 3.5 * scale],
            "rel_l2_total": [scale, 2 * scale]}

  sig = _significance.significance(rec(0.3), rec(2.0), rec(1.0))
  assert sig["step"] == 4 and sig["metric"] == "w1"
  assert sig["vs_bf16"] == pytest.approx(0.3)
  assert sig["vs_seed"] == pytest.approx(0.15)
  assert sig["total"]["vs_bf16"]["rel_l2"] == pytest.approx([0.3, 0.3])
  b = sig["layers"][1]
  assert b["layer"] == "b" and b["vs_seed"]["w1"] == pytest.approx([0.15,
                                                                    0.15])
  no_seed = _significance.significance(rec(0.3), None, rec(1.0))
  assert no_seed["vs_seed"] is None and no_seed["total"]["seed"] is None
  zero = _significance.significance(rec(0.3), rec(0.0), rec(1.0))
  assert zero["vs_seed"] is None  # a zero yardstick gives no ratio
  assert _significance.significance(None, rec(1.0), rec(1.0)) is None
  assert report.significance_sentence(sig) == (
      "moves the weights 0.3x as much as bf16 training, 0.15x the "
      "seed-to-seed distance (Wasserstein-1 of the weight values at step 4)")


# ------------------------------------------------------------ bf16 proxy


def _grad_step(state, batch):
  def loss_fn(w):
    return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)
  return jax.grad(loss_fn)(state)


def test_bf16_proxy_rounds_forward_and_backward_matmul_inputs():
  rng = np.random.default_rng(5)
  w = rng.standard_normal((24, 3)).astype(np.float32)
  batch = {"x": rng.standard_normal((32, 24)).astype(np.float32),
           "y": rng.standard_normal((32, 3)).astype(np.float32)}
  proxy = jax.jit(_weights.bf16_proxy(_grad_step, w, batch))
  got = np.asarray(proxy(w, batch), np.float64)
  x, y = batch["x"].astype(np.float64), batch["y"].astype(np.float64)
  p = _r(x) @ _r(w)  # forward matmul at bf16 inputs, wide accumulation
  g = 2.0 * (p - y) / p.size
  want = _r(x).T @ _r(g)  # the backward matmul's inputs are rounded too
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
  exact = x.T @ (2.0 * (x @ w.astype(np.float64) - y) / p.size)
  err = np.abs(got - exact).max() / np.abs(exact).max()
  assert 1e-4 < err < 2e-2  # bf16-sized, not float32-sized, not garbage


def test_bf16_inputs_at_a_convolution_site():
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.standard_normal((2, 6, 6, 3)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((3, 3, 3, 4)), jnp.float32)
  dn = jax.lax.conv_dimension_numbers(x.shape, k.shape,
                                      ("NHWC", "HWIO", "NHWC"))

  def conv(x, k):
    return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                        dimension_numbers=dn)

  proxy = jax.jit(_weights.bf16_proxy(conv, x, k))
  rounded = [a.astype(jnp.bfloat16).astype(jnp.float32) for a in (x, k)]
  np.testing.assert_array_equal(np.asarray(proxy(x, k)),
                                np.asarray(jax.jit(conv)(*rounded)))
  assert not np.array_equal(np.asarray(proxy(x, k)),
                            np.asarray(jax.jit(conv)(x, k)))


def _e4m3_scaled(x):
  """Reference of the proxy's fp8 rounding: one scale per tensor, the
  rescaled value back in the operand's bf16."""
  x = np.asarray(x, np.float32)
  s = np.float32(np.abs(x).max() / np.float32(448.0))
  q = (x / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s
  return _r(q)


def test_a_bf16_model_s_proxy_is_one_format_below_its_own():
  """bf16 matmul inputs go to scaled fp8 e4m3 (bf16 again changes nothing);
  float32 ones to bf16; the formats are named."""
  rng = np.random.default_rng(7)
  w = jnp.asarray(rng.standard_normal((24, 3)) * 0.3, jnp.bfloat16)
  x = jnp.asarray(rng.standard_normal((32, 24)) * 5.0, jnp.bfloat16)

  def fwd(w, x):
    return jnp.dot(x, w, preferred_element_type=jnp.float32)

  got = np.asarray(jax.jit(_weights.bf16_proxy(fwd, w, x))(w, x), np.float64)
  want = _e4m3_scaled(x.astype(np.float32)) @ _e4m3_scaled(
      w.astype(np.float32))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  err = np.abs(got - exact).max() / np.abs(exact).max()
  assert 2 ** -8 < err < 2 ** -2  # fp8-sized: beyond bf16's, not garbage
  assert _weights.proxy_formats(fwd, w, x) == "fp8_e4m3"
  w32, x32 = w.astype(jnp.float32), x.astype(jnp.float32)
  assert _weights.proxy_formats(fwd, w32, x32) == "bf16"
  assert _weights.proxy_format(jnp.int32) is None


def test_sentence_names_the_proxy_and_benign_warnings_pass_far_below():
  def runs(vs):
    return [{"frequency": f"f{i}", "significance": {
        "step": 40, "vs_bf16": v, "vs_seed": 0.1, "proxy": "fp8_e4m3"}}
            for i, v in enumerate(vs)]

  warn = {"verdict": "warn", "summary": "warn: 2 of 8 records",
          "deciding": [["s", 0]]}
  out = _rtraining.with_significance(warn, runs([0.004, 0.02]),
                                           benign_warn=True)
  assert out["verdict"] == "pass" and out["deciding"] == []
  assert "fp8 (e4m3, per-tensor scaled) training" in out["summary"]
  assert "0.02x" in out["benign_note"]
  # Not benign, or a training effect near the proxy: the warn stays.
  assert _rtraining.with_significance(
      warn, runs([0.004]), benign_warn=False)["verdict"] == "warn"
  assert _rtraining.with_significance(
      warn, runs([0.004, 0.5]), benign_warn=True)["verdict"] == "warn"
  assert _rtraining.with_significance(
      warn, [], benign_warn=True)["verdict"] == "warn"
  fail = dict(warn, verdict="fail")
  assert _rtraining.with_significance(
      fail, runs([0.001]), benign_warn=True)["verdict"] == "fail"


# ------------------------------------------------------------ runtime FI


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
  d = tmp_path_factory.mktemp("sig") / "golden"
  peat.golden_train(TASK, d, steps=4, checkpoint_every=2, evaluate=False)
  return d


def _records(d):
  return {r["name"]: r for r in profiler.read_records(
      d / profiler.RUNTIME_FILE)}


def test_runtime_records_weight_distances_at_saved_steps(golden, tmp_path):
  res = peat.runtime(TASK, golden, KUT, frequencies=("every",), steps=4,
                     seeds=(1,), campaign_dir=tmp_path)
  recs = _records(tmp_path)
  assert set(recs) == {"golden", "spread", "bf16", "every"}
  for r in recs.values():
    assert r["weights"]["steps"] == [2, 4]
    assert r["weights"]["layers"] == ["b", "w"]
  # The golden trajectory retrained from step 0 is the checkpointed one.
  assert recs["golden"]["weights"]["w1_total"] == [0.0, 0.0]
  assert recs["golden"]["weights"]["rel_l2_total"] == [0.0, 0.0]
  assert recs["bf16"]["label"] == _significance.BF16_LABEL
  assert min(recs["bf16"]["weights"]["w1_total"]) > 0
  # Seeds start from other weights: far more than rounding noise apart.
  assert min(recs["spread"]["weights"]["rel_l2_total"]) > 0.1
  # The KUT's distance at step 2, re-measured on an independent re-run.
  state = peat.restore_state(golden, TASK, 0)
  sub, = kut.resolve_kut(KUT)
  step = jax.jit(peat.substitute(TASK.step_fn, sub))
  for _ in range(2):
    state, _ = step(state, TASK.batch_at(int(state.data_position)))
  gold2 = peat.restore_state(golden, TASK, 2)
  want = [stats.wasserstein_distance(
      np.asarray(state.params[k], np.float64).ravel(),
      np.asarray(gold2.params[k], np.float64).ravel()) for k in ("b", "w")]
  got = recs["every"]["weights"]["w1"][0]
  np.testing.assert_allclose(got, want, rtol=1e-4)
  assert min(want) > 0
  run, = res.runs
  sig = run["significance"]
  w_kut = recs["every"]["weights"]["w1_total"][-1]
  assert sig["vs_bf16"] == pytest.approx(
      w_kut / recs["bf16"]["weights"]["w1_total"][-1])
  assert sig["vs_seed"] == pytest.approx(
      w_kut / recs["spread"]["weights"]["w1_total"][-1])
  assert len(res.spread["bf16_loss"]) == 4
  # A second call finds everything recorded: the file does not grow.
  n = len(profiler.read_records(tmp_path / profiler.RUNTIME_FILE))
  again = peat.runtime(TASK, golden, KUT, frequencies=("every",), steps=4,
                       seeds=(1,), campaign_dir=tmp_path)
  assert len(profiler.read_records(tmp_path / profiler.RUNTIME_FILE)) == n
  assert again.runs == res.runs


def test_runtime_from_a_later_checkpoint(golden, tmp_path):
  res = peat.runtime(TASK, golden, KUT, frequencies=("every",), steps=2,
                     start_step=2, seeds=(1,), campaign_dir=tmp_path)
  recs = _records(tmp_path)
  assert recs["golden"]["weights"]["steps"] == [4]
  assert recs["golden"]["weights"]["w1_total"] == [0.0]
  # Seed runs from fresh states, against a fresh seed-0 run, 2 steps in.
  assert recs["spread"]["weights"]["steps"] == [4]
  assert recs["spread"]["weights"]["rel_l2_total"][0] > 0.1
  assert res.runs[0]["significance"]["step"] == 4


def test_golden_kut_does_not_move_the_weights(golden, tmp_path):
  res = peat.runtime(TASK, golden, "golden", frequencies=("every",),
                     steps=4, seeds=(1,), campaign_dir=tmp_path)
  sig = res.runs[0]["significance"]
  assert sig["vs_bf16"] == 0.0 and sig["vs_seed"] == 0.0


def _fp8_inputs(lhs, rhs, **params):
  """A matmul at fp8_e4m3 inputs: far coarser than bf16."""
  key = jax.random.key(0)
  return jax.lax.dot_general_p.bind(
      peat.inject("precision:fp8_e4m3", key, lhs),
      peat.inject("precision:fp8_e4m3", key, rhs), **params)


def test_a_kut_beyond_the_bf16_proxy_warns(golden, tmp_path):
  kut.register_kut("test:fp8_matmul", _fp8_inputs, kernel="dot_general")
  res = peat.runtime(TASK, golden, "test:fp8_matmul", frequencies=("every",),
                     steps=4, seeds=(1,), campaign_dir=tmp_path)
  sig = res.runs[0]["significance"]
  assert sig["vs_bf16"] > 1.0  # measured, not assumed
  passing = {("fwd/dot_general:0", 0): peat.Diagnosis(
      "reordering", 0.9, "within the floor", {}, (), "pass")}
  v = report.verdict_data(passing, [], res.runs)
  assert v["verdict"] == "warn"
  assert v["summary"].startswith("warn: Runtime FI (every call): the KUT "
                                 "moves the weights ")
  assert "beyond the bf16 proxy" in v["summary"]
  assert v["deciding"] == [["runtime every call", 4]]
  # Crash findings keep failing; the sentence is added.
  crash = {"kind": "crash", "phase": "runtime", "kut": "x", "step": None,
           "site": None, "frequency": "every", "signal": "SIGSEGV",
           "timeout_s": None, "message": "died"}
  v = report.verdict_data(passing, [crash], res.runs)
  assert v["verdict"] == "fail" and "beyond the bf16 proxy" in v["summary"]
  # Within the proxy: information only, the verdict stays.
  inside = [dict(r, significance=dict(r["significance"], vs_bf16=0.5))
            for r in res.runs]
  v = report.verdict_data(passing, [], inside)
  assert v["verdict"] == "pass" and "0.5x as much as bf16" in v["summary"]


def test_validate_reports_significance_and_provenance(tmp_path):
  paths = peat.validate(TASK, KUT, tmp_path / "c", steps=4,
                        checkpoint_every=2, frequencies=("every",),
                        progress=None)
  data = json.loads((tmp_path / "c" / "report.json").read_text())
  sig = data["runtime"][0]["significance"]
  assert sig["steps"] == [2, 4] and sig["vs_bf16"] > 0
  assert [l["layer"] for l in sig["layers"]] == ["b", "w"]
  assert "moves the weights" in data["verdict"]["summary"]
  assert len(data["runtime_spread"]["bf16_loss"]) == 4
  prov = data["provenance"]
  assert prov["kut"]["spec"] == KUT and prov["kut"]["content"]["sha256"]
  assert prov["sites"] == [{"site": "fwd/dot_general:0",
                            "kernel": "dot_general", "phase": "fwd",
                            "in_shapes": [[16, 32], [32, 10]],
                            "in_dtypes": ["float32", "float32"]}]
  assert prov["phases"] == ["fwd"] and prov["checkpoint_steps"] == [0, 2]
  assert prov["frequencies"] == ["every call"]
  assert prov["versions"]["jax"] == jax.__version__
  assert prov["platform"]["backend"] == jax.default_backend()
  page = open(paths.html, encoding="utf-8").read()
  for words in ('id="significance"', 'id="provenance"', 'id="trends"',
                "A pass covers exactly this and nothing else"):
    assert words in page
  text = report.summary_table(data)
  assert "moves the weights" in text and "provenance: KUT " + KUT in text
  rebuilt = peat.rebuild_report(tmp_path / "c")
  assert rebuilt.data["provenance"] == prov
