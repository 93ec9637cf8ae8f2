"""--backward=golden|kut in the campaign tools (playback, runtime, scaleout,
validate), end to end on the tiny task of conftest.py."""

import pytest

from peat_jax import profiler
from peat_jax.tools import _cli
from peat_jax.tools import playback
from peat_jax.tools import report
from peat_jax.tools import runtime
from peat_jax.tools import scaleout
from peat_jax.tools import validate

BWD = "bwd/dot_general:0"


@pytest.mark.slow  # the tool's playback of every backward site (~20 s);
# the library path runs in CI (tests/profiler/playback_fi/test_playback_backward.py)
def test_playback_tool_records_and_summarizes_backward_sites(profiled_copy,
                                                            cli):
  d = profiled_copy
  rc, out, err = cli.run(playback, [f"--campaign_dir={d}", f"--kut={cli.kut}",
                                    "--checkpoints=0", "--backward=kut"])
  assert rc == 0, err
  lines = out.splitlines()
  assert lines[0].startswith("playback step 0: 2 sites (1 fwd, 1 bwd), worst "
                             "precision:bf16 (warn)")
  assert f"KUT {cli.kut} on cnn (backward: kut" in out
  assert BWD in out and "backward sites: 1 of 2, 1 not pass" in out
  recs = [r for r in profiler.read_records(d / "playback.msgpack")
          if r.get("backward") == "kut"]
  assert [(r["kind"], r.get("site")) for r in recs] == [
      ("site", cli.dense), ("site", BWD), ("effect", None)]
  assert recs[1]["diagnosis"]["model"] == "precision:bf16"
  # The forward-only question, asked again in the same directory, is
  # another set of records.
  rc, out, err = cli.run(playback, [f"--campaign_dir={d}", f"--kut={cli.kut}",
                                    "--checkpoints=0"])
  assert rc == 0, err
  assert BWD not in out and "backward: kut" not in out
  # The report tool reads either set (default: golden, as both are there).
  for flag, has_bwd in (([], False), (["--backward=kut"], True)):
    rc, out, err = cli.run(report, [f"--campaign_dir={d}",
                                    f"--kut={cli.kut}"] + flag)
    assert rc == 0, err
    assert (BWD in out) == has_bwd


def test_runtime_and_scaleout_tools_take_the_flag(profiled_copy, cli):
  d = profiled_copy
  rc, out, err = cli.run(runtime, [
      f"--campaign_dir={d}", f"--kut={cli.kut}", "--runtime_steps=2",
      "--frequencies=every", "--seeds=1", "--backward=kut"])
  assert rc == 0, err
  lines = out.splitlines()
  assert lines[0].startswith("bf16 proxy: 2 steps")
  assert lines[1].startswith("runtime every call: 2 steps")
  tagged = [r["name"] for r in profiler.read_records(d / "runtime.msgpack")
            if r.get("backward") == "kut"]
  assert tagged == ["golden", "spread", "bf16", "every"]
  rc, out, err = cli.run(scaleout, [
      f"--campaign_dir={d}", f"--kut={cli.kut}", "--checkpoints=2",
      "--backward=kut", "--devices=1"])
  assert rc == 0, err
  assert "2 sites (1 fwd, 1 bwd)" in out and BWD in out
  steps = {r["step"] for r in profiler.read_records(d / "playback.msgpack")
           if r.get("backward") == "kut" and r["kind"] == "effect"}
  assert 2 in steps


@pytest.mark.parametrize("tool, argv, message", [
    (playback, ["--campaign_dir={d}", "--ops", "--backward=kut"],
     "--backward=kut needs model playback"),
    (scaleout, ["--campaign_dir={d}", "--mode=runtime", "--backward=kut"],
     "--backward=kut needs --mode=playback"),
    (playback, ["--campaign_dir={d}", "--kut=native:matmul:crash_segv",
                "--backward=kut"], "has no backward"),
])
def test_bad_backward_use_exits_2(profiled, cli, tool, argv, message):
  d, _ = profiled
  rc, _, err = cli.run(tool, [a.format(d=d) for a in argv])
  assert rc == 2 and message in err


@pytest.mark.parametrize("tool", [playback, runtime, scaleout, validate])
def test_flag_is_checked_and_explained(tool, capsys):
  with pytest.raises(SystemExit) as e:
    _cli.run(tool.main, tool.FLAGS, tool.__doc__,
             argv=[tool.__name__, "--backward=both"])
  assert e.value.code == 2
  assert "error:" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    _cli.run(tool.main, tool.FLAGS, tool.__doc__,
             argv=[tool.__name__, "--helpfull"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "--backward" in out and "the KUT's VJP" in out
