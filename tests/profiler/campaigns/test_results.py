"""The user's task (peat.nnx_task), results as data (peat.read_campaign) and
peat.testing.assert_kernel_trains, on one tiny stock-Flax campaign."""

import builtins
import hashlib
import json
import os

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import peat_jax as peat
from peat_jax import profiler

LN_KUT = "py:byo_model:layer_norm"


@pytest.fixture(scope="module")
def campaign(byo, tmp_path_factory):
  """A validate campaign of a py: KUT on the user's task (via peat.testing)."""
  del byo
  d = tmp_path_factory.mktemp("results") / "c"
  results = peat.testing.assert_kernel_trains(
      LN_KUT, kernel="layer_norm", task="byo_model:task", steps=4,
      checkpoint_every=2, frequencies=("every",), campaign_dir=d)
  return d, results


# ----------------------------------------------------------- nnx_task


def test_nnx_task_fills_in_step_state_and_evaluation(byo):
  del byo
  import byo_model  # pylint: disable=g-import-not-at-top
  task = byo_model.task()
  s0, s1 = task.init_state(0), task.init_state(1)
  assert task.name == "byo_net" and task.default_steps == 4
  assert not all(np.array_equal(a, b) for a, b in zip(  # fresh per seed
      jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)))
  state, metrics = task.train_step(s0, task.batch_at(0))
  assert int(state.step) == 1 and int(state.data_position) == 1
  assert sorted(metrics) == ["grad_norm", "loss", "update_norm"]
  assert float(metrics["update_norm"]) == pytest.approx(
      0.1 * float(metrics["grad_norm"]), rel=1e-5)   # sgd(0.1)
  ev = task.evaluate(state)
  assert list(ev) == ["eval_loss"] and np.isfinite(ev["eval_loss"])
  logits = task.model_fn(state.params, task.batch_at(0)["x"])
  assert logits.shape == (8, 10)


class _WithBatchStats(nnx.Module):
  def __init__(self, rngs):
    self.bn = nnx.BatchNorm(4, rngs=rngs)


@pytest.mark.parametrize("make_model, message", [
    (nnx.Linear(2, 2, rngs=nnx.Rngs(0)), "needs a function that builds"),
    (lambda rngs: _WithBatchStats(rngs), "state other than nnx.Param"),
    (lambda rngs: 3, "the model function returned .*; expected an "
     "nnx.Module"),
])
def test_nnx_task_refuses_what_it_cannot_train(make_model, message):
  with pytest.raises(peat.PeatError, match=message):
    peat.nnx_task(make_model, optax.sgd(0.1), lambda m, b: 0.0, lambda p: {})


def test_a_non_scalar_loss_is_named():
  task = peat.nnx_task(lambda rngs: nnx.Linear(3, 2, rngs=rngs),
                       optax.sgd(0.1), lambda m, b: m(b), lambda p: np.ones(
                           (4, 3), np.float32))
  with pytest.raises(peat.PeatError, match=r"returned shape \(4, 2\); "
                     "expected a scalar loss"):
    task.train_step(task.init_state(0), task.batch_at(0))


# ------------------------------------------------------- read_campaign


def test_read_campaign_returns_typed_records(campaign):
  d, results = campaign
  c = peat.read_campaign(d)
  assert c == results   # what assert_kernel_trains returned
  assert c.kut == "py:byo_model:layer_norm@layer_norm"
  assert c.settings["kut"] == c.kut and c.scenario == "byo_net"
  assert [(r.step, r.site) for r in c.playback] == [
      (0, "fwd/Net/LayerNorm/layer_norm:0"),
      (2, "fwd/Net/LayerNorm/layer_norm:0")]
  r = c.playback[0]
  assert isinstance(r, profiler.SiteRecord) and r.kernel == "layer_norm"
  assert r.phase == "fwd" and r.verdict in ("pass", "warn")
  assert r.noise_ratio is not None and r.signature["n"] == 8 * 16
  assert [e.step for e in c.effects] == [0, 2]
  (run,) = c.runtime
  assert run.frequency == "every call" and len(run.loss) == 4
  assert run.diverged_at is None and not run.crashed
  assert c.crashes == ()
  report = json.load(open(os.path.join(d, "report.json")))
  assert c.verdict.verdict == report["verdict"]["verdict"]
  assert c.verdict.summary == report["verdict"]["summary"]
  assert c.sites() == [s["site"] for s in report["sites"]]


def test_to_pandas_one_row_per_step_and_site(campaign):
  pd = pytest.importorskip(
      "pandas", reason="pandas is an optional extra (pip install "
      "'peat_jax[pandas]'); its absence is tested below")
  c = peat.read_campaign(campaign[0])
  df = c.to_pandas()
  assert isinstance(df, pd.DataFrame) and len(df) == len(c.playback) == 2
  assert list(df["step"]) == [0, 2] and set(df["kut"]) == {c.kut}
  assert list(df["loss_kut"]) == [e.loss_kut for e in c.effects]
  assert list(df["noise_ratio"]) == [r.noise_ratio for r in c.playback]


