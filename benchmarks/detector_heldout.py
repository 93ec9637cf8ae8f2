"""The Detector on its held-out split: errors and inputs nobody tuned on.

Runs the second, independent calibration generator
(peat_jax/detector/_heldout.py: its own inputs, benign bases and faults)
through the Detector and prints Markdown tables of top-1 name accuracy and
verdict accuracy per fault family, base, dtype and kernel, the false alarms
(a benign base alone -> fail) and misses (a fault -> pass), then one line
per wrong case.

  .venv/bin/python benchmarks/detector_heldout.py --seeds=0
  .venv/bin/python benchmarks/detector_heldout.py --seeds=0,1 --path=probe \\
      --dtypes=float32,bfloat16 --json=/tmp/heldout.json

``--path=output`` diagnoses through ``peat.analyze`` and ``peat.detect``;
``--path=probe`` through the playback path (triage, decomposition and the
port probe on the case's inputs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import peat_jax.detector

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _heldout():
  """The held-out generator (the detector facade)."""
  return peat_jax.detector


def git_commit() -> str:
  """The commit of the working tree (``+dirty`` with local changes)."""
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                           check=True, capture_output=True,
                           text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown (not a git checkout)"
  return head + ("+dirty" if dirty else "")


def parse_args(argv=None) -> argparse.Namespace:
  """The command line."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seeds", default="0",
                 help="comma-separated seeds of the inputs (default 0)")
  p.add_argument("--path", default="output", choices=("output", "probe"),
                 help="output: peat.analyze + peat.detect; probe: playback's "
                 "diagnosis with the port probe")
  p.add_argument("--dtypes", default="float32,bfloat16",
                 help="comma-separated golden dtypes")
  p.add_argument("--json", default="",
                 help="write the records and the commit to this file")
  p.add_argument("--quiet", action="store_true",
                 help="no progress lines on stderr")
  return p.parse_args(argv)


def wrong_lines(heldout, result) -> list[str]:
  """One line per case with a wrong name or verdict."""
  return [f"{r.dtype} {r.kernel} {r.source} base={r.base} "
          f"{r.error.split(':')[0]}: {r.expected} -> {r.predicted} "
          f"({r.verdict}) {r.evidence[:120]}"
          for r in heldout.wrong_records(result)]


def write_json(path: str, commit: str, args: argparse.Namespace, result,
               seconds: float) -> None:
  """The records, the run's options and its commit as JSON."""
  out = {"commit": commit, "seeds": args.seeds, "path": args.path,
         "dtypes": args.dtypes, "seconds": round(seconds, 1),
         "records": [r._asdict() for r in result.records]}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)


def main(argv=None) -> int:
  """Runs the held-out split and prints its tables."""
  args = parse_args(argv)
  heldout = _heldout()
  seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
  dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
  commit = git_commit()
  print(f"commit {commit}; seeds {seeds}; path {args.path}; dtypes "
        f"{', '.join(dtypes)}")
  progress = None if args.quiet else (
      lambda line: print(line, file=sys.stderr, flush=True))
  start = time.perf_counter()
  result = heldout.run_heldout(seeds, args.path, dtypes, progress)
  seconds = time.perf_counter() - start
  print()
  print(heldout.heldout_tables(result))
  wrong = wrong_lines(heldout, result)
  print(f"\n### wrong cases ({len(wrong)} of {len(result.records)})\n")
  print("\n".join(wrong) if wrong else "none")
  print(f"\n{len(result.records)} records in {seconds:.1f} s")
  if args.json:
    write_json(args.json, commit, args, result, seconds)
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
