"""Tests of the golden training command-line tool."""

import os

from absl.testing import flagsaver
import pytest

import peat_jax as peat
from peat_jax import profiler
from peat_jax.tools import golden
from peat_jax.tools import playback


def _run(argv):
  with flagsaver.flagsaver():
    golden.FLAGS.unparse_flags()
    golden.FLAGS(["golden"] + argv)
    return golden.main(["golden"])


def test_trains_into_the_campaign_and_prints_where_output_is(tmp_path,
                                                            capsys):
  campaign = tmp_path / "cnn"
  run_dir = campaign / profiler.GOLDEN_DIR
  assert _run([f"--campaign_dir={campaign}", "--steps=4",
               "--checkpoint_every=2"]) == 0
  out = capsys.readouterr().out
  assert f"output: {run_dir}" in out and f"campaign: {campaign}" in out
  assert "test_accuracy" in out and "steps [0, 2, 4]" in out
  assert peat.saved_steps(run_dir / profiler.CHECKPOINT_DIR) == [0, 2, 4]
  assert os.path.exists(run_dir / profiler.LOG_FILE)
  # Running again resumes: nothing is retrained, the same steps remain.
  assert _run([f"--campaign_dir={campaign}", "--steps=4",
               "--checkpoint_every=2"]) == 0
  assert "resumed from step 4" in capsys.readouterr().out


def test_golden_then_playback_on_one_campaign_dir(tmp_path, cli):
  """peat-golden writes the layout peat-playback reads: the same
  --campaign_dir and task flags, nothing else."""
  d = tmp_path / "campaign"
  task = ["--scenario=cnn", "--batch_size=8",
          '--overrides={"model_kwargs": {"width": 4}}']
  rc, out, err = cli.run(golden, [f"--campaign_dir={d}", "--steps=4",
                                  "--checkpoint_every=2"] + task, task=None)
  assert rc == 0, err
  assert f"output: {d / profiler.GOLDEN_DIR}" in out
  rc, out, err = cli.run(playback, [
      f"--campaign_dir={d}", "--kut=native:conv2d:in_bf16",
      "--checkpoints=2"] + task, task=None)
  assert rc == 0, err
  assert out.startswith("playback step 2: 3 sites, worst precision:bf16")
  assert f"records: {d / profiler.PLAYBACK_FILE}" in out
  recs = profiler.read_records(d / profiler.PLAYBACK_FILE)
  assert {r["step"] for r in recs} == {2}


def test_finetune_runs_its_pretraining_first(tmp_path, capsys):
  campaign = tmp_path / "ft"
  assert _run(["--scenario=cnn_finetune", f"--campaign_dir={campaign}",
               "--steps=2", "--checkpoint_every=2"]) == 0
  out = capsys.readouterr().out
  assert "pretraining 'cnn_04'" in out
  # Where the campaign tools' task (tools/_cli.make_task) finds it.
  pretrain = campaign / "task" / "pretrain" / profiler.CHECKPOINT_DIR
  assert peat.saved_steps(pretrain)[-1] == 200
  assert peat.saved_steps(campaign / profiler.GOLDEN_DIR /
                          profiler.CHECKPOINT_DIR) == [0, 2]


@pytest.mark.parametrize("argv, message", [
    (["--scenario=resnet"], "unknown scenario 'resnet'"),
    (["--scenario=cnn_finetune", "--init_from=/nonexistent/run"],
     "/nonexistent/run does not exist"),
    (["--overrides=[1"], "--overrides must be a JSON object"),
    (["--task=my_model:task", "--init_from=/a/run"],
     "--init_from set the reference scenario, which --task=my_model:task "
     "replaces"),
])
def test_bad_input_exits_2_with_message(tmp_path, capsys, argv, message):
  assert _run(argv + [f"--campaign_dir={tmp_path}/w"]) == 2
  assert message in capsys.readouterr().err
