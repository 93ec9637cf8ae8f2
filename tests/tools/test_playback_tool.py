"""Tests of tools/playback.py (model playback and op-level playback)."""

import pytest

from peat_jax import profiler
from peat_jax.tools import _cli
from peat_jax.tools import playback


def test_ops_playback_prints_eta_summary_and_verdict(ops_played, cli):
  d, out = ops_played
  lines = out.splitlines()
  assert lines[0].startswith(f"op {cli.dense} step 0 (1/2): precision:bf16")
  assert "[1/2," in lines[0] and "ETA" in lines[0]
  assert f"KUT {cli.kut} on captured inputs: WARN" in out
  assert f"records: {d}/ops.msgpack" in out and "verdict: warn" in out
  recs = profiler.read_records(d / "ops.msgpack")
  assert [(r["step"], r["site"]) for r in recs] == [(0, cli.dense),
                                                    (1, cli.dense)]


def test_model_playback_over_checkpoints(profiled_copy, cli):
  d = profiled_copy
  rc, out, err = cli.run(playback, [f"--campaign_dir={d}", f"--kut={cli.kut}",
                                    "--checkpoints=0"])
  assert rc == 0, err
  assert out.startswith("playback step 0: 1 sites, worst precision:bf16")
  assert "[1/1," in out.splitlines()[0]
  assert f"KUT {cli.kut} on cnn: WARN" in out   # --scenario's default
  assert "playback max |loss_kut - loss_golden|" in out
  recs = profiler.read_records(d / "playback.msgpack")
  assert [(r["kind"], r["step"]) for r in recs] == [("site", 0),
                                                    ("effect", 0)]


@pytest.mark.parametrize("argv, message", [
    ([], "--campaign_dir is required"),
    (["--campaign_dir={d}", "--ops", "--kut=native:softmax:default"],
     "no such record was captured"),
    (["--campaign_dir={d}", "--kut=native:nope:x"], "unknown KUT spec"),
    (["--campaign_dir={d}", "--checkpoints=x"],
     "--checkpoints must be integers"),
])
def test_bad_input_exits_2_with_message(profiled, cli, argv, message):
  d, _ = profiled
  rc, _, err = cli.run(playback, [a.format(d=d) for a in argv])
  assert rc == 2 and message in err


def test_helpfull_explains_the_tool(capsys):
  with pytest.raises(SystemExit) as e:
    _cli.run(playback.main, playback.FLAGS, playback.__doc__,
             argv=["playback", "--helpfull"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "Op-level playback (--ops)" in out and "no model" in out
  for flag in ("--campaign_dir", "--kut", "--ops", "--select",
               "--checkpoints", "--phase", "--scenario"):
    assert flag in out
