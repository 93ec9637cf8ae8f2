"""Playback and runtime FI with the KUT's VJP at the backward sites.

``peat.playback(..., backward="kut")``, ``peat.playback_many``,
``peat.runtime`` and ``peat.validate`` on two tiny tasks made of public
names (a dense layer; a dense layer, the models' layer-norm and softmax
composites and a second dense layer), and the pre-move campaign fixture
(tests/profiler/old_campaign) for records of ``backward="golden"``.
"""

import importlib.util
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import peat_jax as peat
from peat_jax.models import layers

HERE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "old_campaign")
_spec = importlib.util.spec_from_file_location(
    "peat_old_campaign_tiny_bwd", os.path.join(HERE, "tiny.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

DENSE = tiny.get_task()  # one dense layer: fwd/dot_general:0, bwd/dot_general:0

_TX = optax.sgd(0.05)


def _composite_step(state, batch):
  def loss_fn(p):
    h = batch["x"] @ p["w1"]
    h = layers.layer_norm(h, p["scale"], p["bias"])
    h = h * layers.softmax(h)
    logp = jax.nn.log_softmax(h @ p["w2"])
    return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], 1))

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt = _TX.update(grads, state.opt_state, state.params)
  return (state._replace(step=state.step + 1,
                         params=optax.apply_updates(state.params, updates),
                         opt_state=opt,
                         data_position=state.data_position + 1),
          {"loss": loss, "grad_norm": optax.tree.norm(grads),
           "update_norm": optax.tree.norm(updates)})


def _composite_init(seed):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  params = {"w1": 0.3 * f(24, 16), "scale": 1.0 + 0.1 * f(16),
            "bias": 0.1 * f(16), "w2": 0.3 * f(16, 10)}
  return peat.TrainState(jnp.zeros((), jnp.int32), params, _TX.init(params),
                         jax.random.PRNGKey(seed), jnp.zeros((), jnp.int32))


def _composite_batch(position):
  rng = np.random.default_rng(900 + int(position))
  return {"x": rng.standard_normal((16, 24)).astype(np.float32),
          "y": rng.integers(0, 10, 16).astype(np.int32)}


COMPOSITE = peat.TrainTask(
    name="tiny_composite", config={"batch": 16}, init_state=_composite_init,
    step_fn=_composite_step, train_step=jax.jit(_composite_step),
    batch_at=_composite_batch, evaluate=lambda state: {}, default_steps=4,
    default_checkpoint_every=2, model_fn=None)


def _bind_dot(lhs, rhs, **params):
  return lax.dot_general_p.bind(lhs, rhs, **params)


def _bad_vjp_dot(lhs, rhs, *, dimension_numbers, **unused):
  """An exact forward whose VJP returns 1.5 x the weight cotangent."""
  del unused
  dot = lambda a, b: lax.dot_general(a, b, dimension_numbers)

  @jax.custom_vjp
  def f(a, b):
    return dot(a, b)

  def bwd(res, g):
    da, db = jax.vjp(dot, *res)[1](g)
    return da, db * jnp.float32(1.5)

  f.defvjp(lambda a, b: (dot(a, b), (a, b)), bwd)
  return f(lhs, rhs)


peat.register_kut("test:golden_clone", _bind_dot, kernel="dot_general")
peat.register_kut("test:bad_vjp", _bad_vjp_dot, kernel="dot_general")
peat.register_kut("test:golden_layer_norm", layers.layer_norm.__wrapped__,
                  kernel="layer_norm")
peat.register_kut("test:golden_softmax", layers.softmax.__wrapped__,
                  kernel="softmax")


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
  """Golden runs (4 steps, checkpoints 0 and 2) of both tasks."""
  out = {}
  for task in (DENSE, COMPOSITE):
    d = tmp_path_factory.mktemp(task.name)
    out[task.name] = peat.golden_train(task, str(d / "golden"), steps=4,
                                       checkpoint_every=2, seed=0).workdir
  return out


def _play(goldens, task, specs, tmp_path, **kw):
  return peat.playback_many(task, goldens[task.name], specs,
                            campaign_dir=tmp_path, **kw)


def _by_site(records):
  out = {}
  for r in records:
    out.setdefault(r["site"], []).append(r)
  return out


# ------------------------------------------------------------------ (a)


