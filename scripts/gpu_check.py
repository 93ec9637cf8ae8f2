"""The GPU check of peat_jax (scripts/gpu_check.sh runs this; BUILD.md).

One run, on a machine with an NVIDIA GPU: the environment, the build of the
CPU and CUDA libraries against that machine's jax, the native-kernel tests
on the GPU, a validate campaign on the bf16 Llama-style scenario (the native
RMSNorm of Hugging Face's order, bf16 native on the GPU), two validate
campaigns on the GPT scenario (a native CUDA KUT,
and XLA's own float32 dot at DEFAULT precision against HIGHEST), and the
timings of the Analyzer and of one playback checkpoint. Each step runs in
its own process group with a time limit taken from one budget (8 minutes
by default); a step that fails or runs out of time is recorded and the next
one runs. The output directory gets at most three files (the device
machine brings back eight): ``summary.json``, ``gpu_check.log`` (what is
printed) and ``logs.tar.gz`` (every step's log, the test report, the
campaigns' report.json and report.html, the benchmarks' JSON).

``--dry-run`` runs the same steps on the CPU (JAX_PLATFORMS=cpu; the
package is built as a wheel into the work directory, without touching the
environment or the tree; the CUDA library only with ``--nvcc``) to check
the build flags, the commands and the summary. ``--list`` prints the
commands without running them. Only the standard library is used here:
the steps run with ``--python`` (default: this interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
from gpu_check_summary import NOT_SELECTED, STEP_NAMES
from gpu_check_summary import make_summary, summary_problems, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE_KUT = "native:matmul:in_tf32"
HANDLERS = ("PeatMatmulFwd", "PeatMatmulBwd", "PeatSoftmaxFwd",
            "PeatSoftmaxBwd", "PeatLayerNormFwd", "PeatLayerNormBwd",
            "PeatConv2dFwd", "PeatConv2dBwd", "PeatRmsNormFwd",
            "PeatRmsNormBwd", "PeatSiluFwd", "PeatSiluBwd", "PeatRopeFwd",
            "PeatRopeBwd")
#: The bf16 campaign's KUT: the native RMSNorm of Hugging Face's Llama
#: order (a correct port) at the bf16 llama's rms_norm sites.
LLAMA_KUT = "native:rms_norm:hf"
LIBRARIES = {"cpu": "_peat_kernels_cpu.so", "CUDA": "_peat_kernels_cuda.so"}
BUDGET_S = 450.0  # + up to 20 s to stop a late step: within 8 minutes
DRY_BUDGET_S = 3600.0
MARK = "GPU_CHECK_JSON "  # the probes' result line


class Step(NamedTuple):
  """One step: a command, its environment, its time and its result parser.

  Attributes:
    name: the step's name (summary, logs, ``--only``).
    what: one line on what it checks.
    argv: the command.
    env: variables set on top of the caller's environment.
    cap_s: most seconds it may take.
    need_s: fewest seconds worth starting it with (else: skipped).
    group: steps of one group run at the same time.
    parse: ``(step, log text, work dir) -> results`` (raises: failed).
  """

  name: str
  what: str
  argv: tuple
  env: dict
  cap_s: float
  need_s: float
  group: str
  parse: Callable | None = None


# ------------------------------------------------------------------ plan


def plan(dry_run: bool, work: str, python: str, nvcc: bool = False
         ) -> list[Step]:
  """The steps of a run, in order.

  Args:
    dry_run: the CPU version of every step.
    work: the work directory (campaigns, wheel, logs).
    python: the interpreter that runs the steps.
    nvcc: dry run: build the CUDA library too (nvcc, no GPU needed).

  Returns:
    One :class:`Step` per name of ``STEP_NAMES``.
  """
  probe = os.path.join("scripts", "gpu_check_probe.py")
  gpu = not dry_run
  # cuda first (the default device), cpu beside it; an explicit list makes
  # jax fail when CUDA does not start instead of falling back to the CPU.
  jax_gpu = {"JAX_PLATFORMS": "cuda,cpu" if gpu else "cpu"}
  shared = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", **jax_gpu}
  golden_highest = {**shared, "JAX_DEFAULT_MATMUL_PRECISION": "highest"}
  cuda = gpu or nvcc
  # pytest-xdist, where installed with the steps' interpreter (the GPU
  # machine's image has it): four test processes share the GPU.
  workers = ("-n", "4") if gpu and _has_module(python, "xdist") else ()
  if gpu:
    build = (python, "-m", "pip", "install", "-v", "--no-deps",
             "--no-build-isolation", "-e", ".")
  else:
    build = (python, "-m", "pip", "wheel", "-v", "--no-deps",
             "--no-build-isolation", "-w", os.path.join(work, "wheel"), ".")
  libs = ("cpu,CUDA" if cuda else "cpu")
  check = (python, probe, "--build", f"--platforms={libs}")
  if dry_run:
    check += (f"--wheel_dir={os.path.join(work, 'wheel')}",)
  campaign = ("--scenario=gpt", "--steps=30", "--checkpoint_every=10",
              "--frequencies=every")
  steps = [
      Step("env", "versions, tools and the device jax picks by default",
           (python, probe, "--env",
            f"--expect_backend={'gpu' if gpu else 'cpu'}"),
           {"JAX_PLATFORMS": ""} if gpu else jax_gpu, 90, 10, "env",
           _parse_probe),
      Step("build", "CPU and CUDA libraries against this machine's jax "
           "(setup.py BuildFfi), peat_jax installed without dependencies",
           build, {"PEAT_BUILD_CUDA": "1" if cuda else "0"}, 300, 60,
           "build", _parse_build),
      Step("build_check", "peat_jax and its tools import with this jax; "
           "the libraries exist, load and export every handler",
           check, {"JAX_PLATFORMS": "cpu"}, 90, 10, "build_check",
           _parse_probe),
      Step("kernel_tests", "tests/kernels on the device: every variant "
           "forward and backward vs float64, its defining property, CUDA "
           "vs CPU library bitwise",
           (python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE",
            "--tb=short", "-m", "not slow", *workers,
            f"--junit-xml={os.path.join(work, 'kernel_tests.xml')}",
            "tests/kernels"),
           {**shared, "PEAT_EXPECT_PLATFORM": "CUDA" if gpu else "cpu"},
           300, 60, "device", _parse_tests),
      Step("campaign_native", f"validate, GPT, {NATIVE_KUT} (the CUDA "
           "kernel), golden dots at HIGHEST",
           (python, "-m", "peat_jax.tools.validate", f"--kut={NATIVE_KUT}",
            *campaign, "--memory_limit_mb=32768", "--startup_s=240",
            "--timeout_s=120",
            f"--campaign_dir={os.path.join(work, 'campaign_native')}"),
           golden_highest, 300, 60, "device", _parse_campaign),
      Step("campaign_llama_bf16", f"validate, llama in bf16 mixed "
           f"precision (bf16 native on the GPU), {LLAMA_KUT} at its "
           "rms_norm sites",
           (python, "-m", "peat_jax.tools.validate", f"--kut={LLAMA_KUT}",
            "--scenario=llama", "--steps=20", "--checkpoint_every=10",
            "--frequencies=every", "--memory_limit_mb=32768",
            "--startup_s=240", "--timeout_s=120",
            f"--campaign_dir={os.path.join(work, 'campaign_llama_bf16')}"),
           shared, 240, 60, "device", _parse_campaign),
      Step("campaign_xla_default", "validate, GPT, XLA's float32 dot at "
           "DEFAULT precision as the KUT, golden at HIGHEST",
           (python, os.path.join("scripts", "gpu_campaign.py"),
            "--precision=default", *campaign,
            f"--campaign_dir={os.path.join(work, 'campaign_xla_default')}"),
           golden_highest, 300, 60, "device", _parse_campaign),
      Step("bench_analyzer", "peat.analyze on 4096^2 and 8192^2 float32 "
           "pairs vs a device copy of the same size",
           (python, os.path.join("benchmarks", "bench_analyzer.py"),
            "--sizes=4096,8192", "--parts=core,wide", "--repeats=10",
            f"--json={os.path.join(work, 'bench_analyzer.json')}"),
           shared, 120, 30, "bench_analyzer", _parse_json_file),
      Step("bench_playback", "one GPT playback checkpoint vs a golden "
           "train step", (python, os.path.join("benchmarks",
                                               "bench_campaign.py"),
                          "--scenario=gpt", f"--kut={NATIVE_KUT}",
                          "--checkpoints=3", "--repeats=5", "--parts=play",
                          f"--json={os.path.join(work, 'bench_playback.json')}"),
           shared, 150, 40, "bench_playback", _parse_json_file),
  ]
  if dry_run:  # a CPU of a shared 2-core machine takes longer than the GPU's
    steps = [s._replace(cap_s=3 * s.cap_s) for s in steps]
  return steps


def _has_module(python: str, name: str) -> bool:
  try:
    return subprocess.run(
        [python, "-c", f"import importlib.util as u; "
         f"raise SystemExit(u.find_spec({name!r}) is None)"],
        capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def command_line(step: Step) -> str:
  """The step as one shell line (``env`` assignments, then the command)."""
  env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(step.env.items()))
  return (env + " " if env else "") + shlex.join(step.argv)


# ----------------------------------------------------------------- parse


def _json_line(log: str) -> dict:
  for line in reversed(log.splitlines()):
    if line.startswith(MARK):
      return json.loads(line[len(MARK):])
  raise ValueError(f"no '{MARK.strip()}' line in the output")


def _parse_probe(step, log, work):
  del step, work
  return _json_line(log)


def _parse_build(step, log, work):
  del step, work
  lines = [l.strip() for l in log.splitlines() if "peat_jax:" in l]
  out = {"peat_jax_lines": lines[-6:]}
  for line in lines:
    if "built CUDA library" in line and " in " in line:
      out["cuda_build_s"] = float(line.rsplit(" in ", 1)[1].split()[0])
    if "CUDA library skipped" in line:
      out["cuda"] = "skipped"
  return out


_OUTCOME = re.compile(r"(tests/\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|"
                      r"XPASS)|(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\s+"
                      r"(tests/\S+::\S+)")
_KIND = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed",
         "ERROR": "failed", "SKIPPED": "skipped", "XFAIL": "skipped"}


def _parse_tests(step, log, work):
  """Counts per file and failures: from the JUnit XML report, or, when the
  run was stopped before pytest wrote it, from the ``-v`` lines."""
  import xml.etree.ElementTree as ET  # pylint: disable=g-import-not-at-top
  del step
  last = [l for l in log.splitlines() if l.strip()][-1:] or [""]
  out = {"pytest": last[0].strip()}
  outcomes = []  # (file, kind, "id: message")
  path = os.path.join(work, "kernel_tests.xml")
  if os.path.exists(path):
    out["source"] = "junit-xml"
    for case in ET.parse(path).getroot().iter("testcase"):
      name = case.get("classname", "") + "::" + case.get("name", "")
      kind, message = "passed", ""
      for child in case:
        if child.tag in ("failure", "error"):
          kind, message = "failed", (child.get("message") or "")[:300]
        elif child.tag == "skipped" and kind == "passed":
          kind = "skipped"
      outcomes.append((case.get("classname", "").split(".")[-1] or "?", kind,
                       f"{name}: {message}"))
  else:
    out["source"] = "log (no JUnit report: the run did not finish)"
    last_word = {}  # node id -> its last outcome (the summary repeats some)
    for m in _OUTCOME.finditer(log):
      node, word = (m.group(1), m.group(2)) if m.group(1) else (
          m.group(4), m.group(3))
      last_word[node] = word
    for node, word in last_word.items():
      outcomes.append((os.path.basename(node.split("::")[0])[:-3],
                       _KIND[word], node))
  by_file = {}
  for where, kind, _ in outcomes:
    by_file.setdefault(where, {"passed": 0, "failed": 0, "skipped": 0})
    by_file[where][kind] += 1
  failures = [what for _, kind, what in outcomes if kind == "failed"]
  out.update(totals={k: sum(f[k] for f in by_file.values())
                     for k in ("passed", "failed", "skipped")},
             by_file=by_file, failures=failures[:60],
             more_failures=max(0, len(failures) - 60))
  return out


def _parse_campaign(step, log, work):
  """The campaign's verdict and per-site error models from report.json."""
  del log
  directory = dict(a.split("=", 1) for a in step.argv
                   if a.startswith("--campaign_dir="))["--campaign_dir"]
  with open(os.path.join(directory, "report.json")) as f:
    report = json.load(f)
  models = {}
  for site in report["sites"]:
    models[site["model"]] = models.get(site["model"], 0) + 1
  pb = report.get("playback") or {}
  loss_diff = [abs(a - b) for a, b in zip(pb.get("loss_kut", []),
                                          pb.get("loss_golden", []))]
  del work
  return {
      "kut": report["kut"], "verdict": report["verdict"]["verdict"],
      "summary": report["verdict"]["summary"], "models": models,
      "sites": [{"site": s["site"], "model": s["model"],
                 "verdict": s["verdict"],
                 "max_noise_ratio": max(s["noise_ratio"] or [0]),
                 "evidence": s["evidence"][:240]} for s in report["sites"]],
      "playback_max_loss_diff": max(loss_diff or [0]),
      "runtime": [{"frequency": r["frequency"], "final_loss": r["loss"][-1],
                   "golden_final_loss": r["golden_loss"][-1],
                   "diverged_at": r["diverged_at"], "crashed": r["crashed"]}
                  for r in report.get("runtime", []) if r["loss"]],
      "crashes": len(report.get("crashes", [])),
  }


