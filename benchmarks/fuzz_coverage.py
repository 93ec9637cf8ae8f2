"""What a fuzz budget covers: per family, the lattice's classes reached.

Usage::

  python benchmarks/fuzz_coverage.py [--budget_seconds=120] \
      [--workdir=/tmp/peat_fuzz_coverage] [--out=benchmarks/out/fuzz] \
      [--tag=after]

For each (scenario, correct KUT) of ``--runs`` (default: GPT's matmul,
softmax and layer norm, the CNN's convolution, llama's RMSNorm and RoPE,
each the native kernel's ``default`` variant) a golden profile captures
the KUT's forward sites at step 0 (not timed); ``peat.fuzz`` then runs
with ``budget_seconds`` as ``--fuzz_budget=120s`` does. From the plan
(``peat_jax.profiler.fuzz.targets``) and what ran, per family:

* variants run / planned;
* **residue classes**: ``(axis, length mod 128)`` of every ``<axis>=<n>``
  a variant's name sets, reached / planned, over the KUT's sites;
* **magnitude bands**: ``(axis, band)``, the bands cut at 8, 128, 1,024,
  4,096, 32,768 and 65,536, reached / planned; and which of the large
  bands (past 1,024, 4,096, 32,768, 65,536) any axis reached;
* **element-count residues**: of the variants run, the residues of the
  first input's element count modulo 8, 16, 32 and 128 (of 8, 16, 32,
  128 possible).

The counts are ``peat.fuzz``'s own
(``FuzzResult.coverage``, ``peat_jax.profiler.fuzz.coverage``),
computed here from the plan and the records alone: they read only what
every fuzz writes (variant names, families, shapes), so the same script
with that module beside it measures a commit before a change. Nothing else
may run on the machine while it runs (the budget is wall time).
"""

import json
import os
import shutil
import time

from absl import app
from absl import flags

import peat_jax as peat
from peat_jax import models
from peat_jax.profiler.fuzz import coverage as fuzz_coverage
from peat_jax.profiler.fuzz import shape_key
from peat_jax.profiler.fuzz import targets as fuzz_targets

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/peat_fuzz_coverage",
                               "Golden profiles and campaigns.")
_RUNS = flags.DEFINE_list(
    "runs", ["gpt@native:matmul:default", "gpt@native:softmax:default",
             "gpt@native:layer_norm:default", "cnn@native:conv2d:default",
             "llama@native:rms_norm:default", "llama@native:rope:default"],
    "scenario@KUT pairs.")
_BUDGET = flags.DEFINE_float("budget_seconds", 120.0,
                             "Seconds per KUT, as --fuzz_budget=Ns.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/fuzz", "Output folder.")
_TAG = flags.DEFINE_string("tag", "after", "Names the output files.")

def coverage(tgts, ran: list[dict]) -> dict:
  """Per family: variants, residue classes, bands and element residues
  (``peat_jax.profiler.fuzz.coverage``: the same counts a
  ``FuzzResult.coverage`` holds), as JSON."""
  return {name: {"planned": c.planned, "run": c.ran,
                 "residues": list(c.residues), "bands": list(c.bands),
                 "large": list(c.large),
                 "element_residues": dict(c.element_residues)}
          for name, c in fuzz_coverage(tgts, ran).items()}


def _task_dir(scenario: str, kernels: list[str]) -> str:
  task = models.get_task(scenario)
  gdir = os.path.join(_WORKDIR.value, scenario, "golden")
  if not os.path.isdir(os.path.join(gdir, "captures")):
    peat.profile(task, gdir, steps=1, checkpoint_every=1,
                 capture_kernel=kernels, capture_phase="fwd",
                 capture_steps=[0], budget_bytes=1 << 30)
  return gdir


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  runs = [r.split("@", 1) for r in _RUNS.value]
  per_scenario: dict = {}
  for scenario, kut in runs:
    per_scenario.setdefault(scenario, []).append(
        peat.kernels.parse_kut(kut).site_kernel)
  gdirs = {s: _task_dir(s, sorted(set(k))) for s, k in per_scenario.items()}
  rows = []
  for scenario, kut in runs:
    task = models.get_task(scenario)
    spec = peat.kernels.parse_kut(kut)
    camp = os.path.join(_WORKDIR.value, scenario, "c_" + "".join(
        c if c.isalnum() else "_" for c in kut))
    shutil.rmtree(camp, ignore_errors=True)  # a rerun would skip records
    t0 = time.perf_counter()
    r = peat.fuzz(gdirs[scenario], spec, task=task, campaign_dir=camp,
                  budget_seconds=_BUDGET.value, shrink=False)
    wall = time.perf_counter() - t0
    tgts = fuzz_targets(gdirs[scenario], spec, task=task)
    cov = coverage(tgts, list(r.records) + list(r.errors))
    rows.append({"scenario": scenario, "kut": kut, "sites": len(tgts),
                 "site_shapes": len({shape_key(t) for t in tgts}),
                 "planned": r.planned, "ran": r.ran,
                 "verdict": r.verdict.verdict if r.verdict else None,
                 "seconds": round(wall, 1), "families": cov})
    print(json.dumps(rows[-1]), flush=True)
  lines = [f"fuzz coverage at budget_seconds={_BUDGET.value:g} "
           f"({_TAG.value})", "",
           "| scenario | KUT | family | variants run / planned | residue "
           "classes mod 128 | magnitude bands | large bands reached | "
           "element-count residues mod 8 / 16 / 32 / 128 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for row in rows:
    for name, c in sorted(row["families"].items()):
      e = c["element_residues"]
      lines.append(
          f"| {row['scenario']} | `{row['kut']}` | {name} | {c['run']} / "
          f"{c['planned']} | {c['residues'][0]} / {c['residues'][1]} | "
          f"{c['bands'][0]} / {c['bands'][1]} | "
          f"{', '.join(f'>{x}' for x in c['large']) or '-'} | "
          f"{e[8]} / {e[16]} / {e[32]} / {e[128]} |")
  lines.append("")
  for row in rows:
    lines.append(f"{row['scenario']} `{row['kut']}`: {row['sites']} sites "
                 f"({row['site_shapes']} shapes), {row['ran']} of "
                 f"{row['planned']} variants in {row['seconds']} s, "
                 f"verdict {row['verdict']}")
  text = "\n".join(lines)
  print(text)
  base = os.path.join(_OUT.value, f"fuzz_coverage_{_TAG.value}")
  with open(base + ".txt", "w") as f:
    f.write(text + "\n")
  with open(base + ".json", "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  app.run(main)
