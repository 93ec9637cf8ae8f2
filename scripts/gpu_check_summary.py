"""The GPU check's summary: its format, its check and its text table.

``summary.json`` (written by scripts/gpu_check.py, described in BUILD.md):

  {"format": "peat-gpu-check/1", "mode": "gpu" | "dry-run",
   "started", "finished": UTC ISO times, "wall_s", "budget_s",
   "commit": the git commit (or $PEAT_COMMIT; null when neither is known),
   "tree_sha256": a hash of the sources that ran,
   "ok": every selected step passed,
   "machine": the env step's findings (versions, GPU, devices),
   "steps": [{"name", "what", "command", "status": ok|failed|timeout|skipped,
              "rc", "seconds", "timeout_s", "log", "results": {...},
              "error": why it is not ok (null when ok)}, ...],  # STEP_NAMES
   "files": ["summary.json", "gpu_check.log", "logs.tar.gz"]}

Standard library only.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = "peat-gpu-check/1"
STATUSES = ("ok", "failed", "timeout", "skipped")
STEP_NAMES = ("env", "build", "build_check", "kernel_tests",
              "campaign_native", "campaign_llama_bf16",
              "campaign_xla_default", "bench_analyzer", "bench_playback")
OUT_FILES = ("summary.json", "gpu_check.log", "logs.tar.gz")
NOT_SELECTED = "not selected (--only)"



def tree_digest() -> str:
  """sha256 of the sources a run depends on (the checkout has no .git there)."""
  h = hashlib.sha256()
  for top in ("peat_jax", "models", "tools", "benchmarks", "scripts",
              "tests"):
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
      dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
      for name in sorted(filenames):
        if name.endswith((".py", ".cc", ".cu", ".h", ".hip", ".sh")):
          path = os.path.join(dirpath, name)
          h.update(os.path.relpath(path, ROOT).encode() + b"\0")
          with open(path, "rb") as f:
            h.update(f.read())
  for name in ("setup.py", "pyproject.toml"):
    with open(os.path.join(ROOT, name), "rb") as f:
      h.update(f.read())
  return h.hexdigest()


def _commit() -> str | None:
  """$PEAT_COMMIT, else git's HEAD (``+changes`` when tracked files differ)."""
  if os.environ.get("PEAT_COMMIT"):
    return os.environ["PEAT_COMMIT"]

  def git(*args) -> str:
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True,
                          text=True, timeout=10, check=True).stdout.strip()

  try:
    head = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return None
  return (head + ("+changes" if changed else "")) or None


def make_summary(mode: str, steps: list[dict], started: float,
                 budget_s: float) -> dict:
  counted = [s for s in steps if s["error"] != NOT_SELECTED]
  env = next((s["results"] for s in steps if s["name"] == "env"), {})
  return {
      "format": FORMAT, "mode": mode,
      "started": _iso(started), "finished": _iso(time.time()),
      "wall_s": round(time.time() - started, 1), "budget_s": budget_s,
      "commit": _commit(), "tree_sha256": tree_digest(),
      "ok": bool(counted) and all(s["status"] == "ok" for s in counted),
      "machine": env, "steps": steps, "files": list(OUT_FILES),
  }


def _iso(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
      "%Y-%m-%dT%H:%M:%SZ")


_ENTRY = {"name": str, "what": str, "command": str, "status": str,
          "seconds": (int, float), "timeout_s": (int, float),
          "results": dict}


def summary_problems(summary: dict) -> list[str]:
  """What is wrong with a summary (empty: it has the documented format)."""
  problems = []
  want = {"format": str, "mode": str, "started": str, "finished": str,
          "wall_s": (int, float), "budget_s": (int, float), "ok": bool,
          "machine": dict, "steps": list, "files": list, "tree_sha256": str}
  for key, typ in want.items():
    if not isinstance(summary.get(key), typ):
      problems.append(f"{key}: expected {typ}, got {summary.get(key)!r:.80}")
  if summary.get("format") != FORMAT:
    problems.append(f"format: expected {FORMAT!r}")
  if summary.get("mode") not in ("gpu", "dry-run"):
    problems.append(f"mode: expected gpu or dry-run, got {summary.get('mode')!r}")
  steps = summary.get("steps") if isinstance(summary.get("steps"), list) else []
  names = tuple(s.get("name") for s in steps if isinstance(s, dict))
  if names != STEP_NAMES:
    problems.append(f"steps: expected {STEP_NAMES}, got {names}")
  for s in steps:
    if not isinstance(s, dict):
      problems.append(f"step {s!r:.40}: not an object")
      continue
    for key, typ in _ENTRY.items():
      if not isinstance(s.get(key), typ):
        problems.append(f"step {s.get('name')}: {key} is {s.get(key)!r:.60}")
    if s.get("status") not in STATUSES:
      problems.append(f"step {s.get('name')}: status {s.get('status')!r} "
                      f"not one of {STATUSES}")
    if s.get("status") != "ok" and not s.get("error"):
      problems.append(f"step {s.get('name')}: {s.get('status')} without an "
                      "error")
  counted = [s for s in steps if isinstance(s, dict)
             and s.get("error") != NOT_SELECTED]
  ok = bool(counted) and all(s.get("status") == "ok" for s in counted)
  if summary.get("ok") is not ok:
    problems.append(f"ok is {summary.get('ok')!r} but the steps say {ok}")
  return problems


def table(summary: dict) -> str:
  """A short text table of the steps and their main figures."""
  lines = [f"peat_jax GPU check ({summary['mode']}), {summary['started']}, "
           f"{summary['wall_s']:.0f} s of {summary['budget_s']:.0f}: "
           f"{'OK' if summary['ok'] else 'NOT OK'}"]
  for s in summary["steps"]:
    r = s["results"]
    note = s["error"] or ""
    if s["name"] == "kernel_tests" and "totals" in r:
      cuda = r["by_file"].get("test_cuda_device")
      note = f"{r['totals']}; test_cuda_device {cuda}" + (
          f"; first failure: {r['failures'][0]}" if r["failures"] else "")
    elif s["name"].startswith("campaign") and "verdict" in r:
      note = f"verdict {r['verdict']}: {r['models']}"
    elif s["name"] == "bench_analyzer" and r.get("sizes"):
      note = "; ".join(f"{x['n']}^2: {x['analyze_gbs']:.1f} GB/s = "
                       f"{100 * x['analyze_to_ceiling']:.1f}% of a "
                       f"{x['ceiling_gbs']:.0f} GB/s copy" for x in r["sizes"])
    elif s["name"] == "bench_playback" and r.get("rows"):
      note = "; ".join(f"{x['what'].split(' (')[0][:48]}: "
                       f"{x['ratio_to_golden_step']:.2f}x" for x in r["rows"]
                       if x["what"].startswith(("playback per", "of which")))
    lines.append(f"  {s['name']:<21} {s['status']:<8} {s['seconds']:6.1f} s  "
                 f"{note[:300]}")
  return "\n".join(lines)