def test_to_pandas_without_pandas_names_the_extra(campaign, monkeypatch):
  real = builtins.__import__

  def no_pandas(name, *args, **kwargs):
    if name == "pandas" or name.startswith("pandas."):
      raise ImportError("No module named 'pandas'")
    return real(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_pandas)
  c = peat.read_campaign(campaign[0])
  with pytest.raises(peat.PeatError, match=r"pip install 'peat_jax\[pandas\]'"):
    c.to_pandas()


def test_read_campaign_bad_input(tmp_path):
  with pytest.raises(peat.PeatError, match="does not exist"):
    peat.read_campaign(tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(peat.PeatError, match="expected the records of one KUT"):
    peat.read_campaign(tmp_path / "empty")


# ------------------------------------------------------- peat.testing


def test_assert_kernel_trains_raises_with_diagnoses_and_report(byo, tmp_path):
  del byo
  with pytest.raises(peat.testing.KernelTrainingError) as err:
    peat.testing.assert_kernel_trains(
        "py:byo_model:gelu_bf16", kernel="gelu", task="byo_model:task",
        steps=4, checkpoint_every=2, frequencies=(), fail_on="warn",
        campaign_dir=tmp_path / "c")
  text = str(err.value)
  assert isinstance(err.value, AssertionError)
  assert "verdict warn reaches fail_on='warn'" in text or (
      "verdict fail reaches fail_on='warn'" in text)
  assert "fwd/Net/gelu:0: precision:bf16" in text
  assert f"report: {tmp_path / 'c' / 'report.html'}" in text
  assert err.value.results.verdict.verdict in ("warn", "fail")


def test_assert_kernel_trains_bad_input(byo, tmp_path):
  del byo
  with pytest.raises(peat.PeatError, match="fail_on must be one of"):
    peat.testing.assert_kernel_trains(LN_KUT, kernel="layer_norm",
                                      task="byo_model:task", fail_on="x")
  with pytest.raises(peat.PeatError, match="expected <module>:<function>"):
    peat.testing.assert_kernel_trains(LN_KUT, kernel="layer_norm",
                                      task="byo_model", campaign_dir=tmp_path)


# ------------------------------------------------------- provenance


def test_read_campaign_carries_the_provenance(campaign, byo):
  c = peat.read_campaign(campaign[0])
  p = c.provenance
  assert isinstance(p, profiler.Provenance)
  report = json.load(open(os.path.join(campaign[0], "report.json")))
  assert p.covers == peat.report.covers_sentence(report["provenance"])
  assert p.covers.endswith("were not exercised.")
  assert p.kut["spec"] == c.kut and p.kut["source"] == "py"
  # The content hash covers the user's module, byte for byte.
  path = str(byo / "byo_model.py")
  assert [f["path"] for f in p.kut["content"]["files"]] == [path]
  with open(path, "rb") as f:
    assert p.kut["content"]["files"][0]["sha256"] == hashlib.sha256(
        f.read()).hexdigest()
  assert p.platform["backend"] == jax.default_backend()
  assert p.versions["jax"] == jax.__version__
  assert p.phases == ("fwd",) and p.backward == "golden"
  assert p.checkpoint_steps == (0, 2) and p.frequencies == ("every call",)
  (site,) = p.sites
  assert site["site"] == "fwd/Net/LayerNorm/layer_norm:0"
  assert site["in_shapes"][0] == [8, 16] and site["in_dtypes"][0] == "float32"
  assert list(p.sites) == report["provenance"]["sites"]


@pytest.mark.slow
def test_read_campaign_provenance_of_the_kuts_backward(byo, tmp_path):
  del byo
  d = tmp_path / "bwd"
  peat.validate(peat.TaskFactory.from_spec("byo_model:task"),
                peat.kernels.as_spec("py:byo_model:layer_norm", "layer_norm"),
                str(d), steps=2, checkpoint_every=2, frequencies=(),
                backward="kut", progress=None)
  p = peat.read_campaign(d).provenance
  assert p.backward == "kut" and p.phases == ("bwd", "fwd")
  assert p.checkpoint_steps == (0,) and p.frequencies == ()
  phases = {s["site"]: s["phase"] for s in p.sites}
  assert phases["fwd/Net/LayerNorm/layer_norm:0"] == "fwd"
  assert "bwd" in phases.values()   # the backward sites' records
  assert "(the KUT's VJP at the backward sites)" in p.covers
  summary = open(os.path.join(d, "report.json")).read()
  assert '"backward": "kut"' in summary
