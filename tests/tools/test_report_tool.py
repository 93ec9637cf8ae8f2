"""Tests of tools/report.py and of tools/detect.py on a campaign."""

import json

import pytest

from peat_jax.tools import _cli
from peat_jax.tools import detect
from peat_jax.tools import report


def test_report_rebuilds_html_and_json_from_ops_records(ops_played, cli):
  d, _ = ops_played
  rc, out, err = cli.run(report, [f"--campaign_dir={d}", "--source=ops",
                                  f"--kut={cli.kut}"])
  assert rc == 0, err
  assert f"KUT {cli.kut} on tiny: WARN" in out   # golden/run.json's task
  assert f"report: {d}/report.html" in out and "verdict: warn" in out
  data = json.loads((d / "report.json").read_text())
  assert data["verdict"]["verdict"] == "warn"
  assert [s["site"] for s in data["sites"]] == [cli.dense]
  assert data["sites"][0]["steps"] == [0, 1]
  assert (d / "report.html").stat().st_size > 1000


def test_detect_summarizes_a_campaigns_records(ops_played, cli):
  d, _ = ops_played
  rc, out, err = cli.run(detect, [f"--campaign_dir={d}", "--source=ops",
                                  f"--kut={cli.kut}"])
  assert rc == 0, err
  assert "sites per error model: precision:bf16 x1" in out
  assert f"localization: {cli.dense} at step 0" in out
  assert out.rstrip().endswith("verdict: warn")


@pytest.mark.parametrize("argv, message", [
    ([], "--campaign_dir is required"),
    (["--campaign_dir={d}/nope"], "does not exist"),
    (["--campaign_dir={d}", "--source=ops", "--kut=golden"],
     "no ops record of KUT 'golden'"),
])
def test_bad_input_exits_2_with_message(ops_played, cli, argv, message):
  d, _ = ops_played
  rc, _, err = cli.run(report, [a.format(d=d) for a in argv])
  assert rc == 2 and message in err, err


def test_helpfull_explains_the_tool(capsys):
  with pytest.raises(SystemExit) as e:
    _cli.run(report.main, report.FLAGS, report.__doc__,
             argv=["report", "--helpfull"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "Nothing is rerun" in out
  for flag in ("--campaign_dir", "--source", "--kut"):
    assert flag in out
