"""MiniLM: port agreement table, finetuning result and a validation campaign.

Usage: python benchmarks/bench_minilm.py [--parts=agreement,golden,campaign]
         [--kut=native:softmax:in_bf16] [--steps=80] [--checkpoint_every=20]
         [--out=DIR]

* ``agreement``: layer-by-layer max and RMS relative error of the JAX port
  (float32) and of the torch module (float32) against the torch module in
  float64, on real sentences of the Python manual (the task's test split),
  with the peat_jax diagnosis of torch vs JAX per activation; and the
  paraphrase similarity check (needs torch).
* ``gradients``: the finetuning classifier (pretrained encoder, fresh head)
  through ``bridges.compare.compare_port`` on one batch of 4 x 24 tokens:
  activations, activation gradients and parameter gradients of torch float32
  vs JAX float32, JAX float64 as the reference (slow: one analyzer
  compilation per distinct shape).
* ``golden``: golden finetuning of ``minilm_finetune`` (Orbax checkpoints)
  with the test accuracy and loss before and after and the mean train-step
  time (compilation excluded). Written to ``<out>/campaign/golden``, so the
  ``campaign`` part resumes it instead of training again.
* ``campaign``: ``peat.validate`` of ``--kut`` on the task: playback FI at
  every checkpoint, runtime FI at three frequencies, verdict and report.
"""

import os
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

import peat_jax as peat
from peat_jax.models import minilm
from peat_jax.models import minilm_task

_PARTS = flags.DEFINE_list("parts", ["agreement", "golden", "campaign"],
                           "What to run: agreement, gradients, golden, "
                           "campaign.")
_KUT = flags.DEFINE_string("kut", "native:softmax:in_bf16",
                           "KUT spec of the campaign.")
_STEPS = flags.DEFINE_integer("steps", None, "Golden steps (task default).")
_EVERY = flags.DEFINE_integer("checkpoint_every", None,
                              "Checkpoint interval (task default).")
_SENTENCES = flags.DEFINE_integer("sentences", 16,
                                  "Test sentences of the agreement table.")
_SIGNATURES = flags.DEFINE_bool(
    "signatures", True, "gradients: also analyze and diagnose every row.")
_OUT = flags.DEFINE_string("out", None, "Output root (default: tmp).")


def agreement():
  """Prints the per-layer agreement table and the similarity check."""
  from peat_jax.bridges import torch_minilm  # pylint: disable=g-import-not-at-top

  _, test = minilm_task.manual_topics()
  texts = list(test.texts[::max(1, len(test.texts) // _SENTENCES.value)])
  texts = texts[:_SENTENCES.value]
  t0 = time.perf_counter()
  rows = torch_minilm.compare_layers(texts, length=64, diagnose=True)
  print(f"agreement on {len(texts)} test sentences, 64 tokens "
        f"({time.perf_counter() - t0:.1f} s):")
  print(torch_minilm.format_table(rows))
  sim = minilm.similarity_check(minilm.load_model())
  print("paraphrase cosine:", [round(float(x), 3) for x in sim.paraphrase])
  print("unrelated cosine: ", [round(float(x), 3) for x in sim.unrelated])


def gradients():
  """Prints the bridges.compare tables of the classifier on one batch."""
  from peat_jax.bridges import compare  # pylint: disable=g-import-not-at-top
  from peat_jax.bridges import torch_minilm  # pylint: disable=g-import-not-at-top

  task = minilm_task.get_task(batch_size=4, length=24)
  port = torch_minilm.build_port(task)
  t0 = time.perf_counter()
  result = compare.compare_port(port, task.init_state(0).params,
                                task.batch_at(0),
                                signatures=_SIGNATURES.value)
  print(f"compare_port: {len(port.points)} points "
        f"({time.perf_counter() - t0:.0f} s); loss {result.loss}")
  print(result.table("activation"))
  print(result.table("gradient"))
  grads = [r for r in result.rows if r["what"] == "param_grad"]
  models = sorted({str(r["model"]) for r in grads})
  print(f"parameter gradients: {len(grads)}, diagnoses {models}, max "
        f"torch_ref_rms_rel {max(r['torch_ref_rms_rel'] for r in grads):.3g}")
  print("first divergent:", {k: (v["name"] if v else None)
                             for k, v in result.first_divergent.items()})


def golden(task, workdir):
  """Golden finetuning with evaluation before and after."""
  before = task.evaluate(task.init_state(0))
  t0 = time.perf_counter()
  result = peat.golden_train(task, workdir, steps=_STEPS.value,
                             checkpoint_every=_EVERY.value)
  wall = time.perf_counter() - t0
  fmt = lambda m: (f"test_accuracy {m['test_accuracy']:.4f}  "
                   f"test_loss {m['test_loss']:.4f}")
  print(f"before finetuning: {fmt(before)}")
  print(f"after {result.steps[-1]} steps:  {fmt(result.evaluation)}")
  print(f"train loss {result.log['loss'][0]:.4f} -> "
        f"{result.log['loss'][-1]:.4f}; "
        f"{result.seconds_per_step * 1e3:.0f} ms/step, {wall:.0f} s wall "
        f"(checkpoints and compilation included); checkpoints "
        f"{result.steps} in {result.checkpoint_dir}")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  root = _OUT.value or tempfile.mkdtemp(prefix="peat_bench_minilm_")
  print(f"cpu_count={os.cpu_count()}  output in {root}")
  if "agreement" in _PARTS.value:
    agreement()
  if "gradients" in _PARTS.value:
    gradients()
  task = minilm_task.get_task()
  campaign_dir = os.path.join(os.path.abspath(root), "campaign")
  if "golden" in _PARTS.value:
    golden(task, os.path.join(campaign_dir, "golden"))
  if "campaign" in _PARTS.value:
    t0 = time.perf_counter()
    paths = peat.validate(task, _KUT.value, campaign_dir, steps=_STEPS.value,
                          checkpoint_every=_EVERY.value)
    print(f"campaign {_KUT.value}: verdict {paths.verdict} "
          f"({time.perf_counter() - t0:.0f} s); report {paths.html}")


if __name__ == "__main__":
  app.run(main)
