"""What fuzzing from real inputs costs, per site and per campaign, on GPT.

Usage::

  python benchmarks/bench_fuzz.py [--workdir=/tmp/peat_bench_fuzz] \
      [--kuts=native:matmul:default,native:softmax:default,...] \
      [--budget=0] [--out=benchmarks/out/fuzz]

On the GPT scenario (``--scenario``; its default configuration: batch 16,
context 64, two blocks; ``llama`` for a bf16 model) a golden profile
captures every forward site of each KUT's kernel at step 0 (the capture
is not timed). Then, in one process and one run,
for each correct KUT (a reordering-only native variant, or the model's own
attention function as its own KUT):

* the baseline: a golden train step (jitted, warm; median of 7) and the
  op-level playback of the same sites at their training shapes
  (``peat.playback_ops``: the same Analyzer and Detector on the captured
  call);
* ``peat.fuzz`` over the variants of every site (``--budget`` caps the
  variants per KUT, ``--budget_seconds`` its seconds as
  ``--fuzz_budget=Ns`` does; 0: all): the wall time, per site, per
  variant, the verdict, the variants planned per site and the families
  the budget covered of those planned.

Prints a table and writes it with the details (per variant: seconds,
family, model, verdict) as JSON to ``--out``. Nothing else may run on the
machine while it runs.
"""

import json
import os
import shutil
import statistics
import time

from absl import app
from absl import flags
import jax

import peat_jax as peat
from peat_jax import models
from peat_jax.profiler.fuzz import targets as fuzz_targets

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/peat_bench_fuzz",
                               "Golden profile and campaigns.")
_KUTS = flags.DEFINE_list(
    "kuts", ["native:matmul:default", "native:softmax:default",
             "native:layer_norm:default",
             "py:peat_jax.models.layers:attention@attention"],
    "Correct KUTs (spec, or spec@kernel for a py: one).")
_BUDGET = flags.DEFINE_integer("budget", 0, "Variants per KUT (0: all).")
_BUDGET_SECONDS = flags.DEFINE_float(
    "budget_seconds", 0.0, "Seconds per KUT, as --fuzz_budget=Ns (0: none).")
_SCENARIO = flags.DEFINE_string("scenario", "gpt", "The model scenario "
                                "(its default configuration).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/fuzz", "Output folder.")


def _spec(text: str):
  if text.startswith("py:") and "@" in text:
    body, kernel = text.rsplit("@", 1)
    return peat.kernels.parse_kut(body, kernel=kernel)
  return peat.kernels.parse_kut(text)


