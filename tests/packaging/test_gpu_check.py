"""scripts/gpu_check.sh: its commands, its summary, its runner, its dry run.

The GPU run itself needs an NVIDIA GPU (BUILD.md, "GPU check"); here the
commands it would run are checked against the programs they call, the
summary format against its checker (which must also reject broken
summaries), the runner on real processes (a failing step is recorded and
the next one runs; a step past its time is stopped with what it started),
and, marked slow, the whole dry run on the CPU.
"""

import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")


def _module(name):
  path = os.path.join(ROOT, "scripts", f"{name}.py")
  sys.path.insert(0, os.path.dirname(path))
  try:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  finally:
    sys.path.remove(os.path.dirname(path))
  return mod


check = _module("gpu_check")
summary_mod = _module("gpu_check_summary")


def _run(*args, env=None, timeout=600):
  return subprocess.run(
      ["bash", SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
      timeout=timeout,
      env={**os.environ, "PEAT_PYTHON": sys.executable, **(env or {})})


def _listed(*args) -> dict:
  out = _run("--list", *args, "unused_out")
  assert out.returncode == 0, out.stderr
  steps = {}
  for line in out.stdout.splitlines():
    name, _, cmd = line.partition(": ")
    steps[name] = shlex.split(cmd)
  assert tuple(steps) == summary_mod.STEP_NAMES
  return steps


def _env_and_argv(words):
  """Splits a listed command into its leading VAR=value words and argv."""
  env = {}
  while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
    key, _, value = words[0].partition("=")
    env[key] = value
    words = words[1:]
  return env, words


def test_gpu_commands():
  steps = {k: _env_and_argv(v) for k, v in _listed().items()}
  env, argv = steps["build"]
  assert env == {"PEAT_BUILD_CUDA": "1"}
  assert argv[1:] == ["-m", "pip", "install", "-v", "--no-deps",
                      "--no-build-isolation", "-e", "."]
  env, argv = steps["build_check"]
  assert "--platforms=cpu,CUDA" in argv and "--build" in argv
  env, argv = steps["kernel_tests"]
  assert env["JAX_PLATFORMS"] == "cuda,cpu"
  assert env["PEAT_EXPECT_PLATFORM"] == "CUDA"
  assert argv[-1] == "tests/kernels" and "not slow" in argv
  for name in ("campaign_native", "campaign_xla_default"):
    env, argv = steps[name]
    assert env["JAX_PLATFORMS"] == "cuda,cpu"
    assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"
    assert {"--scenario=gpt", "--steps=30"} <= set(argv)
  assert f"--kut={check.NATIVE_KUT}" in steps["campaign_native"][1]
  assert check.NATIVE_KUT.startswith("native:")
  assert "--precision=default" in steps["campaign_xla_default"][1]
  env, argv = steps["campaign_llama_bf16"]
  assert env["JAX_PLATFORMS"] == "cuda,cpu"
  assert "JAX_DEFAULT_MATMUL_PRECISION" not in env  # bf16 dots as trained
  assert {"--scenario=llama", f"--kut={check.LLAMA_KUT}"} <= set(argv)
  env, argv = steps["bench_analyzer"]
  assert env["JAX_PLATFORMS"] == "cuda,cpu" and "--sizes=4096,8192" in argv
  env, argv = steps["bench_playback"]
  assert {"--scenario=gpt", "--parts=play"} <= set(argv)
  caps = sum(s.cap_s for s in check.plan(False, "w", "python3"))
  needs = sum(s.need_s for s in check.plan(False, "w", "python3"))
  assert needs < check.BUDGET_S <= 8 * 60 < caps  # budget-bound, not caps


def test_dry_run_commands():
  steps = {k: _env_and_argv(v) for k, v in _listed("--dry-run").items()}
  env, argv = steps["build"]
  assert env == {"PEAT_BUILD_CUDA": "0"}
  assert argv[3:8] == ["wheel", "-v", "--no-deps", "--no-build-isolation",
                       "-w"]
  assert "--platforms=cpu" in steps["build_check"][1]
  for name in ("kernel_tests", "campaign_native", "bench_analyzer"):
    assert steps[name][0]["JAX_PLATFORMS"] == "cpu"
  assert steps["kernel_tests"][0]["PEAT_EXPECT_PLATFORM"] == "cpu"
  nvcc = {k: _env_and_argv(v)
          for k, v in _listed("--dry-run", "--nvcc").items()}
  assert nvcc["build"][0] == {"PEAT_BUILD_CUDA": "1"}
  assert "--platforms=cpu,CUDA" in nvcc["build_check"][1]


@pytest.mark.slow  # five interpreters importing jax: 15-50 s on 2 cores
def test_every_flag_of_the_commands_is_a_flag_of_its_program():
  """Each step's program exists and lists each flag the step passes."""
  seen = {}
  for name, words in _listed().items():
    _, argv = _env_and_argv(words)
    prog = argv[1:3] if argv[1] == "-m" else argv[1:2]
    key = tuple(prog)
    if key == ("-m", "pip"):
      continue
    if key not in seen:
      help_flag = "--helpfull" if "peat_jax.tools" in prog[-1] else "--help"
      out = subprocess.run([sys.executable, *prog, help_flag], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
      # absl's app.run exits 1 after printing --help.
      assert out.returncode in (0, 1) and "--" in out.stdout, (
          name, out.stderr[-2000:])
      seen[key] = out.stdout
    for word in argv[len(prog) + 1:]:
      if word.startswith("--"):
        flag = word.split("=", 1)[0]
        assert flag in seen[key] or flag.replace("_", "-") in seen[key], (
            name, flag)


def test_dry_run_of_one_step_writes_a_valid_summary(tmp_path):
  out = tmp_path / "out"
  res = _run("--dry-run", "--only", "env", "--work", str(tmp_path / "w"),
             str(out))
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  assert sorted(os.listdir(out)) == sorted(summary_mod.OUT_FILES)
  summary = json.loads((out / "summary.json").read_text())
  assert summary_mod.summary_problems(summary) == []
  assert summary["mode"] == "dry-run" and summary["ok"] is True
  steps = {s["name"]: s for s in summary["steps"]}
  assert steps["env"]["status"] == "ok"
  assert summary["machine"]["versions"]["jax"] == jax.__version__
  assert summary["machine"]["backend"] == "cpu"
  for name in summary_mod.STEP_NAMES[1:]:
    assert steps[name]["status"] == "skipped"
    assert steps[name]["error"] == summary_mod.NOT_SELECTED
  with tarfile.open(out / "logs.tar.gz") as tar:
    assert "logs/env.log" in tar.getnames()
  assert '"format": "peat-gpu-check/1"' in res.stdout  # printed as well
  assert "env                   ok" in res.stdout


def test_summary_problems_rejects_broken_summaries(tmp_path):
  entries = [check._skipped(s, summary_mod.NOT_SELECTED)  # pylint: disable=protected-access
             for s in check.plan(True, str(tmp_path), sys.executable)]
  entries[0] = dict(entries[0], status="ok", error=None, seconds=1.0)
  good = summary_mod.make_summary("dry-run", entries, time.time(), 60.0)
  assert summary_mod.summary_problems(good) == []
  broken = {
      "missing step": dict(good, steps=good["steps"][1:]),
      "bad status": dict(good, steps=[dict(good["steps"][0],
                                           status="passed")]
                         + good["steps"][1:]),
      "failed without error": dict(good, steps=[dict(
          good["steps"][0], status="failed", error=None)]
                                   + good["steps"][1:]),
      "ok disagrees": dict(good, ok=False),
      "bad mode": dict(good, mode="cpu"),
      "no machine": {k: v for k, v in good.items() if k != "machine"},
  }
  for what, summary in broken.items():
    assert summary_mod.summary_problems(summary), what


def test_a_failing_step_is_recorded_and_the_next_ones_run(tmp_path):
  res = _run("--dry-run", "--python", str(tmp_path / "no_python"),
             "--only", "env,build_check,kernel_tests", "--work",
             str(tmp_path / "w"), str(tmp_path / "out"))
  assert res.returncode == 1
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert summary_mod.summary_problems(summary) == []
  assert summary["ok"] is False
  for s in summary["steps"][:4]:
    if s["name"] == "build":
      assert s["status"] == "skipped"
    else:
      assert s["status"] == "failed" and "cannot start" in s["error"], s


def test_a_step_past_its_time_is_stopped_with_its_children(tmp_path):
  pid_file = tmp_path / "child.pid"
  slow = check.Step(
      "env", "sleeps", ("bash", "-c", f"sleep 300 & echo $! > {pid_file}; "
                        "wait"), {}, 3, 1, "a")
  fast = check.Step("build", "echoes", ("echo", "done"), {}, 30, 1, "b")
  lines = []
  entries = check.run_steps([slow, fast], {"env", "build"}, 60,
                            str(tmp_path), lines.append)
  assert entries[0]["status"] == "timeout", entries[0]
  assert 2.5 < entries[0]["seconds"] < 30
  child = int(pid_file.read_text())
  for _ in range(50):  # the killed child is reaped by init
    if not os.path.exists(f"/proc/{child}") or "Z" in open(
        f"/proc/{child}/stat").read().split()[2]:
      break
    time.sleep(0.1)
  else:
    pytest.fail(f"the step's child {child} still runs")
  assert entries[1]["status"] == "ok"
  assert "done" in (tmp_path / "logs" / "build.log").read_text()
  short = check.run_steps([fast._replace(need_s=100)], {"build"}, 50,
                          str(tmp_path), lines.append)
  assert short[0]["status"] == "skipped" and "out of time" in short[0]["error"]


def test_the_xla_kut_binds_default_precision_under_a_highest_golden():
  campaign = _module("gpu_campaign")
  spec = campaign.register("default")
  assert spec in peat.kernels.known_specs()
  a = jnp.ones((4, 8), jnp.float32)
  b = jnp.ones((8, 3), jnp.float32)
  f = lambda a, b: jnp.tanh(a @ b)
  with jax.default_matmul_precision("highest"):
    golden = str(jax.make_jaxpr(f)(a, b))
    kut = str(jax.make_jaxpr(peat.substitute(f, *peat.resolve_kut(spec)))(
        a, b))
  highest = "precision=(Precision.HIGHEST, Precision.HIGHEST)"
  default = "precision=(Precision.DEFAULT, Precision.DEFAULT)"
  assert golden.count("dot_general") == golden.count(highest) == 1, golden
  assert kut.count(default) == 1 and highest not in kut, kut
  np.testing.assert_array_equal(
      jax.jit(peat.substitute(f, *peat.resolve_kut(spec)))(a, b), f(a, b))


def test_kernel_tests_stop_at_once_on_the_wrong_platform():
  """PEAT_EXPECT_PLATFORM=CUDA where jax computes on the CPU: the session
  ends before the first test, non-zero, saying why (no test 'passes' on
  the wrong device)."""
  out = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "tests/kernels/test_native_properties.py::test_tf32_rounding_helper"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PEAT_EXPECT_PLATFORM": "CUDA",
           "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 3, out.stdout[-2000:]
  assert "jax computes on cpu" in out.stdout and "passed" not in out.stdout


def test_test_results_are_read_from_the_report_or_the_log(tmp_path):
  """The counts from pytest's JUnit report equal those read from its -v
  lines (what is left when a run is stopped before the report)."""
  cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
         f"--junit-xml={tmp_path / 'kernel_tests.xml'}",
         "tests/kernels/test_native_properties.py", "-k",
         "tf32_rounding or acc_bf16"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stdout[-2000:]
  from_xml = check._parse_tests(None, out.stdout, str(tmp_path))  # pylint: disable=protected-access
  (tmp_path / "kernel_tests.xml").unlink()
  from_log = check._parse_tests(None, out.stdout, str(tmp_path))  # pylint: disable=protected-access
  assert from_xml["source"] == "junit-xml" != from_log["source"]
  assert from_xml["totals"] == from_log["totals"] == {
      "passed": 2, "failed": 0, "skipped": 0}
  assert from_xml["by_file"] == from_log["by_file"]


@pytest.mark.slow  # every step on 2 cores: about 10-15 minutes
def test_dry_run_runs_every_step_on_the_cpu(tmp_path):
  res = _run("--dry-run", "--work", str(tmp_path / "w"),
             str(tmp_path / "out"), timeout=3600)
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert summary_mod.summary_problems(summary) == []
  steps = {s["name"]: s for s in summary["steps"]}
  bad = {k: s["error"] for k, s in steps.items() if s["status"] != "ok"}
  assert not bad and res.returncode == 0, bad
  assert steps["kernel_tests"]["results"]["totals"]["failed"] == 0
  assert steps["kernel_tests"]["results"]["totals"]["passed"] > 400
  for name in ("campaign_native", "campaign_llama_bf16",
               "campaign_xla_default"):
    assert steps[name]["results"]["verdict"] in ("pass", "warn", "fail")
  # On a CPU, DEFAULT and HIGHEST dots compute the same thing.
  assert set(steps["campaign_xla_default"]["results"]["models"]) == {"exact"}
  sizes = steps["bench_analyzer"]["results"]["sizes"]
  assert [s["n"] for s in sizes] == [4096, 8192]
  assert all(s["analyze_gbs"] > 0 for s in sizes)
  assert glob.glob(str(tmp_path / "w" / "wheel" / "peat_jax-*.whl"))
