"""Trains every scenario on its default budget and prints the model card.

Usage: python benchmarks/bench_models.py [--scenarios=cnn,vit] [--out=DIR]

For each scenario: held-out result, mean train-step time (compilation
excluded) and wall time of the whole run (compilation and checkpoints
included; a finetuning scenario's pretraining is timed separately).
"""

import os
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

import peat_jax as peat
from peat_jax import models

_SCENARIOS = flags.DEFINE_list(
    "scenarios", ["cnn", "vit", "gpt", "cnn_finetune", "vit_finetune",
                  "gpt_finetune"], "Scenarios to train.")
_OUT = flags.DEFINE_string("out", None, "Run directory root (default: tmp).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root = _OUT.value or tempfile.mkdtemp(prefix="peat_bench_models_")
  print(f"cpu_count={os.cpu_count()}  runs in {root}")
  print(f"{'scenario':14s} {'steps':>5s} {'ms/step':>8s} {'wall s':>7s}  result")
  for name in _SCENARIOS.value:
    workdir = os.path.join(root, name)
    t0 = time.perf_counter()
    task = models.prepare_task(name, workdir)
    pre = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = peat.golden_train(task, workdir, resume=False)
    wall = time.perf_counter() - t0
    metrics = "  ".join(f"{k}={v:.4g}" for k, v in result.evaluation.items()
                        if not k.endswith(("examples", "tokens")))
    extra = f"  (pretraining {pre:.0f} s)" if pre > 1 else ""
    print(f"{name:14s} {task.default_steps:5d} "
          f"{result.seconds_per_step * 1e3:8.1f} {wall:7.1f}  {metrics}{extra}",
          flush=True)


if __name__ == "__main__":
  app.run(main)
