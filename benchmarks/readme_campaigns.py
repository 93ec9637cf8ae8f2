"""Complete validation campaigns for the README: four scenarios, two KUTs each.

Usage::

  python benchmarks/readme_campaigns.py [--workdir=/tmp/peat_readme] \
      [--only=cnn,gpt]

Runs :func:`peat_jax.profiler.campaigns._campaign.validate` (golden run, playback FI, runtime
FI, verdict, report) for native kernel variants on

* vision pretraining: ``cnn`` (conv2d ``in_bf16`` and ``tile_edge_bug@12``);
* vision finetuning: ``cnn_finetune`` from a ``cnn_04`` golden run (conv2d
  ``acc_bf16``, matmul ``in_tf32``);
* language pretraining: ``gpt`` (matmul ``in_bf16``, softmax ``fast_exp``);
* language finetuning: ``gpt_finetune`` from the ``gpt`` campaign's golden
  run (layer norm ``naive_var``, matmul ``rtz``);

with fewer steps than the scenarios' defaults, and prints one markdown
table: scenario, KUT, verdict, top diagnoses, localization, playback loss
effect, runtime divergence, report path. The second KUT of a scenario starts
from a copy of the first one's golden run (same task, seed and steps: the
same run), so each golden run trains once. Everything runs in one process,
so the analyzer compiles once per record shape; on 2 cores most of the
time goes to those compilations and to runtime FI with the (slow,
single-threaded) native kernels.
"""

import json
import os
import shutil
import sys
import time

from absl import app
from absl import flags
from absl import logging

import peat_jax as peat
from peat_jax import models

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/peat_readme_campaigns",
                               "Directory of the campaigns (reused: finished "
                               "parts are skipped).")
_ONLY = flags.DEFINE_list("only", [], "Scenarios to run (default: all).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Print campaign progress.")

# (label, scenario, pretraining (scenario, steps, checkpoint_every) or None,
#  golden steps, checkpoint_every, runtime steps, KUTs)
CAMPAIGNS = (
    ("vision pretraining", "cnn", None, 80, 20, 60,
     ("native:conv2d:in_bf16", "native:conv2d:tile_edge_bug@12")),
    ("vision finetuning", "cnn_finetune", ("cnn_04", 80, 20), 60, 20, 60,
     ("native:conv2d:acc_bf16", "native:matmul:in_tf32")),
    ("language pretraining", "gpt", None, 60, 20, 30,
     ("native:matmul:in_bf16", "native:softmax:fast_exp")),
    ("language finetuning", "gpt_finetune", ("gpt", 60, 20), 40, 20, 30,
     ("native:layer_norm:naive_var", "native:matmul:rtz")),
)
FREQUENCIES = ("every", "every_4", "fraction_0.25")


def _short(site: str) -> str:
  """Drops the model's top module from a site name (``fwd/Cnn/Conv/...``)."""
  parts = site.split("/")
  return "/".join(parts[:1] + parts[2:]) if len(parts) > 2 else site


def _row(label: str, kut: str, report: dict, html: str) -> str:
  """One markdown table row of a campaign's report data."""
  worst = {"fail": 0, "warn": 1, "pass": 2}
  groups: dict = {}  # error model -> its sites, most severe first
  for s in sorted(report["sites"], key=lambda s: (worst[s["verdict"]],
                                                  -s["confidence"])):
    groups.setdefault(s["model"], []).append(s)
  top = []
  for model, sites in list(groups.items())[:2]:
    more = f" (+{len(sites) - 1} more)" if len(sites) > 1 else ""
    top.append(f"`{model}` @ {_short(sites[0]['site'])} "
               f"({sites[0]['confidence']:.2f}){more}")
  loc = report.get("localization")
  loc_s = (f"{_short(loc['site'])}, step {loc['step']}" if loc else "none")
  pb = report["playback"]
  dl = max(abs(a - b) for a, b in zip(pb["loss_kut"], pb["loss_golden"]))
  up = max(pb["update_rel_diff"])
  runs = report.get("runtime") or []
  div = [f"{r['frequency']}: step {r['diverged_at']}" for r in runs
         if r["diverged_at"] is not None]
  rt = "; ".join(div) if div else f"none ({len(runs)} frequencies)"
  return (f"| {label} | `{kut}` | **{report['verdict']['verdict']}** | "
          f"{'; '.join(top)} | {loc_s} | {dl:.2g} (update {up:.2g}) | "
          f"{rt} | {html} |")


def _pretrain(root: str, goldens: dict, scenario: str, steps: int,
              every: int) -> str:
  """A golden run of ``scenario`` to finetune from (reused when trained)."""
  if (scenario, steps, every) in goldens:
    return goldens[scenario, steps, every]
  task = models.get_task(scenario)
  g = peat.golden_train(task, os.path.join(root, f"pretrain_{scenario}"),
                        steps=steps, checkpoint_every=every, evaluate=False)
  return g.workdir


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root = os.path.abspath(_WORKDIR.value)
  os.makedirs(root, exist_ok=True)
  say = print if _VERBOSE.value else None
  rows = []
  t_all = time.perf_counter()
  goldens = {}  # (scenario, steps, checkpoint_every) -> golden workdir
  for label, scen, pre, steps, every, rsteps, kuts in CAMPAIGNS:
    if _ONLY.value and scen not in _ONLY.value:
      continue
    init_from = _pretrain(root, goldens, *pre) if pre else None
    task = models.get_task(scen, init_from=init_from)
    for kut in kuts:
      t0 = time.perf_counter()
      d = os.path.join(root, f"{scen}__{kut.replace(':', '_')}")
      first = goldens.get((scen, steps, every))
      if first and not os.path.exists(os.path.join(d, "golden")):
        shutil.copytree(first, os.path.join(d, "golden"))
      paths = peat.validate(
          task, kut, d, steps=steps, checkpoint_every=every,
          frequencies=FREQUENCIES, runtime_steps=rsteps, scenario=label,
          progress=say)
      goldens.setdefault((scen, steps, every), os.path.join(d, "golden"))
      with open(paths.json) as f:
        report = json.load(f)
      rows.append(_row(label, kut, report, paths.html))
      print(f"{label} / {kut}: {paths.verdict} "
            f"({time.perf_counter() - t0:.0f} s)", flush=True)
  table = "\n".join([
      "| scenario | KUT | verdict | top diagnoses (model @ site, confidence)"
      " | localization | playback max abs loss change (update rel. diff) | "
      "runtime FI divergence | report |",
      "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows])
  with open(os.path.join(root, "readme_table.md"), "w") as f:
    f.write(table + "\n")
  print(table)
  print(f"total {time.perf_counter() - t_all:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))
