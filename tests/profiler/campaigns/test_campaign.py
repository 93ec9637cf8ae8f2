"""Tests of validation campaigns (peat_jax/_campaign.py, tools/validate.py)."""

import json
import math
import os

from absl.testing import flagsaver
import jax
import pytest

import peat_jax as peat
from peat_jax import profiler
from peat_jax.profiler import campaigns
from peat_jax.profiler.campaigns import _campaign
from peat_jax.profiler.files import _records as records
from peat_jax import models
from peat_jax.kernels import kut
from peat_jax.tools import validate as validate_tool

SETTINGS = dict(steps=8, checkpoint_every=4, frequencies=("every",),
                runtime_steps=6, scenario="cnn", progress=None)
TOOL_ARGS = ["--kut=golden", "--batch_size=32", "--steps=8",
             "--checkpoint_every=4", "--frequencies=every",
             "--runtime_steps=6"]


@pytest.fixture(scope="module")
def task():
  return models.get_task("cnn", batch_size=32)


@pytest.fixture(scope="module")
def golden_campaign(task, tmp_path_factory):
  d = tmp_path_factory.mktemp("campaign") / "golden_kut"
  paths = profiler.validate(task, "golden", d, **SETTINGS)
  return d, paths


def _site_records(d):
  return [r for r in profiler.read_records(d / profiler.PLAYBACK_FILE)
          if r["kind"] == "site"]


def test_records_match_sites_and_report(golden_campaign, task):
  d, paths = golden_campaign
  assert paths.verdict == "pass"
  recs = _site_records(d)
  state, batch = task.init_state(0), task.batch_at(0)
  fwd_dots = [s.name for s in peat.discover_sites(task.step_fn, state, batch)
              if s.kernel == "dot_general" and s.phase == "fwd"]
  assert sorted((r["step"], r["site"]) for r in recs) == sorted(
      (s, n) for s in (0, 4) for n in fwd_dots)
  for r in recs:
    assert r["diagnosis"]["model"] == "exact"
    assert len(r["signature"]["bits_xor"]) == 32
    assert r["signature"]["noise_ratio"] <= 1.0
  report = json.loads((d / "report.json").read_text())
  assert report["verdict"]["verdict"] == "pass"
  assert [s["site"] for s in report["sites"]] == fwd_dots
  assert report["playback"]["steps"] == [0, 4]
  assert report["playback"]["loss_kut"] == report["playback"]["loss_golden"]
  assert report["localization"] is None
  run, = report["runtime"]
  assert run["loss"] == run["golden_loss"] and run["diverged_at"] is None
  assert len(report["runtime_spread"]["loss_spread"]) == 6
  assert os.path.getsize(paths.html) > 1000
  assert json.loads((d / "campaign.json").read_text())["kut"] == "golden"


def test_resume_through_tool_skips_done_steps(golden_campaign, capsys):
  d, _ = golden_campaign
  before = _site_records(d)
  with flagsaver.flagsaver():
    validate_tool.FLAGS.unparse_flags()
    validate_tool.FLAGS(["validate"] + TOOL_ARGS + [f"--campaign_dir={d}"])
    assert validate_tool.main(["validate"]) == 0
  out = capsys.readouterr().out
  assert "playback step 0: done before, skipped" in out
  assert f"report: {d}/report.html" in out and "verdict: pass" in out
  after = _site_records(d)
  assert len(after) == len(before)
  keys = [(r["step"], r["site"]) for r in after]
  assert len(set(keys)) == len(keys)


def test_other_settings_refused(golden_campaign, task):
  d, _ = golden_campaign
  with pytest.raises(peat.PeatError, match=r"other settings.*kut"):
    profiler.validate(task, "native:matmul:default", d, **SETTINGS)


def test_lock_refused(golden_campaign, task):
  d, _ = golden_campaign
  with profiler.campaign_lock(str(d)):
    with pytest.raises(peat.PeatError, match=f"{d} is locked"):
      profiler.validate(task, "golden", d, **SETTINGS)


def _missed_write_matmul(lhs, rhs, **params):
  """A faulty dot_general: leaves output column 3 unwritten (zero)."""
  out = jax.lax.dot_general_p.bind(lhs, rhs, **params)
  return out.at[..., 3].set(0.0)


