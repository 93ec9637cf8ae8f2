"""Process isolation: deliberately broken native kernels become crash and
hang findings, and the campaign goes on (issue 10, part 1)."""

import json
import os

import pytest

import peat_jax as peat
from peat_jax import profiler
from peat_jax.profiler.campaigns import _campaign as campaign
from peat_jax.profiler.isolation import _isolate as isolate
from peat_jax.profiler.isolation import _isolated as isolated
from peat_jax.profiler.runtime_fi import _runtime as runtime_mod
from peat_jax import report as _report
from peat_jax.kernels import _variants
from peat_jax.kernels import kut

FACTORY = profiler.TaskFactory("peat_jax.models", "get_task",
                        {"name": "cnn", "batch_size": 16})


def _fake_task():
  def never(*a, **k):
    raise AssertionError("the campaign ran past its checks")
  return peat.TrainTask(name="fake", config={}, init_state=never,
                        step_fn=never, train_step=never, batch_at=never,
                        evaluate=never, default_steps=4,
                        default_checkpoint_every=2, model_fn=never)


# ----------------------------------------------------------- registration


def test_broken_specs_parse_but_are_never_enumerated():
  for kernel in _variants.BROKEN_KERNELS:
    for variant in _variants.BROKEN_MODES:
      spec = f"native:{kernel}:{variant}@144"
      s = kut.parse_kut(spec)
      assert kut.is_broken(s) and s.tile == 144
      assert variant not in _variants.variants(kernel)
      assert spec.split("@")[0] not in kut.known_specs()
  assert not kut.is_broken("native:matmul:default")
  assert not kut.is_broken("golden")
  with pytest.raises(peat.PeatError, match="variant 'hang' is not one of"):
    kut.parse_kut("native:softmax:hang")


@pytest.mark.parametrize("isolate,match", [
    (None, "deliberately broken.*needs process isolation.*TaskFactory"),
    (False, "deliberately broken.*isolate=True"),
    (True, "isolate=True needs a peat.TaskFactory"),
])
def test_broken_kut_needs_isolation_and_a_factory(tmp_path, isolate, match):
  with pytest.raises(peat.PeatError, match=match):
    profiler.validate(_fake_task(), "native:matmul:crash_segv", tmp_path / "c",
               isolate=isolate, progress=None)
  assert not (tmp_path / "c").exists()  # refused before anything was written


def test_task_factory_errors():
  with pytest.raises(peat.PeatError, match="cannot be imported"):
    profiler.TaskFactory("peat_jax.no_such_module", "f").build()
  with pytest.raises(peat.PeatError, match="returned dict; expected a peat"):
    profiler.TaskFactory("json", "loads", {"s": "{}"}).build()


# --------------------------------------------------------------- workers


@pytest.mark.parametrize("variant,kind,sig", [
    ("crash_segv", "crash", "SIGSEGV"),
    ("hang", "hang", None),
])
def test_check_kut_turns_a_broken_kernel_into_a_finding(variant, kind, sig):
  f = profiler.check_kut(f"native:matmul:{variant}", timeout_s=2.0, startup_s=120.0,
                  memory_limit_mb=2048)
  assert f["kind"] == kind and f["signal"] == sig
  assert f["kut"] == f"native:matmul:{variant}" and f["phase"] == "check"
  if kind == "hang":
    assert f["timeout_s"] == 2.0 and "within 2 s" in f["message"]
  else:
    assert "killed by SIGSEGV (signal 11)" in f["message"]


@pytest.mark.slow
@pytest.mark.parametrize("spec,kind,sig,msg", [
    ("native:matmul:default", None, None, None),
    ("native:matmul:crash_abort", "crash", "SIGABRT",
     "peat broken kernel crash_abort: abort()"),
    ("native:matmul:oom", "crash", "SIGKILL", "over the limit of 1024 MiB"),
    ("native:conv2d:crash_segv@27", "crash", "SIGSEGV", "SIGSEGV"),
    ("native:conv2d:crash_segv@9", None, None, None),  # spared: golden runs
])
def test_check_kut_more_kernels(spec, kind, sig, msg):
  f = profiler.check_kut(spec, timeout_s=5.0, startup_s=120.0, memory_limit_mb=1024)
  if kind is None:
    assert f is None
  else:
    assert (f["kind"], f["signal"]) == (kind, sig) and msg in f["message"]


@pytest.mark.slow
def test_oom_cap_without_memory_limit_is_resource_exhausted(monkeypatch):
  monkeypatch.setenv("PEAT_BROKEN_OOM_CAP_MB", "128")
  f = profiler.check_kut("native:matmul:oom", timeout_s=30.0, startup_s=120.0,
                  memory_limit_mb=None)
  assert f["kind"] == "crash" and f["signal"] is None
  assert "out of memory" in f["message"] and "RESOURCE_EXHAUSTED" in f[
      "message"]


@pytest.mark.slow
def test_worker_errors_are_raised_not_recorded():
  with pytest.raises(peat.PeatError, match="check_kut runs dot_general"):
    profiler.check_kut("native:softmax:default", timeout_s=30.0, startup_s=120.0)


# ---------------------------------------------------------- report data


def _findings():
  crash = isolate.Death("crash", "SIGSEGV", None, "killed by SIGSEGV", 4)
  hang = isolate.Death("hang", None, 3.0, "no result within 3 s", "every")
  return [isolated.finding_record(crash, "native:matmul:crash_segv", "playback",
                           step=4, site="fwd/Cnn/Linear/dot_general:0"),
          isolated.finding_record(hang, "native:matmul:crash_segv", "runtime",
                           frequency="every")]


