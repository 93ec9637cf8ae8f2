"""Tests of the golden training command-line tool."""

import os

from absl.testing import flagsaver
import pytest

import peat_jax as peat
from peat_jax.tools import golden


def _run(argv):
  with flagsaver.flagsaver():
    golden.FLAGS.unparse_flags()
    golden.FLAGS(["golden"] + argv)
    return golden.main(["golden"])


def test_trains_and_prints_where_output_is(tmp_path, capsys):
  workdir = tmp_path / "cnn"
  assert _run([f"--workdir={workdir}", "--steps=4",
               "--checkpoint_every=2"]) == 0
  out = capsys.readouterr().out
  assert f"output: {workdir}" in out
  assert "test_accuracy" in out and "steps [0, 2, 4]" in out
  assert peat.saved_steps(workdir / "checkpoints") == [0, 2, 4]
  assert os.path.exists(workdir / "log.msgpack")
  # Running again resumes: nothing is retrained, the same steps remain.
  assert _run([f"--workdir={workdir}", "--steps=4",
               "--checkpoint_every=2"]) == 0
  assert "resumed from step 4" in capsys.readouterr().out


def test_finetune_runs_its_pretraining_first(tmp_path, capsys):
  workdir = tmp_path / "ft"
  assert _run(["--scenario=cnn_finetune", f"--workdir={workdir}",
               "--steps=2", "--checkpoint_every=2"]) == 0
  out = capsys.readouterr().out
  assert "pretraining 'cnn_04'" in out
  assert peat.saved_steps(workdir / "pretrain" / "checkpoints")[-1] == 200


@pytest.mark.parametrize("argv, message", [
    (["--scenario=resnet"], "unknown scenario 'resnet'"),
    (["--scenario=cnn_finetune", "--init_from=/nonexistent/run"],
     "/nonexistent/run does not exist"),
])
def test_bad_input_exits_2_with_message(tmp_path, capsys, argv, message):
  assert _run(argv + [f"--workdir={tmp_path}/w"]) == 2
  assert message in capsys.readouterr().err
