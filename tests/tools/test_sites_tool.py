"""Tests of the site-listing tool (tools/sites.py)."""

from absl.testing import flagsaver
import pytest

from peat_jax.tools import sites as sites_tool


def _run(argv):
  with flagsaver.flagsaver():
    sites_tool.FLAGS.unparse_flags()
    sites_tool.FLAGS(["sites"] + argv)
    return sites_tool.main(["sites"])


SMALL = '--overrides={"batch_size": 4, "model_kwargs": {"width": 4}}'


def test_prints_the_site_table(capsys):
  assert _run(["--scenario=cnn", SMALL]) == 0
  out = capsys.readouterr().out
  assert out.splitlines()[0].split()[:2] == ["site", "kernel"]
  assert "fwd/Cnn/Conv/conv_general_dilated:0" in out
  assert "bwd/Cnn/Conv/conv_general_dilated:4" in out


def test_counts_and_selection(capsys):
  assert _run(["--scenario=cnn", SMALL, "--counts"]) == 0
  out = capsys.readouterr().out
  row = next(line for line in out.splitlines() if line.startswith("conv_general_dilated"))
  assert row.split()[1:] == ["3", "5", "0", "8"]
  assert _run(["--scenario=cnn", SMALL, "--kernel=dot_general",
               "--phase=bwd", "--names"]) == 0
  assert capsys.readouterr().out.split() == ["bwd/Cnn/Linear/dot_general:0",
                                             "bwd/Cnn/Linear/dot_general:1"]
  # --select: the fnmatch pattern narrowing sites, as in the other tools.
  assert _run(["--scenario=cnn", SMALL, "--select=fwd/*/Linear/*",
               "--names"]) == 0
  assert capsys.readouterr().out.split() == ["fwd/Cnn/Linear/dot_general:0",
                                             "fwd/Cnn/Linear/add:0"]


@pytest.mark.parametrize("argv, message", [
    (["--scenario=resnet"], "unknown scenario 'resnet'"),
    (["--scenario=cnn", SMALL, "--kernel=matmul"],
     "no site of kernel 'matmul'"),
    (["--scenario=cnn", "--overrides=[1"],
     "--overrides must be a JSON object"),
])
def test_bad_input_exits_2(capsys, argv, message):
  assert _run(argv) == 2
  assert message in capsys.readouterr().err