def test_findings_fail_the_verdict_and_show_in_report_and_summary(tmp_path):
  findings = _findings()
  v = _report.verdict_data({}, findings)
  assert v["verdict"] == "fail"
  assert v["summary"].startswith("fail: the KUT crashed and hung (2 findings)")
  assert v["deciding"][0] == ["fwd/Cnn/Linear/dot_general:0", 4]
  rt = runtime_mod.runtime_result(
      [{"name": "golden", "loss": [2.0, 1.9]},
       {"name": "spread", "loss": [0.1, 0.1]},
       {"name": "every", "loss": [], "label": "every call",
        "diverged_at": None, "reason": "hang: no result within 3 s",
        "crash": {"kind": "hang"}}], ["every"], 2, 0)
  assert rt.runs[0]["crashed"] and rt.runs[0]["steps"] == []
  data = {"title": "t", "kut": "native:matmul:crash_segv", "scenario": "cnn",
          "verdict": v, "crashes": findings, "sites": [],
          "localization": None, "runtime": rt.runs,
          "runtime_spread": rt.spread,
          "playback": {"steps": [], "loss_golden": [], "loss_kut": []}}
  paths = _report.write_report(data, tmp_path)
  html = paths.html.read_text()
  assert '<section id="crashes"><h2>Crashes and hangs</h2>' in html
  assert "SIGSEGV" in html and "time limit 3 s" in html
  assert json.loads(paths.json.read_text())["crashes"] == findings
  text = _report.summary_table(data)
  assert "runtime every call               hang: no result within 3 s" in text
  assert ("crash: playback step 4 at site fwd/Cnn/Linear/dot_general:0: "
          "SIGSEGV") in text
  assert "hang: runtime FI every: time limit 3 s" in text
  with pytest.raises(peat.PeatError, match=r"crashes\[0\].'kind'"):
    _report.write_report(dict(data, crashes=[dict(findings[0], kind="x")]),
                         tmp_path / "bad")


def test_read_findings_filters_by_kut(tmp_path):
  profiler.append_records(str(tmp_path / isolate.CRASH_FILE), _findings())
  profiler.append_records(str(tmp_path / isolate.CRASH_FILE),
                   [dict(_findings()[0], kut="other")])
  assert profiler.read_findings(tmp_path, "native:matmul:crash_segv") == _findings()
  assert len(profiler.read_findings(tmp_path)) == 3


# --------------------------------------------------------------- campaigns


SMALL = dict(steps=2, checkpoint_every=2, frequencies=("every",),
             runtime_steps=3, progress=print)


@pytest.mark.slow
def test_campaign_attributes_a_crash_to_its_site_and_goes_on(tmp_path,
                                                             capsys):
  """conv2d crashes only at the site with reduction 3*3*16 = 144 (the
  second convolution): playback attributes it there, runtime FI records the
  frequency as crashed, the verdict fails, and a rerun redoes nothing."""
  d = tmp_path / "c"
  spec = "native:conv2d:crash_segv@144"
  paths = profiler.validate(FACTORY, spec, d, timeout_s=120, startup_s=300,
                     memory_limit_mb=4096, **SMALL)
  assert paths.verdict == "fail"
  found = profiler.read_findings(d, spec)
  assert [(f["phase"], f["kind"], f["signal"], f["step"], f["site"],
           f["frequency"]) for f in found] == [
               ("playback", "crash", "SIGSEGV", 0,
                "fwd/Cnn/Conv/conv_general_dilated:1", None),
               ("runtime", "crash", "SIGSEGV", None, None, "every")]
  rt = {r["name"]: r for r in profiler.read_records(d / profiler.RUNTIME_FILE)}
  assert set(rt) == {"golden", "spread", "bf16", "every"}
  assert rt["every"]["crash"]["signal"] == "SIGSEGV"
  assert rt["bf16"]["weights"]["steps"] == [2]  # kept from the dead worker
  report = json.loads(open(paths.json).read())
  assert report["verdict"]["verdict"] == "fail"
  assert len(report["crashes"]) == 2 and report["runtime"][0]["crashed"]
  out = capsys.readouterr().out
  assert "replaying site fwd/Cnn/Conv/conv_general_dilated:2 alone" in out
  # Resume: nothing is replayed, no finding is added.
  profiler.validate(FACTORY, spec, d, timeout_s=120, startup_s=300,
             memory_limit_mb=4096, **SMALL)
  assert "playback step 0: crashed or hung before, skipped" in (
      capsys.readouterr().out)
  assert profiler.read_findings(d, spec) == found


@pytest.mark.slow
@pytest.mark.parametrize("variant,kind,sig,timeout_s", [
    ("hang", "hang", None, 3), ("oom", "crash", "SIGKILL", 120)])
def test_campaign_records_hang_and_oom(tmp_path, variant, kind, sig,
                                       timeout_s):
  d = tmp_path / "c"
  spec = f"native:matmul:{variant}"
  paths = profiler.validate(FACTORY, spec, d, timeout_s=timeout_s, startup_s=150,
                     memory_limit_mb=1536, **SMALL)
  assert paths.verdict == "fail"
  found = profiler.read_findings(d, spec)
  assert [(f["phase"], f["kind"], f["signal"], f["site"]) for f in found] == [
      ("playback", kind, sig, "fwd/Cnn/Linear/dot_general:0"),
      ("runtime", kind, sig, None)]
  if kind == "hang":
    # Player.compile compiled everything before the KUT ran ("warm"), so
    # the first checkpoint's hang is found after timeout_s, not after
    # startup_s + timeout_s.
    assert found[0]["timeout_s"] == 3.0
    assert "start-up and compilation included" not in found[0]["message"]
  assert not os.path.exists(d / ".isolate")
