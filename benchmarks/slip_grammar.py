"""The slip grammar as its own test, at scale: how often the Detector names
the slip a KUT makes.

Draws ``--n`` cases with ``peat.injectors.draw_slip_cases`` (the same
draw as tests/analyzer/test_slip_grammar.py: a site kind, a shape, a
dtype, fresh seeded values, a slip of the grammar or none: a control),
makes each KUT output with ``peat.injectors.slipped_call`` (an injector
written apart from the Detector's slip search), the golden one with
``peat.injectors.golden_call``, measures the slip's visibility
(``peat.injectors.slip_visibility``: its own float64 effect at least 16x
the golden kernel's RMS error, and 4x at the median element the port
probe reads) and asks the Detector::

  peat.detector.diagnose_call(kind, args, kwargs, t, g)

A visible slip is *named* when the diagnosis's primary model is the
slip's (``indexing``, ``parameter``, ``scale``, ``approximation``,
``precision:<fmt>``, ``accumulation:<fmt>``), or when the slip the
diagnosis names (``params["slip"]``, at ``params["estimate"]``; or the
same precision op in the named format) gives the drawn slip's output:
their float64 outputs differ by less than 16x golden's RMS error, so no
search can tell them apart (``peat.injectors.names_slip``; counted
apart).
Controls (correct ports) should pass.

Prints the options, a Markdown table per category x dtype (drawn,
visible, named among the visible, the verdicts, diagnoses that raised),
the controls flagged (verdict other than pass), the median seconds per
diagnosis (the first of each call shape pays its compilations), then one
line per visible slip not named and per flagged control; one progress
line per case goes to stderr.

Run::

  .venv/bin/python benchmarks/slip_grammar.py [--n=400] [--seed=0] \
      [--dtypes=float32,bfloat16] [--kinds=softmax,layer_norm] \
      [--categories=operand,constant] [--calls=0] [--controls=0.2] \
      [--json=PATH]

``--calls``: how many call shapes the cases share (0: one per kind x
dtype); each shape pays the Detector's compilations once.
"""

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
import traceback

import jax
import numpy as np

import peat_jax as peat


def git_commit() -> str:
  """The checkout's short commit, or ``unknown``."""
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def run_case(i: int, case) -> dict:
  """One case: the KUT, golden, the slip's visibility and the diagnosis."""
  slip = case.slip
  t = peat.injectors.slipped_call(case.kind, slip, case.args, case.kwargs)
  g = peat.injectors.golden_call(case.kind, case.args, case.kwargs)
  vis = None if slip is None else peat.injectors.slip_visibility(
      case.kind, slip, case.args, case.kwargs, golden=g)
  rec = {"case": i, "kind": case.kind, "dtype": case.dtype.name,
         "shapes": [list(np.shape(a)) for a in case.args],
         "category": "control" if slip is None else slip.category,
         "slip": "" if slip is None else slip.name,
         "expected": "" if slip is None else slip.model,
         "value": None if slip is None or slip.category != "constant"
                  else slip.value,
         "visible": bool(vis and vis.visible),
         "rms_ratio": None if vis is None else vis.rms_ratio,
         "median_ratio": None if vis is None else vis.median_ratio}
  t0 = time.perf_counter()
  try:
    diag = peat.detector.diagnose_call(case.kind, case.args, case.kwargs,
                                       t, g)
  except Exception:  # counted, and the run goes on
    rec.update(seconds=time.perf_counter() - t0, model="", verdict="raised",
               named="", error=traceback.format_exc(limit=4),
               evidence="", params={})
    return rec
  rec["seconds"] = time.perf_counter() - t0
  rec.update(model=diag.model, verdict=diag.verdict,
             evidence=" ".join(diag.evidence.split())[:300],
             params={k: v for k, v in dict(diag.params).items()
                     if isinstance(v, (int, float, str, bool))})
  params = dict(diag.params)
  rec["named"] = "" if slip is None else peat.injectors.names_slip(
      case.kind, slip, case.args, case.kwargs, diag.model,
      named=params.get("slip"), estimate=params.get("estimate"))
  return rec


def _pct(k: int, n: int) -> str:
  return f"{k} ({100.0 * k / n:.0f}%)" if n else "0"