def test_golden_as_kut_is_exact_at_every_backward_site(goldens, tmp_path):
  specs = ["golden", "test:golden_clone"]
  res = _play(goldens, DENSE, specs, tmp_path / "d", backward="kut")
  comp = _play(goldens, COMPOSITE,
               ["test:golden_layer_norm", "test:golden_softmax"],
               tmp_path / "c", backward="kut")
  for spec, r in list(res.items()) + list(comp.items()):
    bwd = [x for x in r.records if x["phase"] == "bwd"]
    assert bwd and len(bwd) < len(r.records), spec
    for x in r.records:
      assert x["diagnosis"]["model"] == "exact", (spec, x["site"])
      assert x["backward"] == "kut"
    assert r.localization is None
  # The layer norm's backward site has three cotangents (x, scale, bias):
  # one record each, each with a float64 reference VJP.
  ln = [x for x in comp["test:golden_layer_norm"].records
        if x["phase"] == "bwd" and x["step"] == 0]
  assert [x["site"] for x in ln] == [f"bwd/layer_norm:0/d{i}" for i in range(3)]
  assert [x["output"] for x in ln] == [0, 1, 2]
  assert all(math.isfinite(x["signature"]["noise_ratio"]) for x in ln)


# ------------------------------------------------------------------ (b)


def test_wrong_vjp_fails_at_its_backward_site_forward_stays_exact(
    goldens, tmp_path):
  r = peat.playback(DENSE, goldens[DENSE.name], "test:bad_vjp",
                    campaign_dir=tmp_path, backward="kut")
  sites = _by_site(r.records)
  assert sorted(sites) == ["bwd/dot_general:0", "fwd/dot_general:0"]
  assert {x["diagnosis"]["model"] for x in sites["fwd/dot_general:0"]} == {
      "exact"}
  for x in sites["bwd/dot_general:0"]:
    assert x["diagnosis"]["verdict"] == "fail", x["diagnosis"]
    assert x["diagnosis"]["model"] == "scale", x["diagnosis"]
  assert r.localization["site"] == "bwd/dot_general:0"
  assert r.localization["step"] == 0
  # The forward-only question cannot see it.
  fwd_only = peat.playback(DENSE, goldens[DENSE.name], "test:bad_vjp",
                           campaign_dir=tmp_path)
  assert [x["site"] for x in fwd_only.records] == ["fwd/dot_general:0"] * 2
  assert fwd_only.localization is None
  assert all(math.isclose(e["update_rel_diff"], 0.0)
             for e in fwd_only.effects)
  assert all(e["update_rel_diff"] > 0.1 for e in r.effects)


# ------------------------------------------------------------------ (c)


EXPECTED = {"native:matmul:in_bf16": {"precision:bf16"},
            "native:matmul:in_tf32": {"precision:tf32"},
            "native:matmul:rtz": {"truncation"},
            "native:matmul:default": {"reordering", "exact"}}


def test_native_matmul_variants_name_their_model_at_backward_sites(
    goldens, tmp_path):
  res = _play(goldens, DENSE, list(EXPECTED), tmp_path, backward="kut")
  for spec, r in res.items():
    for site, recs in _by_site(r.records).items():
      models_seen = {x["diagnosis"]["model"] for x in recs}
      assert models_seen <= EXPECTED[spec], (spec, site, models_seen)
      assert len(recs) == 2  # checkpoints 0 and 2
    assert {x["phase"] for x in r.records} == {"fwd", "bwd"}


def test_native_composites_run_their_backward_targets(goldens, tmp_path):
  res = _play(goldens, COMPOSITE, ["native:layer_norm:in_bf16",
                                   "native:softmax:in_bf16"], tmp_path,
              backward="kut")
  ln = _by_site(res["native:layer_norm:in_bf16"].records)
  assert sorted(ln) == ["bwd/layer_norm:0/d0", "bwd/layer_norm:0/d1",
                        "bwd/layer_norm:0/d2", "fwd/layer_norm:0"]
  sm = _by_site(res["native:softmax:in_bf16"].records)
  assert sorted(sm) == ["bwd/softmax:0", "fwd/softmax:0"]
  for recs in list(ln.values()) + list(sm.values()):
    for x in recs:
      assert x["diagnosis"]["model"] != "exact"
      assert x["signature"]["noise_ratio"] > 10, x  # far above the floor
  assert ({x["diagnosis"]["model"] for x in ln["fwd/layer_norm:0"]}
          == {"precision:bf16"})