def test_faulty_kut_fails_and_localizes(golden_campaign, task, tmp_path):
  d, _ = golden_campaign
  spec = "test:missed_write_matmul"
  kut.register_kut(spec, _missed_write_matmul, kernel="dot_general")
  pb = profiler.playback(task, d / "golden", spec, campaign_dir=tmp_path)
  assert {r["step"] for r in pb.records} == {0, 4}
  v = peat.verdict({(r["site"], r["step"]): peat.detector.diagnosis_of(r)
                    for r in pb.records})
  assert v.verdict == "fail"
  assert pb.localization["site"] == "fwd/Cnn/Linear/dot_general:0"
  assert pb.localization["step"] == 0
  assert any(e["loss_kut"] != e["loss_golden"] for e in pb.effects)
  # A second call finds every step done: no new record.
  n = len(profiler.read_records(tmp_path / profiler.PLAYBACK_FILE))
  profiler.playback(task, d / "golden", spec, campaign_dir=tmp_path)
  assert len(profiler.read_records(tmp_path / profiler.PLAYBACK_FILE)) == n


def test_divergence_rules():
  g = [2.0] * 10
  env = [0.01] * 10
  assert profiler.divergence(g, g, env) == (None, None)
  at, why = profiler.divergence([2.0, 2.0, math.nan] + [2.0] * 7, g, env)
  assert at == 2 and "non-finite" in why
  at, why = profiler.divergence([2.0, 30.0] + [2.0] * 8, g, env)
  assert at == 1 and "10x" in why
  at, why = profiler.divergence([2.0, 2.1, 2.1, 2.1, 2.1, 2.1, 2.0, 2, 2, 2], g, env)
  assert at == 1 and "5 consecutive" in why
  at, _ = profiler.divergence([2.0, 2.1, 2.1, 2.0, 2.1, 2.1, 2.1, 2.1, 2, 2], g, env)
  assert at is None
  assert list(profiler.envelope([1, 0, 0, 3, 0], window=2)) == [1, 1, 0, 3, 3]


def test_frequency_parsing():
  assert profiler.parse_frequency("every_4")[1] == "every 4th step"
  assert profiler.parse_frequency("fraction_0.25")[0] == peat.Fraction(0.25, seed=0)
  with pytest.raises(peat.PeatError, match="every_<n>"):
    profiler.parse_frequency("sometimes")


def test_truncated_record_file(tmp_path):
  p = tmp_path / "r.msgpack"
  profiler.append_records(str(p), [{"a": 1}, {"a": 2}])
  with open(p, "ab") as f:
    f.write(b"\x82\xa1a")  # a record cut short
  assert profiler.read_records(p) == [{"a": 1}, {"a": 2}]


def test_prepare_task_factory_rebuilds_the_same_task(tmp_path):
  """The tool's recipe: get_task with the resolved init_from, picklable."""
  import pickle  # pylint: disable=g-import-not-at-top
  fac = models.prepare_task_factory("cnn", str(tmp_path), seed=3,
                                    batch_size=16)
  assert fac == peat.TaskFactory(
      "peat_jax.models", "get_task",
      dict(name="cnn", seed=3, init_from=None, batch_size=16))
  assert pickle.loads(pickle.dumps(fac)) == fac
  task = fac.build()
  assert task.name == "cnn" and task.batch_at(0)["x"].shape[0] == 16
  with pytest.raises(peat.PeatError, match="batch_sise"):
    models.prepare_task_factory("cnn", str(tmp_path), batch_sise=16)


