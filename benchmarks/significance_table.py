"""Training-level significance of finished campaigns, as markdown tables.

Usage::

  python benchmarks/significance_table.py runs/sig_gpt_in_bf16 \
      runs/sig_gpt_default [--layers=8]

Reads each campaign's ``report.json`` (written by ``peat.validate`` /
``python -m peat_jax.tools.validate``) and prints

* one row per runtime FI run: the KUT's weight distance to the golden
  trajectory at the last saved step, Wasserstein-1 and relative L2, in
  units of the bf16 proxy and of the seed-to-seed distance, and the
  verdict;
* per campaign, the ``--layers`` layers the every-call run moves most
  against the bf16 proxy, with both ratios of both metrics.

Nothing is recomputed: the numbers are the report's.
"""

import json
import os
import sys


def _fmt(v) -> str:
  return "n/a" if v is None else f"{v:.3g}"


def _last(block, key, metric):
  vals = (block.get(key) or {}).get(metric) or [None]
  return vals[-1]


def tables(dirs, layers: int = 8) -> str:
  """The markdown of the campaigns in ``dirs``."""
  out = ["| scenario | KUT | frequency | step | W1 / bf16 | W1 / seed | "
         "rel. L2 / bf16 | rel. L2 / seed | verdict |",
         "|---|---|---|---|---|---|---|---|---|"]
  per_layer = []
  for d in dirs:
    with open(os.path.join(d, "report.json"), encoding="utf-8") as f:
      data = json.load(f)
    for run in data.get("runtime") or []:
      sig = run.get("significance")
      if not sig:
        continue
      t = sig["total"]
      out.append(
          f"| {data['scenario']} | `{data['kut']}` | {run['frequency']} | "
          f"{sig['step']} | {_fmt(_last(t, 'vs_bf16', 'w1'))} | "
          f"{_fmt(_last(t, 'vs_seed', 'w1'))} | "
          f"{_fmt(_last(t, 'vs_bf16', 'rel_l2'))} | "
          f"{_fmt(_last(t, 'vs_seed', 'rel_l2'))} | "
          f"{data['verdict']['verdict']} |")
    every = next((r for r in data.get("runtime") or []
                  if r.get("significance")), None)
    if every is None:
      continue
    sig = every["significance"]
    ranked = sorted(sig["layers"], key=lambda l: -(
        _last(l, "vs_bf16", "w1") or 0.0))
    per_layer += [
        "", f"{data['scenario']}, `{data['kut']}`, {every['frequency']}, "
        f"step {sig['step']}: the {min(layers, len(ranked))} of "
        f"{len(ranked)} layers moved most against the bf16 proxy",
        "", "| layer | W1 / bf16 | W1 / seed | rel. L2 / bf16 | "
        "rel. L2 / seed |", "|---|---|---|---|---|"]
    per_layer += [
        f"| `{l['layer']}` | {_fmt(_last(l, 'vs_bf16', 'w1'))} | "
        f"{_fmt(_last(l, 'vs_seed', 'w1'))} | "
        f"{_fmt(_last(l, 'vs_bf16', 'rel_l2'))} | "
        f"{_fmt(_last(l, 'vs_seed', 'rel_l2'))} |" for l in ranked[:layers]]
  return "\n".join(out + per_layer)


def parse_args(argv, options: dict) -> tuple[dict, list] | None:
  """``--key=value`` options (defaults in ``options``, typed alike) and the
  campaign directories; None (after the error line) when there is none or
  one has no report.json."""
  opts, dirs = dict(options), []
  for a in argv[1:]:
    key, eq, val = a[2:].partition("=")
    if a.startswith("--") and eq and key in opts:
      opts[key] = type(options[key])(val) if options[key] is not None else val
    else:
      dirs.append(a)
  if not dirs:
    print("error: give campaign directories, e.g. runs/sig_gpt_in_bf16",
          file=sys.stderr)
    return None
  missing = [d for d in dirs if not os.path.exists(
      os.path.join(d, "report.json"))]
  if missing:
    print(f"error: no report.json in {', '.join(missing)}; run "
          "python -m peat_jax.tools.validate there first", file=sys.stderr)
    return None
  return opts, dirs


def main(argv) -> int:
  parsed = parse_args(argv, {"layers": 8})
  if parsed is None:
    return 2
  opts, dirs = parsed
  print(tables(dirs, opts["layers"]))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