# ------------------------------------------------------------------ (d)


def _projected(old, new):
  """``new`` cut to the fields ``old`` holds (signatures have gained fields
  since, and the Detector's evidence sentences their wording)."""
  if not isinstance(old, dict) or not isinstance(new, dict):
    return new
  return {k: _projected(v, new[k]) for k, v in old.items() if k in new}


def test_forward_only_records_are_those_of_before(tmp_path):
  """Replaying the pre-move fixture's checkpoints (records made by peat_jax
  at 7e3e18d on another machine) writes the same records with backward
  left at its default and set to "golden": byte for byte the same file
  both ways (both made here, in this run), and every field the fixture's
  records hold as another machine's records can be
  (``peat.testing.assert_records_close``: exact on structure, names,
  models, verdicts and element counts, within stated tolerances on float
  statistics, which another processor's rounding of golden moves).
  Signatures have gained fields since, and the Detector's evidence
  sentences their wording: those are not compared."""
  fixture = os.path.join(HERE, "campaign_7e3e18d")
  old = peat.profiler.read_records(
      os.path.join(fixture, peat.profiler.PLAYBACK_FILE))
  golden = tmp_path / "golden"
  shutil.copytree(os.path.join(fixture, "golden"), golden)
  files = []
  for kw in ({}, {"backward": "golden"}):
    d = tmp_path / f"c{len(kw)}"
    peat.playback(tiny.get_task(), golden, tiny.KUT, campaign_dir=d, **kw)
    files.append((d / peat.profiler.PLAYBACK_FILE).read_bytes())
    recs = peat.profiler.read_records(d / peat.profiler.PLAYBACK_FILE)
    assert all("backward" not in r for r in recs)
    assert len(recs) == len(old)
    strip = lambda r: {k: v for k, v in r.items() if k != "diagnosis"}
    peat.testing.assert_records_close(
        [strip(o) for o in old],
        [_projected(strip(o), n) for o, n in zip(old, recs)])
    verdicts = lambda rs: [(r["diagnosis"]["model"], r["diagnosis"]["verdict"])
                           for r in rs if "diagnosis" in r]
    assert verdicts(recs) == verdicts(old) and verdicts(old)
  assert files[0] == files[1]


# ----------------------------------------------------- records and resume


def test_backward_settings_never_mix_in_one_record_file(goldens, tmp_path):
  g = goldens[DENSE.name]
  kut = peat.playback(DENSE, g, "native:matmul:in_bf16",
                      campaign_dir=tmp_path, backward="kut")
  lines = []
  fwd = peat.playback(DENSE, g, "native:matmul:in_bf16",
                      campaign_dir=tmp_path, progress=lines.append)
  assert not any("done before" in line for line in lines)
  assert {x["phase"] for x in fwd.records} == {"fwd"}
  assert {x["phase"] for x in kut.records} == {"fwd", "bwd"}
  again = []
  peat.playback(DENSE, g, "native:matmul:in_bf16", campaign_dir=tmp_path,
                backward="kut", progress=again.append)
  assert again == ["playback step 0: done before, skipped",
                   "playback step 2: done before, skipped"]
  recs = peat.profiler.read_records(tmp_path / peat.profiler.PLAYBACK_FILE)
  assert sum(r.get("backward") == "kut" for r in recs) == 6  # 2 x (2 + 1)
  assert sum("backward" not in r for r in recs) == 4  # 2 x (1 + 1)
  with pytest.raises(peat.PeatError, match="backward must be 'golden'"):
    peat.playback(DENSE, g, "native:matmul:in_bf16", campaign_dir=tmp_path,
                  backward="both")


def test_progress_lines_name_the_backward_sites(goldens, tmp_path):
  lines = []
  peat.playback(DENSE, goldens[DENSE.name], "native:matmul:in_bf16",
                campaign_dir=tmp_path, backward="kut", steps=[0],
                progress=lines.append)
  assert lines[0].startswith("playback step 0: 2 sites (1 fwd, 1 bwd), worst "
                             "precision:bf16 (warn)")