def _parse_json_file(step, log, work):
  del log, work
  path = dict(a.split("=", 1) for a in step.argv
              if a.startswith("--json="))["--json"]
  with open(path) as f:
    return json.load(f)


# ------------------------------------------------------------------- run


class _Running(NamedTuple):
  step: Step
  proc: subprocess.Popen | None
  log_path: str
  start: float
  timeout_s: float


def _start(step: Step, timeout_s: float, logs: str) -> tuple[_Running, dict]:
  log_path = os.path.join(logs, f"{step.name}.log")
  with open(log_path, "w") as log:
    log.write(f"$ {command_line(step)}\n")
    log.flush()
    try:
      proc = subprocess.Popen(
          step.argv, cwd=ROOT, env={**os.environ, **step.env},
          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
          start_new_session=True)  # its own process group: killed whole
    except OSError as e:
      return _Running(step, None, log_path, time.time(), timeout_s), {
          "status": "failed", "rc": None, "error": f"cannot start: {e}"}
  return _Running(step, proc, log_path, time.time(), timeout_s), {}


def _stop_group(proc: subprocess.Popen) -> None:
  """Ends the step's process group (the step and what it started)."""
  for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
    try:
      os.killpg(proc.pid, sig)
    except ProcessLookupError:
      return
    try:
      proc.wait(wait)
      return
    except subprocess.TimeoutExpired:
      continue