def _step_seconds(task) -> float:
  state = peat.restore_state(os.path.join(
      _WORKDIR.value, _SCENARIO.value, "golden", peat.profiler.GOLDEN_DIR),
      task, 0)
  batch = task.batch_at(0)
  step = jax.jit(task.step_fn)
  jax.block_until_ready(step(state, batch))
  times = []
  for _ in range(7):
    t0 = time.perf_counter()
    jax.block_until_ready(step(state, batch))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  task = models.get_task(_SCENARIO.value)
  specs = [_spec(k) for k in _KUTS.value]
  gdir = os.path.join(_WORKDIR.value, _SCENARIO.value, "golden")
  peat.profile(task, gdir, steps=2, checkpoint_every=1,
               capture_kernel=sorted({s.site_kernel for s in specs}),
               capture_phase="fwd", capture_steps=[0],
               budget_bytes=1 << 30)
  step_s = _step_seconds(task)
  rows, detail = [], {}
  for spec in specs:
    camp = os.path.join(_WORKDIR.value, _SCENARIO.value, "c_" + "".join(
        c if c.isalnum() else "_" for c in spec.spec))
    shutil.rmtree(camp, ignore_errors=True)  # a rerun would skip records
    t0 = time.perf_counter()
    ops = peat.playback_ops(gdir, spec, campaign_dir=camp)
    ops_s = time.perf_counter() - t0
    lines = []

    def say(line, lines=lines):
      lines.append((time.perf_counter(), line))
    t0 = time.perf_counter()
    r = peat.fuzz(gdir, spec, task=task, campaign_dir=camp, progress=say,
                  budget_cases=_BUDGET.value or None,
                  budget_seconds=_BUDGET_SECONDS.value or None)
    fuzz_s = time.perf_counter() - t0
    tgts = fuzz_targets(gdir, spec, task=task)
    planned_fams = sorted({p.family for t in tgts for p in t.plans})
    run_fams = sorted({x["family"] for x in r.records})
    per = []
    last = t0
    for t, line in lines:
      per.append(t - last)
      last = t
    sites = len(ops.sites)
    shapes_new = [d for d, (_, line) in zip(per, lines) if d > 0.5]
    rows.append({
        "kut": spec.spec, "sites": sites, "variants": r.ran,
        "planned": r.planned, "planned_per_site": [len(t.plans)
                                                   for t in tgts],
        "families_planned": planned_fams, "families_run": run_fams,
        "families_missed": sorted(set(planned_fams) - set(run_fams)),
        "skipped": len(r.skipped), "verdict": r.verdict.verdict
        if r.verdict else None, "summary": r.summary,
        "fuzz_s": round(fuzz_s, 1), "per_site_s": round(fuzz_s / sites, 1),
        "per_variant_s": round(fuzz_s / max(r.ran, 1), 3),
        "variants_over_0.5s": len(shapes_new),
        "ops_s": round(ops_s, 2), "fuzz_over_ops": round(fuzz_s / ops_s, 1),
        "fuzz_over_step": round(fuzz_s / step_s, 0),
        "max_noise_ratio_pass": round(max(
            [x["signature"].get("noise_ratio", 0.0) for x in r.records
             if x["diagnosis"]["verdict"] == "pass"] or [0.0]), 2)})
    detail[spec.spec] = [{"variant": x["variant"], "site": x["site"],
                          "family": x["family"],
                          "model": x["diagnosis"]["model"],
                          "verdict": x["diagnosis"]["verdict"]}
                         for x in r.records]
    print(f"{spec.spec}: {rows[-1]}", flush=True)
  head = ("| KUT (correct) | sites | variants planned per site | variants "
          "run | families run / planned | fuzz verdict | largest "
          "noise ratio passed | fuzz wall | per site | per variant | "
          "op-level playback of the training shapes | fuzz / that | fuzz / "
          "golden step |")
  out = [f"{_SCENARIO.value}:", "", head,
         "| " + " | ".join(["---"] * 13) + " |"]
  for r in rows:
    per = r["planned_per_site"]
    out.append(f"| `{r['kut']}` | {r['sites']} | {min(per)}-{max(per)} | "
               f"{r['variants']} | {len(r['families_run'])} / "
               f"{len(r['families_planned'])}"
               + (f" (missed: {', '.join(r['families_missed'])})"
                  if r["families_missed"] else "") + " | "
               f"{r['verdict']} | {r['max_noise_ratio_pass']} | "
               f"{r['fuzz_s']} s | {r['per_site_s']} s | "
               f"{r['per_variant_s']} s | {r['ops_s']} s | "
               f"{r['fuzz_over_ops']}x | {r['fuzz_over_step']:.0f}x |")
  total = sum(r["fuzz_s"] for r in rows)
  out.append("")
  out.append(f"golden train step ({_SCENARIO.value}, warm, median of 7): "
             f"{step_s * 1e3:.1f} ms; all KUTs' fuzz: {total:.0f} s "
             f"({sum(r['variants'] for r in rows)} variants, "
             f"{sum(r['sites'] for r in rows)} sites)")
  text = "\n".join(out)
  print(text)
  name = f"bench_fuzz_{_SCENARIO.value}"
  with open(os.path.join(_OUT.value, name + ".txt"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(_OUT.value, name + ".json"), "w") as f:
    json.dump({"rows": rows, "step_s": step_s, "detail": detail}, f,
              indent=1)


if __name__ == "__main__":
  app.run(main)