def test_runtime_runs_the_kuts_vjp_and_tags_its_records(goldens, tmp_path):
  g = goldens[DENSE.name]
  kw = dict(frequencies=("every",), steps=3, seeds=(1,),
            campaign_dir=tmp_path)
  fwd = peat.runtime(DENSE, g, "test:bad_vjp", **kw)
  bwd = peat.runtime(DENSE, g, "test:bad_vjp", backward="kut", **kw)
  # Forward exact: the forward-only run is the golden trajectory; the
  # 1.5x weight gradient of the VJP changes training.
  assert fwd.runs[0]["loss"] == fwd.golden_loss
  assert bwd.runs[0]["loss"] != bwd.golden_loss
  recs = peat.profiler.read_records(tmp_path / peat.profiler.RUNTIME_FILE)
  # With the bf16 proxy, the yardstick of the weight distances.
  assert sorted(r["name"] for r in recs if r.get("backward") == "kut") == [
      "bf16", "every", "golden", "spread"]
  assert sorted(r["name"] for r in recs if "backward" not in r) == [
      "bf16", "every", "golden", "spread"]
  # The VJP moves the weights off the golden trajectory; forward-only
  # exact does not.
  sig_f, sig_b = fwd.runs[0]["significance"], bwd.runs[0]["significance"]
  assert sig_f["total"]["distance"]["w1"][-1] == 0.0
  assert sig_b["total"]["distance"]["w1"][-1] > 0.0


def test_validate_stores_backward_and_reports_backward_sites(goldens, tmp_path):
  paths = peat.validate(DENSE, "test:bad_vjp", tmp_path, steps=4,
                        checkpoint_every=2, frequencies=(), progress=None,
                        backward="kut")
  assert paths.verdict == "fail"
  settings = json.loads((tmp_path / "campaign.json").read_text())
  assert settings["backward"] == "kut"
  data = json.loads(open(paths.json).read())
  assert [(s["site"], s["direction"], s["verdict"]) for s in data["sites"]] \
      == [("fwd/dot_general:0", "fwd", "pass"),
          ("bwd/dot_general:0", "bwd", "fail")]
  assert data["localization"]["site"] == "bwd/dot_general:0"
  assert "backward sites" in data["title"]
  text = peat.report.summary_table(data)
  assert "backward: kut" in text and "backward sites: 1 of 2, 1 not pass" in text
  with pytest.raises(peat.PeatError, match="backward: expected 'kut'"):
    peat.validate(DENSE, "test:bad_vjp", tmp_path, steps=4,
                  checkpoint_every=2, frequencies=(), progress=None)


@pytest.mark.slow
def test_isolated_campaign_runs_the_native_backward_target(tmp_path):
  """validate in worker processes on the CNN: native conv2d in_bf16 with
  its backward target at the five backward convolutions."""
  factory = peat.TaskFactory("peat_jax.models", "get_task",
                             {"name": "cnn", "batch_size": 16})
  lines = []
  paths = peat.validate(factory, "native:conv2d:in_bf16", tmp_path, steps=4,
                        checkpoint_every=2, frequencies=("every",),
                        runtime_steps=2, progress=lines.append,
                        backward="kut")
  assert any("isolated" in line and "(3 fwd, 5 bwd)" in line
             for line in lines), lines
  recs = peat.profiler.read_records(tmp_path / peat.profiler.PLAYBACK_FILE)
  bwd = [r for r in recs if r.get("phase") == "bwd"]
  assert len(bwd) == 10 and all(r["backward"] == "kut" for r in recs)
  # The first conv's weight cotangent has the digits (exact in bf16) as
  # its other operand: only the cotangent's rounding shows, about a
  # quarter of bf16's error, which may read as tf32.
  first_dw = "bwd/Cnn/Conv/conv_general_dilated:4"
  assert {r["diagnosis"]["model"] for r in bwd if r["site"] != first_dw} == {
      "precision:bf16"}
  assert {r["diagnosis"]["model"] for r in bwd if r["site"] == first_dw} <= {
      "precision:bf16", "precision:tf32"}
  assert {r["diagnosis"]["verdict"] for r in bwd} == {"warn"}
  assert paths.verdict == "warn"
  rt = peat.profiler.read_records(tmp_path / peat.profiler.RUNTIME_FILE)
  # golden, the seeds' spread, the bf16 proxy run (the weight distances'
  # yardstick, profiler.runtime._significance) and the KUT's frequency.
  assert {r["name"] for r in rt if r.get("backward") == "kut"} == {
      "golden", "spread", "bf16", "every"}
