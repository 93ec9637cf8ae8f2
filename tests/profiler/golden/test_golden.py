"""Tests of golden training: determinism, resume, checkpoints, bad input."""

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import models

STEPS, EVERY = 12, 4


@functools.cache
def _task():
  return models.get_task("cnn", batch_size=32)  # one compile for the module


def _assert_trees_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
  """One uninterrupted 12-step run with checkpoints every 4 steps."""
  workdir = tmp_path_factory.mktemp("golden")
  return peat.golden_train(_task(), workdir, steps=STEPS,
                           checkpoint_every=EVERY, seed=3)


def test_layout_log_and_checkpoints(golden):
  assert golden.steps == [0, 4, 8, 12]
  assert os.path.isabs(golden.workdir)
  log = peat.read_log(golden.workdir)
  np.testing.assert_array_equal(log["step"], np.arange(1, STEPS + 1))
  assert np.all(np.isfinite(log["loss"])) and np.all(log["grad_norm"] > 0)
  assert log["update_norm"][0] == 0  # warm-up starts at lr 0
  assert np.all(log["update_norm"][1:] > 0)
  with open(os.path.join(golden.workdir, "run.json")) as f:
    run = json.load(f)
  assert run["task"] == "cnn" and run["seed"] == 3
  assert 0.0 <= golden.evaluation["test_accuracy"] <= 1.0
  final = peat.restore_state(golden.checkpoint_dir, _task())
  _assert_trees_equal(final, golden.state)


def test_same_seed_is_bitwise_identical(golden, tmp_path):
  again = peat.golden_train(_task(), tmp_path, steps=STEPS,
                            checkpoint_every=EVERY, seed=3, evaluate=False)
  _assert_trees_equal(again.state, golden.state)
  _assert_trees_equal(again.log, golden.log)
  other = peat.golden_train(_task(), tmp_path / "other", steps=2,
                            checkpoint_every=2, seed=4, evaluate=False)
  assert not np.array_equal(other.log["loss"][:2], golden.log["loss"][:2])


@pytest.mark.parametrize("start", [0, 4, 8])
def test_continuing_from_any_saved_step_is_bitwise(golden, start):
  task = _task()
  state = peat.restore_state(golden.checkpoint_dir, task, step=start)
  assert int(state.step) == start and int(state.data_position) == start
  losses = []
  for _ in range(start, STEPS):
    state, metrics = task.train_step(state, task.batch_at(
        int(state.data_position)))
    losses.append(float(metrics["loss"]))
  _assert_trees_equal(state, golden.state)
  np.testing.assert_array_equal(np.float32(losses), golden.log["loss"][start:])


def test_resumed_run_equals_uninterrupted(golden, tmp_path):
  first = peat.golden_train(_task(), tmp_path, steps=8, checkpoint_every=EVERY,
                            seed=3, evaluate=False)
  assert first.steps == [0, 4, 8]
  resumed = peat.golden_train(_task(), tmp_path, steps=STEPS,
                              checkpoint_every=EVERY, seed=3, evaluate=False)
  assert resumed.resumed_from == 8
  _assert_trees_equal(resumed.state, golden.state)
  _assert_trees_equal(resumed.log, golden.log)


def test_existing_run_is_not_overwritten(golden, tmp_path):
  peat.golden_train(_task(), tmp_path, steps=2, checkpoint_every=2, seed=3,
                    evaluate=False)
  with pytest.raises(peat.PeatError, match="already holds checkpoint steps"):
    peat.golden_train(_task(), tmp_path, steps=4, seed=3, resume=False)
  with pytest.raises(peat.PeatError, match="seed=3.*seed=9"):
    peat.golden_train(_task(), tmp_path, steps=4, checkpoint_every=2, seed=9)
  with pytest.raises(peat.PeatError, match="steps and checkpoint_every"):
    peat.golden_train(_task(), tmp_path / "x", steps=0)


def test_missing_and_empty_checkpoint_dirs(tmp_path):
  missing = tmp_path / "nope"
  with pytest.raises(peat.CheckpointError, match=f"{missing} does not exist"):
    peat.restore_state(missing, _task())
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(peat.CheckpointError,
                     match=f"{empty} holds no complete checkpoint step"):
    peat.saved_steps(empty)
  afile = tmp_path / "file"
  afile.write_text("x")
  with pytest.raises(peat.CheckpointError, match="is a file"):
    peat.saved_steps(afile)


def test_unknown_step_lists_available(golden):
  with pytest.raises(peat.CheckpointError, match=r"no complete step 5.*\[0, 4"):
    peat.restore_state(golden.checkpoint_dir, _task(), step=5)


def test_wrong_task_is_named(golden):
  with pytest.raises(peat.CheckpointError, match="cannot be restored"):
    peat.restore_state(golden.checkpoint_dir, models.get_task("vit"))