def print_report(recs: list[dict]) -> None:
  """The Markdown tables and the lines of the misses."""
  rows = collections.defaultdict(list)
  for r in recs:
    rows[(r["category"], r["dtype"])].append(r)
  print("| category | dtype | drawn | visible | named (of visible) "
        "| by an equivalent slip | fail/warn/pass | raised |")
  print("|---|---|---|---|---|---|---|---|")
  for (cat, dt), rs in sorted(rows.items()):
    vis = [r for r in rs if r["visible"]]
    v = collections.Counter(r["verdict"] for r in rs)
    print(f"| {cat} | {dt} | {len(rs)} | {len(vis)} | "
          f"{_pct(sum(bool(r['named']) for r in vis), len(vis))} | "
          f"{sum(r['named'] == 'equivalent' for r in vis)} | "
          f"{v['fail']}/{v['warn']}/{v['pass']} | {v['raised']} |")
  slips = [r for r in recs if r["category"] != "control"]
  vis = [r for r in slips if r["visible"]]
  controls = [r for r in recs if r["category"] == "control"]
  flagged = [r for r in controls if r["verdict"] != "pass"]
  named = sum(bool(r["named"]) for r in vis)
  print(f"\nVisible slips named: {_pct(named, len(vis))}"
        f" of {len(vis)} visible ({len(slips)} drawn); controls flagged: "
        f"{len(flagged)} of {len(controls)}")
  secs = [r["seconds"] for r in recs]
  if secs:
    print(f"Median seconds per diagnosis: {statistics.median(secs):.2f} "
          f"(max {max(secs):.1f})")
  misses = [r for r in vis if not r["named"]]
  if misses:
    print("\nVisible slips not named:")
  for r in misses:
    print(f"- {r['case']} {r['kind']} {r['dtype']} {r['shapes']}: "
          f"{r['slip']} ({r['expected']}) -> {r['model'] or 'raised'}/"
          f"{r['verdict']}: {r['evidence'][:160]}")
  if flagged:
    print("\nControls flagged:")
  for r in flagged:
    print(f"- {r['case']} {r['kind']} {r['dtype']} {r['shapes']}: "
          f"{r['model'] or 'raised'}/{r['verdict']}: {r['evidence'][:160]}")


def main(argv: list[str] | None = None) -> int:
  """Parses the options, draws and runs the cases, prints the report.

  Args:
    argv: the command-line arguments (default: sys.argv[1:]).

  Returns:
    The exit status (0; 2 on bad options).
  """
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=400, help="cases to draw")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--kinds", default="",
                      help="site kinds (default: all): "
                      + ",".join(peat.injectors.SLIP_KINDS))
  parser.add_argument("--categories", default="",
                      help="slip categories (default: all): "
                      + ",".join(peat.core.SLIP_OPS))
  parser.add_argument("--calls", type=int, default=0,
                      help="call shapes shared by the cases (0: one per "
                      "kind x dtype)")
  parser.add_argument("--controls", type=float, default=0.2,
                      help="share of controls (correct ports)")
  parser.add_argument("--json", default="", help="write all records here")
  args = parser.parse_args(argv)
  kinds = [k for k in args.kinds.split(",") if k] or None
  cats = [c for c in args.categories.split(",") if c] or None
  dtypes = [d for d in args.dtypes.split(",") if d]
  try:
    cases = peat.injectors.draw_slip_cases(
        args.seed, args.n, calls=args.calls or None, kinds=kinds,
        dtypes=dtypes, categories=cats, controls=args.controls)
  except (peat.core.PeatError, TypeError) as e:
    parser.error(str(e))
    return 2
  commit = git_commit()
  print(f"commit {commit}; " + " ".join(f"--{k}={v}"
                                        for k, v in vars(args).items()))
  print(f"jax {jax.__version__} on {jax.default_backend()}\n")
  t0 = time.perf_counter()
  recs = []
  for i, case in enumerate(cases):
    r = run_case(i, case)
    recs.append(r)
    peat.core.release_compiled()
    print(f"[{i + 1}/{len(cases)}] {r['kind']} {r['dtype']} "
          f"{r['slip'] or 'control'}: visible {r['visible']} -> "
          f"{r['model'] or 'raised'}/{r['verdict']} ({r['seconds']:.1f} s)",
          file=sys.stderr, flush=True)
  print_report(recs)
  elapsed = time.perf_counter() - t0
  print(f"\n{len(recs)} cases in {elapsed:.0f} s")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"commit": commit, "options": vars(args),
                 "seconds": round(elapsed, 1), "records": recs}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
