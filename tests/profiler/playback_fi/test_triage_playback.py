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
def run(tmp_path_factory):
  task = models.get_task("cnn", batch_size=8)
  g = peat.golden_train(task, tmp_path_factory.mktemp("tri") / "golden",
                        steps=3, checkpoint_every=1, evaluate=False)
  return task, g


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
  assert all(r["signature"]["decomposed"] for r in first)
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