def _copy_run(src, dst):
  subprocess.run(["cp", "-r", src, dst], check=True)
  return os.path.join(dst, "checkpoints")


def _data_files(step_dir):
  files = []
  for root, _, names in os.walk(os.path.join(step_dir, "state")):
    files += [os.path.join(root, n) for n in names if "ocdbt.process" in root]
  return sorted(files, key=os.path.getsize)


def test_truncated_step_is_a_clear_error(golden, tmp_path):
  ckpt = _copy_run(golden.workdir, tmp_path / "run")
  biggest = _data_files(os.path.join(ckpt, "8"))[-1]
  with open(biggest, "r+b") as f:
    f.truncate(os.path.getsize(biggest) // 2)
  with pytest.raises(peat.CheckpointError,
                     match=rf"step 8 in {ckpt} .*(cannot be restored|corrupt)"):
    peat.restore_state(ckpt, _task(), step=8)
  # The other steps are untouched and still restore.
  peat.restore_state(ckpt, _task(), step=4)


def test_flipped_byte_is_caught_by_fingerprint(golden, tmp_path):
  ckpt = _copy_run(golden.workdir, tmp_path / "run")
  target = _data_files(os.path.join(ckpt, "12"))[-1]
  data = bytearray(open(target, "rb").read())
  data[len(data) // 2] ^= 0x10
  open(target, "wb").write(bytes(data))
  with pytest.raises(peat.CheckpointError, match=r"step 12 .*corrupt"):
    peat.restore_state(ckpt, _task())


@pytest.mark.parametrize("step", [0, 8])
def test_direct_read_equals_orbax_restore(golden, step, monkeypatch):
  """The tensorstore reader returns Orbax's arrays bitwise, on the
  target's device, and is the path taken for this layout."""
  from peat_jax.profiler.golden import _checkpoint as _checkpoint  # pylint: disable=g-import-not-at-top
  from peat_jax import profiler as _golden  # pylint: disable=g-import-not-at-top
  calls = []
  real = _checkpoint._read_direct
  monkeypatch.setattr(_checkpoint, "_read_direct",
                      lambda *a: calls.append(a[0]) or real(*a))
  direct = peat.restore_state(golden.workdir, _task(), step)
  assert calls == [os.path.join(golden.checkpoint_dir, str(step))]
  monkeypatch.setattr(_checkpoint, "_direct_readable", lambda d: False)
  via_orbax = peat.restore_state(golden.workdir, _task(), step)
  _assert_trees_equal(direct, via_orbax)
  dev = jax.local_devices()[0]
  assert all(x.devices() == {dev} for x in jax.tree.leaves(direct))
  assert len(calls) == 1
  with _golden.StateReader(golden.workdir, _task()) as r:
    _assert_trees_equal(r.restore(step), direct)


_WORKER = textwrap.dedent("""
    import sys
    import peat_jax as peat
    from peat_jax import models
    task = models.get_task("cnn", batch_size=32)
    peat.golden_train(task, sys.argv[1], steps=int(sys.argv[2]),
                      checkpoint_every=1, seed=3, evaluate=False)
""")


def _tmp_dirs(path):
  if not os.path.isdir(path):
    return []
  return [n for n in os.listdir(path) if "tmp" in n]


@pytest.mark.slow
@pytest.mark.parametrize("min_steps", [3, 9])
def test_sigkill_during_save_leaves_earlier_steps_restorable(tmp_path,
                                                             min_steps):
  workdir = tmp_path / "run"
  ckpt = workdir / "checkpoints"
  proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(workdir), "400"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  killed_during_save = False
  try:
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
      done = [n for n in os.listdir(ckpt) if n.isdigit()] if ckpt.exists() else []
      if len(done) >= min_steps and _tmp_dirs(ckpt):
        proc.send_signal(signal.SIGKILL)  # while a save is in flight
        killed_during_save = True
        break
      time.sleep(0.001)
  finally:
    proc.kill()
    proc.wait()
  assert killed_during_save, "the worker finished before a save was caught"
  steps = peat.saved_steps(ckpt)
  assert len(steps) >= min_steps - 1
  task = _task()
  for step in steps[-2:]:
    state = peat.restore_state(ckpt, task, step=step)
    assert int(state.step) == step
  # Resuming after the kill completes and matches an uninterrupted run.
  total = steps[-1] + 3
  resumed = peat.golden_train(task, workdir, steps=total, checkpoint_every=1,
                              seed=3, evaluate=False)
  straight = peat.golden_train(task, tmp_path / "straight", steps=total,
                               checkpoint_every=total, seed=3, evaluate=False)
  _assert_trees_equal(resumed.state, straight.state)
  _assert_trees_equal(resumed.log, straight.log)
