"""Tests of tools/runtime.py (runtime FI frequency sweep)."""

import pytest

from peat_jax import profiler
from peat_jax.tools import _cli
from peat_jax.tools import runtime


def test_runtime_sweep_prints_eta_and_table(profiled_copy, cli):
  d = profiled_copy
  rc, out, err = cli.run(runtime, [
      f"--campaign_dir={d}", f"--kut={cli.kut}", "--runtime_steps=3",
      "--frequencies=every,every_2", "--seeds=1"])
  assert rc == 0, err
  lines = out.splitlines()
  # The bf16 proxy (the weight distances' yardstick) is no frequency: no ETA.
  assert lines[0].startswith("bf16 proxy: 3 steps, final loss")
  assert "ETA" not in lines[0]
  assert lines[1].startswith("runtime every call: 3 steps, final loss")
  assert "moves the weights" in lines[1] and "[1/2," in lines[1]
  assert lines[2].startswith("runtime every 2th step") and "[2/2," in lines[2]
  assert lines[2].endswith("ETA 0.0 s]")
  assert lines[3].split() == ["frequency", "steps", "final", "loss", "golden",
                              "final", "max", "|loss", "-", "golden|",
                              "diverged", "at", "reason"]
  assert lines[5].split()[:3] == ["every", "call", "3"]
  names = [r["name"] for r in profiler.read_records(d / "runtime.msgpack")
           if r["kut"] == cli.kut]
  assert names == ["golden", "spread", "bf16", "every", "every_2"]


@pytest.mark.parametrize("argv, message", [
    ([], "--campaign_dir is required"),
    (["--campaign_dir={d}", "--frequencies=sometimes"], "sometimes"),
    (["--campaign_dir={d}", "--seeds=a"], "--seeds must be integers"),
])
def test_bad_input_exits_2_with_message(profiled, cli, argv, message):
  d, _ = profiled
  rc, _, err = cli.run(runtime, [a.format(d=d) for a in argv])
  assert rc == 2 and message in err


def test_helpfull_explains_the_tool(capsys):
  with pytest.raises(SystemExit) as e:
    _cli.run(runtime.main, runtime.FLAGS, runtime.__doc__,
             argv=["runtime", "--helpfull"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "fraction_<p>" in out and "seed-to-seed spread" in out
  for flag in ("--campaign_dir", "--kut", "--frequencies", "--runtime_steps",
               "--start_step", "--seeds", "--select"):
    assert flag in out
