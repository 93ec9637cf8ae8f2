"""Playback triages: the screen decides benign records, the port probe
runs once per site and is carried to the site's later records.

On the real CNN (batch 8, three checkpoints): a reordering-only native
conv2d is decided by the screen at every record (no decomposition); the
bf16-input conv2d is probed whole at the first checkpoint and carried at
the later ones (its own ratio and distances, the same diagnosis as a
probe run whole on that checkpoint, without a decomposition of the record:
the rounded inputs explain it).
"""

import pytest

import peat_jax as peat
from peat_jax import models
from peat_jax import profiler


@pytest.fixture(scope="module")
def run(cnn_run):
  return cnn_run


def test_a_benign_kut_is_decided_by_the_screen(run, tmp_path):
  task, g = run
  pb = profiler.playback(task, g.workdir, "native:conv2d:default",
                         campaign_dir=tmp_path)
  assert pb.records
  for r in pb.records:
    assert r["decided_by"] == "screen", r["site"]
    assert (r["diagnosis"]["model"], r["diagnosis"]["verdict"]) in (
        ("reordering", "pass"), ("exact", "pass"))
    assert r["signature"]["n_beyond"] == 0  # the screen's
    assert not r["signature"]["decomposed"]


def test_the_port_probe_runs_once_per_site_and_is_carried(run, tmp_path):
  task, g = run
  spec = "native:conv2d:in_bf16"
  pb = profiler.playback(task, g.workdir, spec, campaign_dir=tmp_path / "c")
  steps = sorted({r["step"] for r in pb.records})
  assert len(steps) >= 2
  first = [r for r in pb.records if r["step"] == steps[0]]
  later = [r for r in pb.records if r["step"] != steps[0]]
  assert {r["decided_by"] for r in first} == {"probe"}
  assert {r["decided_by"] for r in later} == {"carried probe"}
  for r in later:
    assert r["port"]["carried_from"] == steps[0]
    assert r["port"]["explains"] and r["port"]["name"] == "inputs_bf16"
    # Explained by rounded inputs: no decomposition of its own.
    assert not r["signature"]["decomposed"]
  # The first step's probe whole (a convolution: rounded inputs are all
  # it tries) explains them too, before any decomposition.
  for r in first:
    assert r["port"]["explains"] and r["port"]["name"] == "inputs_bf16"
    assert r["port"]["tried"] == [
        "inputs_bf16", "inputs_tf32", "inputs_tf32_toward_zero"]
    assert not r["signature"]["decomposed"]
  # Each later step played alone (a fresh campaign: the probe whole)
  # diagnoses the same, with the same magnitudes.
  for s in steps[1:]:
    alone = profiler.playback(task, g.workdir, spec, steps=[s],
                              campaign_dir=tmp_path / f"alone{s}")
    mine = [r for r in later if r["step"] == s]
    assert [r["site"] for r in alone.records] == [r["site"] for r in mine]
    for a, m in zip(alone.records, mine):
      assert a["decided_by"] == "probe"
      assert a["diagnosis"]["model"] == m["diagnosis"]["model"] == \
          "precision:bf16"
      assert a["diagnosis"]["verdict"] == m["diagnosis"]["verdict"]
      assert a["port"]["ratio"] == pytest.approx(m["port"]["ratio"],
                                                 rel=1e-9, abs=1e-12)
      assert a["port"]["distance"] == m["port"]["distance"]


@pytest.fixture(scope="module")
def run_bf16(tmp_path_factory):
  """A ViT in bf16 mixed precision (bf16 sites), one checkpoint."""
  task = models.get_task("vit_bf16", batch_size=8,
                         model_kwargs=dict(dim=32, depth=1, heads=2))
  g = peat.golden_train(task, tmp_path_factory.mktemp("tri16") / "golden",
                        steps=1, checkpoint_every=1, evaluate=False)
  return task, g


@pytest.mark.parametrize("model,spec,select", [
    ("run", "native:conv2d:in_bf16", None),
    ("run", "native:conv2d:in_tf32", None),
    ("run", "native:conv2d:acc_bf16", None),
    ("run", "native:conv2d:rtz", None),
    ("run_bf16", "native:matmul:acc_bf16", None),
    ("run_bf16", "native:matmul:acc_bf16", "*Mlp*")])
def test_the_whole_probe_answers_alike_on_the_device_and_the_host(
    model, spec, select, request, monkeypatch):
  """A primitive site's probe whole runs before any decomposition: on
  the device with its float64 references there, else on the host. Both
  paths decide and diagnose a first checkpoint's records alike (the
  values to the last bits of two float64 references), on a float32 CNN
  and a bf16 ViT."""
  from peat_jax.profiler.playback_fi import _site_records
  site_records = _site_records.site_records
  task, g = request.getfixturevalue(model)
  variant = spec.rsplit(":", 1)[1]
  state = peat.restore_state(g.checkpoint_dir, task, g.steps[0])
  batch = task.batch_at(int(state.data_position))
  player = profiler.Player(task, spec, state, batch, select=select)
  taps = player._steps(state, batch)[0]  # pylint: disable=protected-access
  sites = [(c.site, player._store[c.site.name], taps[c.site.name])
           for c in player.calls]
  on_host = []
  probe = _site_records._port_probe
  monkeypatch.setattr(_site_records, "_port_probe",
                      lambda *a, **k: on_host.append(a[0].name) or probe(
                          *a, **k))
  dev = site_records(sites, spec, 0, player._refs())
  assert not on_host  # every probe of these primitive sites on the device
  host = site_records(sites, spec, 0, None)
  assert [r["site"] for r in dev] == [r["site"] for r in host]
  probed = 0
  for d, h in zip(dev, host):
    assert d["decided_by"] == h["decided_by"], d["site"]
    assert d["diagnosis"]["model"] == h["diagnosis"]["model"]
    assert d["diagnosis"]["verdict"] == h["diagnosis"]["verdict"]
    assert d["signature"]["decomposed"] == h["signature"]["decomposed"]
    assert ("port" in d) == ("port" in h)
    if "port" not in d:
      continue
    probed += 1
    for key in ("model", "name", "explains", "tried"):
      assert d["port"][key] == h["port"][key], (d["site"], key)
    for key in ("ratio", "distance", "reference_distance"):
      assert d["port"][key] == pytest.approx(h["port"][key], rel=1e-6)
    # Explained by rounded inputs: decided on the screen, no
    # decomposition; otherwise decomposed first.
    assert d["signature"]["decomposed"] == (not d["port"]["explains"])
  if variant.startswith("in_"):  # explained, on the screen
    assert probed == len(dev)
    assert all(r["port"]["name"] == f"inputs_{variant[3:]}" for r in dev)
  if variant == "acc_bf16":  # probed, no rounding of inputs explains it
    assert probed and not any(r["port"]["explains"] for r in dev
                              if "port" in r)
