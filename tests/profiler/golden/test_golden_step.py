"""The golden run's step after each checkpoint, kept for playback: the
parameters training reached (bitwise, float32 and bf16), checked on read,
and playback reading them instead of replaying the golden step."""

import os

import jax
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import models
from peat_jax import profiler
from peat_jax.profiler import golden

KUT = "native:matmul:default"


def _run(name, tmp_path_factory):
  """Two steps, a checkpoint at each: checkpoint 1 holds the parameters
  the golden step of checkpoint 0 must hold."""
  task = models.get_task(name, batch_size=4)
  g = peat.golden_train(task, tmp_path_factory.mktemp("gs") / "golden",
                        steps=2, checkpoint_every=1, evaluate=False)
  return task, g


@pytest.fixture(scope="module", params=["cnn", "vit_bf16"])
def run(request, tmp_path_factory):
  return _run(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
  return _run("cnn", tmp_path_factory)


def test_the_stored_step_is_the_parameters_training_reached(run):
  task, g = run
  stored = golden.GoldenSteps(g.workdir)
  assert stored.steps == [0, 1]  # every checkpoint but the last
  after = peat.restore_state(g.checkpoint_dir, task, 1)
  before = peat.restore_state(g.checkpoint_dir, task, 0)
  step = stored.read(0, before.params)
  same = jax.tree.map(
      lambda a, b: a.dtype == b.dtype and np.array_equal(
          np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)),
      step.params, jax.device_get(after.params))
  assert all(jax.tree.leaves(same))
  dtypes = {str(x.dtype) for x in jax.tree.leaves(step.params)}
  assert dtypes == {str(x.dtype) for x in jax.tree.leaves(after.params)}
  assert (step.loss, step.grad_norm) == (float(g.log["loss"][0]),
                                         float(g.log["grad_norm"][0]))
  # One parameter set per checkpoint: the leaves' bytes and the .npz
  # headers, no more.
  leaves = sum(np.asarray(x).nbytes for x in jax.tree.leaves(after.params))
  for nbytes in stored.nbytes().values():
    assert leaves < nbytes < leaves + 1024 * (
        1 + len(jax.tree.leaves(after.params)))


def test_playback_plays_the_kut_step_alone_against_the_stored_one(
    run, tmp_path):
  task, g = run
  if task.name.endswith("bf16"):
    # Mixed precision: the tapped step rounds what XLA keeps in float32 in
    # the golden run's (excess precision), so the golden step is replayed
    # beside the KUT's, with the same taps, rather than read.
    state = peat.restore_state(g.checkpoint_dir, task, 0)
    player = profiler.playback_fi.Player(
        task, KUT, state, task.batch_at(0),
        golden_steps=golden.stored_golden_steps(g.workdir, [0, 1]))
    assert player.golden_steps is None
    return
  recs = {}
  for replay in (False, True):
    d = tmp_path / str(replay)
    profiler.playback(task, g.workdir, KUT, campaign_dir=d,
                      replay_golden_step=replay)
    recs[replay] = profiler.read_records(d / profiler.PLAYBACK_FILE)
  eff = {k: [r for r in v if r["kind"] == "effect"] for k, v in recs.items()}
  assert all("golden_step" not in r for r in eff[True])
  assert [r.get("golden_step") for r in eff[False]] == ["stored"] * 2
  for a, b in zip(eff[False], eff[True]):
    assert a["loss_golden"] == b["loss_golden"]
    assert a["update_rel_diff"] == pytest.approx(b["update_rel_diff"],
                                                 rel=1e-6, abs=1e-12)
  verdicts = {k: {r["diagnosis"]["verdict"] for r in v if r["kind"] == "site"}
              for k, v in recs.items()}
  assert verdicts == {False: {"pass"}, True: {"pass"}}


def _damage(path, how):
  data = bytearray(open(path, "rb").read())
  if how == "truncate":
    data = data[:len(data) // 2]
  else:
    data[len(data) // 2] ^= 0x10  # inside a leaf's bytes
  open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("how, message", [
    ("truncate", "has .* bytes; expected .*truncated"),
    ("flip", "corrupt"),
    ("sidecar", "unreadable"),
    ("other_task", "not those of the restored checkpoint"),
])
def test_a_damaged_golden_step_names_the_file_and_the_fix(cnn_run, tmp_path,
                                                           how, message):
  task, g = cnn_run
  import shutil  # pylint: disable=g-import-not-at-top
  work = tmp_path / "golden"
  shutil.copytree(g.workdir, work)
  d = golden.golden_step_dir(work)
  before = peat.restore_state(work / "checkpoints", task, 1)
  if how == "sidecar":
    open(os.path.join(d, "1.json"), "w").write('{"format": 1, "paths": [')
  elif how == "other_task":
    golden.write_golden_step(work, 1, {"w": np.ones(3, np.float32)})
  else:
    _damage(os.path.join(d, "1.npz"), how)
  with pytest.raises(peat.PeatError, match=message) as err:
    golden.GoldenSteps(work).read(1, before.params)
  assert d in str(err.value) and "Fix: delete" in str(err.value)
  # In a campaign: the records of the steps before are kept, the error
  # names the file; deleting the directory replays the golden step.
  c = tmp_path / "c"
  with pytest.raises(peat.PeatError, match="golden step file"):
    profiler.playback(task, work, KUT, campaign_dir=c)
  kept = profiler.read_records(c / profiler.PLAYBACK_FILE)
  assert kept and {r["step"] for r in kept} == {0}
  shutil.rmtree(d)
  profiler.playback(task, work, KUT, campaign_dir=c)
  eff = [r for r in profiler.read_records(c / profiler.PLAYBACK_FILE)
         if r["kind"] == "effect"]
  assert [r["step"] for r in eff] == [0, 1]
  assert eff[0]["golden_step"] == "stored" and "golden_step" not in eff[1]


def test_no_store_and_a_run_cut_short_replay_the_golden_step(tmp_path):
  task = models.get_task("cnn", batch_size=4)
  g = peat.golden_train(task, tmp_path / "off", steps=2, checkpoint_every=1,
                        evaluate=False, store_golden_step=False)
  assert not os.path.exists(golden.golden_step_dir(g.workdir))
  assert golden.stored_golden_steps(g.workdir, [0, 1]) is None
  # A golden step kept but its loss not logged yet (a run cut short
  # before its next checkpoint) does not count as stored.
  on = peat.golden_train(task, tmp_path / "on", steps=2, checkpoint_every=2,
                         evaluate=False)
  assert golden.stored_golden_steps(on.workdir, [0]) is not None
  os.remove(on.log_path)
  with open(on.log_path, "wb"):
    pass
  assert not golden.GoldenSteps(on.workdir).covers([0])
