"""Time to a verdict: `peat-validate` against the cold golden run it needs.

Usage::

  python benchmarks/bench_time_to_verdict.py [--scenarios=gpt,cnn,llama]
      [--steps=20] [--checkpoint_every=10] [--json=out.json]

Per scenario, one fresh process after the other, nothing else running:

* ``golden cold``: ``peat-golden`` into an empty compilation cache (the
  baseline every ratio is against);
* ``validate cold``: ``peat-validate`` (isolated workers, the default) into
  another empty cache;
* ``validate cold, isolate=off``: the same with ``--isolate=off`` and
  ``JAX_LOG_COMPILES=1`` into a third empty cache: the XLA compilations of
  the campaign are counted and their seconds summed from the log (the
  persistent cache's hits are counted apart);
* ``validate warm``: ``peat-validate`` again with the second cache, now warm
  (isolated, the default).

The bytes a stored golden step adds per checkpoint come from the cold
campaign's ``golden/golden_step/``, and whether playback read it (a float32
step) or replayed the golden step (a bf16 step) from its effect records.

Each validate runs the golden run, playback at every checkpoint, runtime FI
at every call and the verdict; the first and a later playback checkpoint
come from validate's own log (the isolate=off run), the golden step from
``peat-golden``'s mean step after the first. Every figure is a wall time in
seconds of this run and a ratio against ``golden cold`` of the same run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_SCENARIOS = flags.DEFINE_list("scenarios", ["gpt", "cnn", "llama"],
                               "Scenarios (peat-validate --scenario).")
_STEPS = flags.DEFINE_integer("steps", 20, "Golden and runtime FI steps.")
_EVERY = flags.DEFINE_integer("checkpoint_every", 10, "Checkpoint interval.")
_JSON = flags.DEFINE_string("json", "", "Also write the figures here.")

#: A benign KUT per scenario: the campaign's cost, not a fault's.
KUTS = {"gpt": "native:matmul:default", "cnn": "native:conv2d:default",
        "llama": "native:matmul:default", "vit": "native:matmul:default",
        "vit_bf16": "native:matmul:default"}

_COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.eE+-]+) sec")
_HIT = re.compile(r"Persistent compilation cache hit")
_CKPT = re.compile(r"^playback step (\d+):.*\(([0-9.]+) s\)\s*$", re.M)
_STEP_MS = re.compile(r"\(([0-9.]+) ms/step\)")


def _tool(name: str) -> list[str]:
  return [sys.executable, "-m", f"peat_jax.tools.{name}"]


def _run(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
  """Wall seconds and the combined output of one fresh process."""
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True,
                        env={**os.environ, **(env or {})}, check=False)
  wall = time.perf_counter() - t0
  out = proc.stdout + proc.stderr
  if proc.returncode not in (0, 1):  # 1: a verdict below --fail_on
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                       f"{out[-3000:]}")
  return wall, out


def compilations(log: str) -> dict:
  """XLA compilations in a JAX_LOG_COMPILES log: count, seconds, by name
  (a persistent-cache hit is logged as a compilation too; hits apart)."""
  hits = len(_HIT.findall(log))
  by_name: dict[str, list[float]] = {}
  for name, secs in _COMPILED.findall(log):
    by_name.setdefault(name, []).append(float(secs))
  n = sum(len(v) for v in by_name.values())
  return {"count": n - hits, "cache_hits": hits,
          "seconds": sum(sum(v) for v in by_name.values()),
          "by_name": {k: [len(v), round(sum(v), 2)]
                      for k, v in sorted(by_name.items(),
                                         key=lambda kv: -sum(kv[1]))}}


def scenario(name: str, root: str) -> dict:
  """The figures of one scenario (fresh caches and campaigns under root)."""
  kut = KUTS[name]
  common = [f"--scenario={name}", f"--steps={_STEPS.value}",
            f"--checkpoint_every={_EVERY.value}"]
  d = lambda *p: os.path.join(root, name, *p)
  golden_s, out = _run(_tool("golden") + common + [
      f"--campaign_dir={d('golden_only')}",
      f"--compilation_cache={d('cache_golden')}"])
  step_ms = float(_STEP_MS.search(out).group(1))
  validate = _tool("validate") + common + [
      f"--kut={kut}", "--frequencies=every"]
  cold_s, _ = _run(validate + [f"--campaign_dir={d('cold')}",
                               f"--compilation_cache={d('cache')}"])
  off_s, log = _run(validate + [
      f"--campaign_dir={d('off')}", f"--compilation_cache={d('cache_off')}",
      "--isolate=off"], env={"JAX_LOG_COMPILES": "1"})
  warm_s, _ = _run(validate + [f"--campaign_dir={d('warm')}",
                               f"--compilation_cache={d('cache')}"])
  ckpts = [(int(s), float(t)) for s, t in _CKPT.findall(log)]
  stored = _stored_bytes(d("cold", "golden", "golden_step"))
  return {
      "scenario": name, "kut": kut, "golden_cold_s": golden_s,
      "golden_step_ms": step_ms, "validate_cold_s": cold_s,
      "validate_cold_isolate_off_s": off_s, "validate_warm_s": warm_s,
      "compilations": compilations(log),
      "first_checkpoint_s": ckpts[0][1] if ckpts else None,
      "later_checkpoint_s": ckpts[-1][1] if len(ckpts) > 1 else None,
      "golden_step_bytes": stored,
      "golden_step_read": _read_stored(d("off", "playback.msgpack")),
  }


def _stored_bytes(folder: str) -> int | None:
  """Bytes of one checkpoint's stored golden step (the largest), or None
  (nothing stored: a campaign of a commit without the store)."""
  if not os.path.isdir(folder):
    return None
  sizes = [os.path.getsize(os.path.join(folder, f))
           for f in os.listdir(folder) if f.endswith(".npz")]
  return max(sizes) if sizes else None


def _read_stored(path: str) -> bool:
  """Whether playback read the stored golden step (a float32 step) rather
  than replay it (a bf16 step, or a commit without the store)."""
  from peat_jax.profiler import read_records  # pylint: disable=g-import-not-at-top
  return any(r.get("golden_step") == "stored" for r in read_records(path)
             if r.get("kind") == "effect")


def table(rows: list[dict]) -> str:
  """The Markdown table: seconds and ratios against golden cold."""
  lines = ["| scenario (KUT) | golden cold | validate cold | validate cold, "
           "isolate=off | compilations (s) | validate warm | first / later "
           "checkpoint | later checkpoint / golden step | golden step "
           "stored per checkpoint |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
  for r in rows:
    g = r["golden_cold_s"]
    x = lambda s: f"{s:.1f} s ({s / g:.2f}x)"
    c = r["compilations"]
    first, later = r["first_checkpoint_s"], r["later_checkpoint_s"]
    ck = (f"{first:.2f} / {later:.2f} s" if later is not None else "-")
    per = (f"{later * 1e3 / r['golden_step_ms']:.1f}x "
           f"({r['golden_step_ms']:.0f} ms)" if later is not None else "-")
    lines.append(
        f"| {r['scenario']} ({r['kut']}) | {g:.1f} s | {x(r['validate_cold_s'])}"
        f" | {x(r['validate_cold_isolate_off_s'])} | {c['count']} "
        f"({c['seconds']:.1f} s) | {x(r['validate_warm_s'])} | {ck} | {per} "
        f"| {_stored_cell(r)} |")
  return "\n".join(lines)


def _stored_cell(r: dict) -> str:
  b = r.get("golden_step_bytes")
  if b is None:
    return "none (replayed)"
  how = "read" if r.get("golden_step_read") else "replayed (bf16 step)"
  return f"{b / 2**20:.2f} MiB, {how}"


def main(argv: list[str]) -> int:
  del argv
  root = tempfile.mkdtemp(prefix="peat_ttv_")
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True,
                            check=False).stdout.strip()
    rows = []
    for name in _SCENARIOS.value:
      if name not in KUTS:
        print(f"error: --scenarios: no benign KUT for {name!r}; expected "
              f"one of {sorted(KUTS)}", file=sys.stderr)
        return 2
      try:
        rows.append(scenario(name, root))
      except RuntimeError as e:  # one scenario's failure keeps the others
        print(f"{name}: {e}", file=sys.stderr, flush=True)
        continue
      r = rows[-1]
      print(f"{name}: golden {r['golden_cold_s']:.1f} s, validate cold "
            f"{r['validate_cold_s']:.1f} s, warm {r['validate_warm_s']:.1f} s,"
            f" {r['compilations']['count']} compilations", flush=True)
    print(f"\ncommit {commit}, {_STEPS.value} steps, a checkpoint every "
          f"{_EVERY.value}, runtime FI at every call\n")
    print(table(rows))
    print("\ncompilations (isolate=off), name: count, seconds")
    for r in rows:
      top = ", ".join(f"{k} {n}x {s:.1f}s" for k, (n, s) in
                      list(r["compilations"]["by_name"].items())[:8])
      print(f"  {r['scenario']}: {top}")
    if _JSON.value:
      with open(_JSON.value, "w") as f:
        json.dump({"commit": commit, "steps": _STEPS.value,
                   "checkpoint_every": _EVERY.value, "rows": rows}, f,
                  indent=1)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  app.run(main)