def _wait(runs: list) -> list[tuple[_Running, dict]]:
  """Waits for steps started together, each within its own time.

  Returns:
    ``(run, outcome)`` per run: status, rc, error, and the end time.
  """
  done = {}
  while len(done) < len(runs):
    for i, (run, early) in enumerate(runs):
      if i in done:
        continue
      if run.proc is None:
        done[i] = {**early, "end": time.time()}
        continue
      rc = run.proc.poll()
      late = time.time() > run.start + run.timeout_s
      if rc is None and not late:
        continue
      end = time.time()
      if rc is None:
        _stop_group(run.proc)
        done[i] = {"status": "timeout", "rc": run.proc.returncode,
                   "error": f"ran past its {run.timeout_s:.0f} s and was "
                   "stopped", "end": end}
      else:
        done[i] = {"status": "ok" if rc == 0 else "failed", "rc": rc,
                   "end": end}
      # The group may outlive its leader (workers of a campaign).
      try:
        os.killpg(run.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    time.sleep(0.1)
  return [(run, done[i]) for i, (run, _) in enumerate(runs)]


def _entry(run: _Running, outcome: dict, work: str) -> dict:
  """The summary entry of a finished step (its results parsed)."""
  step = run.step
  entry = {"name": step.name, "what": step.what, "command": command_line(step),
           "log": os.path.join("logs", os.path.basename(run.log_path)),
           "timeout_s": round(run.timeout_s, 1), "results": {},
           "error": None}
  early = dict(outcome)
  end = early.pop("end")
  entry.update(early)
  entry["seconds"] = round(end - run.start, 1)
  with open(run.log_path, errors="replace") as f:
    log = f.read()
  if step.parse is not None and run.proc is not None:
    try:
      entry["results"] = step.parse(step, log, work)
    except Exception as e:  # pylint: disable=broad-except
      if entry["status"] == "ok":
        entry["status"] = "failed"
      entry["error"] = ((entry["error"] + "; ") if entry["error"] else "") + (
          f"results not read: {type(e).__name__}: {e}")
  if entry["status"] == "failed" and entry["results"].get("problems"):
    entry["error"] = "; ".join(entry["results"]["problems"])
  if entry["status"] == "failed" and not entry["error"]:
    entry["error"] = f"exit status {entry['rc']}; last lines: " + " | ".join(
        l.strip() for l in log.strip().splitlines()[-8:])[-1500:]
  return entry


def run_steps(steps: list[Step], selected: set, budget_s: float, work: str,
              say: Callable[[str], None]) -> list[dict]:
  """Runs the steps, group by group, within one time budget.

  Each step gets at most ``cap_s`` and never more than what the budget has
  left after keeping ``need_s`` for each later group; a step left with
  less than its ``need_s`` is skipped (out of time).
  """
  logs = os.path.join(work, "logs")
  os.makedirs(logs, exist_ok=True)
  deadline = time.time() + budget_s
  groups = []
  for step in steps:
    if not groups or groups[-1][0].group != step.group:
      groups.append([])
    groups[-1].append(step)
  entries = {}
  for i, group in enumerate(groups):
    later = sum(max(s.need_s for s in g if s.name in selected) if any(
        s.name in selected for s in g) else 0 for g in groups[i + 1:])
    running = []
    for step in group:
      if step.name not in selected:
        entries[step.name] = _skipped(step, NOT_SELECTED)
        continue
      left = deadline - time.time() - later
      timeout = min(step.cap_s, left)
      if timeout < step.need_s:
        entries[step.name] = _skipped(
            step, f"out of time: {max(left, 0):.0f} s left for it, needs "
            f"{step.need_s:.0f} s")
        say(f"[gpu-check] {step.name}: skipped ({entries[step.name]['error']})")
        continue
      say(f"[gpu-check] {step.name}: started, at most {timeout:.0f} s: "
          f"{command_line(step)}")
      running.append(_start(step, timeout, logs))
    for run, outcome in _wait(running):
      entry = _entry(run, outcome, work)
      entries[run.step.name] = entry
      say(f"[gpu-check] {run.step.name}: {entry['status']} in "
          f"{entry['seconds']:.1f} s" + (f": {entry['error']}"
                                          if entry["error"] else ""))
  return [entries[s.name] for s in steps]


def _skipped(step: Step, why: str) -> dict:
  return {"name": step.name, "what": step.what, "command": command_line(step),
          "log": None, "timeout_s": 0.0, "status": "skipped", "rc": None,
          "seconds": 0.0, "results": {}, "error": why}


# ------------------------------------------------------------------ main


def _pack(work: str, out_dir: str) -> None:
  """logs.tar.gz: the step logs, the test report, campaign reports, JSON."""
  with tarfile.open(os.path.join(out_dir, "logs.tar.gz"), "w:gz") as tar:
    for rel in sorted(os.listdir(os.path.join(work, "logs"))):
      tar.add(os.path.join(work, "logs", rel), os.path.join("logs", rel))
    for name in ("kernel_tests.xml", "bench_analyzer.json",
                 "bench_playback.json"):
      if os.path.exists(os.path.join(work, name)):
        tar.add(os.path.join(work, name), name)
    for campaign in ("campaign_native", "campaign_xla_default"):
      for name in ("report.json", "report.html", "campaign.json"):
        path = os.path.join(work, campaign, name)
        if os.path.exists(path):
          tar.add(path, f"{campaign}/{name}")


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(
      prog="scripts/gpu_check.sh",
      description="The GPU check of peat_jax: build, native-kernel tests, "
      "campaigns and timings on an NVIDIA GPU (BUILD.md).")
  p.add_argument("out_dir", help="where summary.json, gpu_check.log and "
                 "logs.tar.gz go (created)")
  p.add_argument("--dry-run", action="store_true",
                 help="run every step on the CPU (no GPU needed)")
  p.add_argument("--nvcc", action="store_true",
                 help="dry run: build the CUDA library too (needs nvcc)")
  p.add_argument("--list", action="store_true",
                 help="print the steps' commands and exit")
  p.add_argument("--only", default=None,
                 help=f"comma-separated steps to run, of {','.join(STEP_NAMES)}")
  p.add_argument("--budget_s", type=float, default=None,
                 help=f"time for all steps (default {BUDGET_S:.0f}, dry run "
                 f"{DRY_BUDGET_S:.0f})")
  p.add_argument("--python", default=sys.executable,
                 help="interpreter of the steps (default: this one)")
  p.add_argument("--work", default=None,
                 help="work directory (default: a temporary one, removed "
                 "at the end)")
  args = p.parse_args(argv)
  selected = set(STEP_NAMES if args.only is None else args.only.split(","))
  if selected - set(STEP_NAMES):
    p.error(f"--only: unknown steps {sorted(selected - set(STEP_NAMES))}; "
            f"expected some of {','.join(STEP_NAMES)}")
  if args.nvcc and not args.dry_run:
    p.error("--nvcc is for --dry-run (a GPU run always builds CUDA)")
  budget = args.budget_s or (DRY_BUDGET_S if args.dry_run else BUDGET_S)
  if args.list:
    for step in plan(args.dry_run, args.work or "WORK", args.python,
                     args.nvcc):
      print(f"{step.name}: {command_line(step)}")
    return 0
  work = os.path.abspath(args.work or tempfile.mkdtemp(
      prefix="peat_gpu_check_"))
  steps = plan(args.dry_run, work, args.python, args.nvcc)
  out_dir = os.path.abspath(args.out_dir)
  os.makedirs(out_dir, exist_ok=True)
  os.makedirs(work, exist_ok=True)
  log = open(os.path.join(out_dir, "gpu_check.log"), "w")

  def say(line: str) -> None:
    print(line, flush=True)
    log.write(line + "\n")
    log.flush()

  mode = "dry-run" if args.dry_run else "gpu"
  started = time.time()
  say(f"[gpu-check] {mode} in {ROOT}, work {work}, budget {budget:.0f} s")
  try:
    entries = run_steps(steps, selected, budget, work, say)
    summary = make_summary(mode, entries, started, budget)
    problems = summary_problems(summary)
    if problems:
      summary["format_problems"] = problems
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=1)
    _pack(work, out_dir)
    say(json.dumps(summary, indent=1))
    say(table(summary))  # last: what a tail of the output shows
  finally:
    log.close()
    if args.work is None:
      shutil.rmtree(work, ignore_errors=True)
  return 0 if summary["ok"] and not problems else 1


if __name__ == "__main__":
  sys.exit(main())
