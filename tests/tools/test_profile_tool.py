"""Tests of tools/profile.py (golden run + captured site inputs)."""

import json
import os

import pytest

import peat_jax as peat
from peat_jax import profiler as _campaign
from peat_jax import profiler as _capture_io
from peat_jax.tools import _cli
from peat_jax.tools import profile


def test_profiles_with_eta_and_summary_within_budget(profiled, cli):
  d, out = profiled
  lines = out.splitlines()
  assert any(l.startswith("step     2") and "[1/2," in l and "ETA" in l
             for l in lines)
  cap = [l for l in lines if l.startswith("captured step")]
  assert len(cap) == 4 and cap[-1].endswith("ETA 0.0 s]")
  assert "steps captured" in out and cli.dense in out
  index = _capture_io.read_index(str(d / "captures"))
  assert [e["step"] for e in index["records"]] == [0, 1]
  assert [s["step"] for s in index["skipped"]] == [2, 3]
  used = sum(e["bytes"] for e in index["records"])
  assert f"captured 2 records, {used} bytes of a 6000-byte budget; 2 skipped" \
      in out
  assert os.path.isdir(d / "golden" / "checkpoints")
  assert json.loads((d / "golden" / "run.json").read_text())["steps"] == 4


@pytest.mark.slow  # the CNN's initialization alone compiles for ~10 s
def test_profiles_the_cnn_scenario_and_plays_it_back(cli, tmp_path):
  from peat_jax.tools import playback  # pylint: disable=g-import-not-at-top
  flags = ["--scenario=cnn", "--batch_size=8",
           '--overrides={"model_kwargs": {"width": 4}}',
           f"--campaign_dir={tmp_path}"]
  rc, out, err = cli.run(profile, flags + [
      "--steps=4", "--checkpoint_every=2", "--capture_steps=0,2",
      "--capture_kernel=conv_general_dilated,dot_general", "--budget=1MiB"],
                         task=None)
  assert rc == 0, err
  assert "captured 8 records" in out and "0 skipped" in out
  rc, out, err = cli.run(playback, flags + ["--kut=native:conv2d:in_bf16"],
                         task=None)
  assert rc == 0, err
  assert "KUT native:conv2d:in_bf16 on cnn: WARN" in out
  rc, out, err = cli.run(playback, [f"--campaign_dir={tmp_path}", "--ops",
                                    "--kut=native:conv2d:in_bf16"], task=None)
  assert rc == 0, err
  assert out.count("precision:bf16 (warn)") == 6   # 3 conv sites x 2 steps
  # Op level and model playback see the same inputs at step 0: same
  # diagnoses, noise ratios within 10%.
  model = {r["site"]: r for r in _campaign.read_records(
      tmp_path / "playback.msgpack") if r["kind"] == "site" and r["step"] == 0}
  ops = {r["site"]: r for r in _campaign.read_records(
      tmp_path / "ops.msgpack") if r["step"] == 0}
  assert sorted(model) == sorted(ops) and len(ops) == 3
  for site, r in ops.items():
    assert r["diagnosis"]["model"] == model[site]["diagnosis"]["model"]
    a, b = r["signature"]["noise_ratio"], model[site]["signature"][
        "noise_ratio"]
    assert abs(a - b) <= 0.1 * b, (site, a, b)


def test_make_task_caches_tasks_and_checks_overrides(tmp_path):
  a = _cli.make_task("cnn", str(tmp_path), batch_size=8)
  assert a.config["batch_size"] == 8
  assert _cli.make_task("cnn", str(tmp_path), overrides='{"batch_size": 8}'
                        ) is a
  with pytest.raises(peat.PeatError, match="must be a JSON object"):
    _cli.make_task("cnn", str(tmp_path), overrides="[1]")
  with pytest.raises(peat.PeatError, match="unknown config keys"):
    _cli.make_task("cnn", str(tmp_path), overrides='{"nope": 1}')


@pytest.mark.parametrize("argv, message", [
    (["--budget=lots"], "expected a size like"),
    (["--budget=10"], "smaller than the smallest record"),
    (["--capture_steps=0,9"], "capture steps [9] are outside"),
    (["--capture_sites=nope/*", "--capture_kernel=", "--capture_phase="],
     "matches no site"),
])
def test_bad_input_exits_2_with_message(cli, tmp_path, argv, message):
  rc, _, err = cli.run(profile, [
      f"--campaign_dir={tmp_path}/c", "--steps=4", "--checkpoint_every=2"]
                       + argv)
  assert rc == 2 and message in err, err


def test_helpfull_explains_the_tool(capsys):
  with pytest.raises(SystemExit) as e:
    _cli.run(profile.main, profile.FLAGS, profile.__doc__,
             argv=["profile", "--helpfull"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert "Golden profile" in out and "priority order" in out
  for flag in ("--capture_sites", "--capture_kernel", "--capture_phase",
               "--capture_steps", "--budget", "--campaign_dir", "--steps",
               "--checkpoint_every", "--scenario"):
    assert flag in out


@pytest.mark.parametrize("text, expected", [
    ("500000", 500000), ("64MiB", 64 << 20), ("1.5GB", 1_500_000_000),
    ("300kb", 300_000), ("2 KiB", 2048),
])
def test_parse_bytes(text, expected):
  assert _cli.parse_bytes(text) == expected


def test_eta_counts_units_and_estimates_from_units_after_the_first():
  out, now = [], [0.0]
  eta = _cli.Eta(3, prefixes=("unit",), out=out.append, clock=lambda: now[0])
  now[0] = 10.0
  eta("unit a")      # first unit: 10 s (compilation) -> 2 left x 10 s
  eta("other line")
  now[0] = 12.0
  eta("unit b")      # 2 s per unit after the first -> 1 left x 2 s
  now[0] = 14.0
  eta("unit c")
  assert out == ["unit a [1/3, 10.0 s elapsed, ETA 20.0 s]", "other line",
                 "unit b [2/3, 12.0 s elapsed, ETA 2.0 s]",
                 "unit c [3/3, 14.0 s elapsed, ETA 0.0 s]"]


def test_table_aligns_columns():
  assert _cli.table([("a", 1.23456, None), ("long name", 2, "x")],
                    ("h1", "h2", "h3")).splitlines() == [
                        "h1         h2     h3",
                        "---------  -----  --",
                        "a          1.235  -",
                        "long name  2      x"]