@pytest.mark.slow  # worker processes compile the CNN twice (~25 s)
def test_tool_isolates_native_kuts_by_default(tmp_path, capsys):
  """The README main command: a native KUT runs in worker processes unless
  --isolate=off (playback and runtime FI side by side on a CPU of two
  cores); the records are the same either way."""
  args = ["--kut=native:matmul:in_bf16", "--batch_size=32", "--steps=4",
          "--checkpoint_every=4", "--frequencies=every", "--runtime_steps=3",
          "--select=*Linear*"]
  records = {}
  for mode in ("auto", "off"):
    d = tmp_path / mode
    with flagsaver.flagsaver():
      validate_tool.FLAGS.unparse_flags()
      validate_tool.FLAGS(["validate"] + args + [f"--campaign_dir={d}",
                                                 f"--isolate={mode}"])
      assert validate_tool.main(["validate"]) == 0
    out = capsys.readouterr().out
    assert ("(isolated: worker processes" in out) == (mode == "auto"), out
    assert "verdict: warn" in out
    side = "(side by side with playback)" in out
    assert side == (mode == "auto" and campaigns.side_by_side()), out
    records[mode] = [(d / f).read_bytes() for f in (
        profiler.PLAYBACK_FILE, profiler.RUNTIME_FILE)]
  assert records["auto"] == records["off"]
  playback, runtime = (profiler.read_records(tmp_path / "auto" / f) for f in
                        (profiler.PLAYBACK_FILE, profiler.RUNTIME_FILE))
  assert len(playback) > 1 and {r["name"] for r in runtime} >= {
      "golden", "every"}, runtime


def _report_without_time(path):
  data = json.loads(path.read_text())
  data.pop("created")
  return data


@pytest.mark.parametrize("kut_spec", ["golden", "test:missed_write_matmul"])
def test_rebuilt_report_equals_the_report_validate_wrote(task, tmp_path,
                                                          kut_spec):
  """`peat-report` (rebuild_report) remakes exactly validate's report.json."""
  kut.register_kut("test:missed_write_matmul", _missed_write_matmul,
                   kernel="dot_general")
  d = tmp_path / "c"
  paths = profiler.validate(task, kut_spec, d, **{**SETTINGS, "steps": 4,
                                                   "runtime_steps": 3})
  written = _report_without_time(d / "report.json")
  rebuilt = profiler.rebuild_report(d)
  assert rebuilt.verdict == paths.verdict
  assert _report_without_time(d / "report.json") == written


def test_a_kut_spec_is_parsed_once_where_it_enters(task, tmp_path,
                                                    monkeypatch):
  """validate parses the spec string once and passes the KutSpec on."""
  calls = []
  parse = kut.parse_kut

  def counting(spec):
    calls.append(spec)
    return parse(spec)

  monkeypatch.setattr(kut, "parse_kut", counting)
  profiler.validate(task, "native:matmul:default", tmp_path / "c",
                    **{**SETTINGS, "steps": 4, "runtime_steps": 2},
                    isolate=False)
  assert calls == ["native:matmul:default"]
  calls.clear()
  parsed = parse("golden")
  profiler.playback(task, tmp_path / "c" / "golden", parsed,
                    campaign_dir=tmp_path / "other")
  profiler.runtime(task, tmp_path / "c" / "golden", parsed,
                   frequencies=("every",), steps=2,
                   campaign_dir=tmp_path / "other")
  assert calls == []  # a parsed spec is never parsed again


@pytest.mark.parametrize("together", [True, False])
def test_isolated_stages_run_side_by_side_and_keep_each_others_work(
    monkeypatch, together):
  """Playback and runtime FI in workers run at once on a CPU of two cores
  (one after the other elsewhere); a stage's failure never throws away
  the other's records: both end before the error is raised."""
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(_campaign, "side_by_side", lambda: together)
  plan = _campaign._Phases("[2/4] playback", "[3/4] runtime")
  lines, ran = [], []
  runtime_started = threading.Event()

  def play():
    if together:  # the runtime stage starts before playback ends
      assert runtime_started.wait(30)
    else:
      assert not runtime_started.is_set()
    ran.append("playback")
    raise peat.PeatError("playback failed")

  def run():
    runtime_started.set()
    time.sleep(0.2)
    ran.append("runtime")

  with pytest.raises(peat.PeatError, match="playback failed"):
    _campaign._isolated_phases(plan, lines.append, play, run)
  assert sorted(ran) == ["playback", "runtime"] if together else (
      ran == ["playback"])
  assert lines[0] == plan.playback
  assert (len(lines) == 2) == together

  def failing_run():
    raise peat.PeatError("runtime failed")

  ran.clear()
  with pytest.raises(peat.PeatError, match="runtime failed"):
    _campaign._isolated_phases(plan, lines.append,
                               lambda: ran.append("playback"), failing_run)
  assert ran == ["playback"]
