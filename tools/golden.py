r"""Golden training of a reference model with Orbax checkpoints.

Usage::

  python -m peat_jax.tools.golden --scenario=cnn --workdir=runs/cnn
  python -m peat_jax.tools.golden --scenario=gpt_finetune --steps=100

A finetuning scenario without ``--init_from`` first runs (or resumes) its
pretraining scenario in ``<workdir>/pretrain``. ``--task=<module>:<function>``
trains the user's own task instead (a function returning a peat.TrainTask,
e.g. built by peat.nnx_task).
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli
from absl import logging

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat
from peat_jax import models

_SCENARIO = flags.DEFINE_string(
    "scenario", models.DEFAULT_SCENARIO,
    f"Training scenario, one of {models.scenario_names()}.", flag_values=FLAGS)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory; default runs/<scenario>.", flag_values=FLAGS)
_STEPS = flags.DEFINE_integer(
    "steps", None, "Optimizer steps; default: the scenario's budget.", flag_values=FLAGS)
_CHECKPOINT_EVERY = flags.DEFINE_integer(
    "checkpoint_every", None, "Checkpoint interval in steps.", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of parameters, RNG and data.", flag_values=FLAGS)
_RESUME = flags.DEFINE_bool(
    "resume", True, "Continue from the latest checkpoint in --workdir.", flag_values=FLAGS)
_INIT_FROM = flags.DEFINE_string(
    "init_from", None,
    "Finetuning scenarios: a golden run of the pretraining scenario.", flag_values=FLAGS)
_TASK = _cli.define_task_flag(FLAGS)


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  try:
    _cli.check_task_flags(_TASK, _SCENARIO, _INIT_FROM)
    if _TASK.value:
      task = _cli.user_task(_TASK.value).build()
      workdir = os.path.abspath(_WORKDIR.value or
                                os.path.join("runs", task.name))
    else:
      workdir = os.path.abspath(_WORKDIR.value or
                                os.path.join("runs", _SCENARIO.value))
      task = models.prepare_task(_SCENARIO.value, workdir, seed=_SEED.value,
                                 init_from=_INIT_FROM.value, progress=print)
    result = peat.golden_train(
        task, workdir, steps=_STEPS.value,
        checkpoint_every=_CHECKPOINT_EVERY.value, seed=_SEED.value,
        resume=_RESUME.value, progress=print)
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  metrics = "  ".join(f"{k} {v:.4g}" for k, v in result.evaluation.items())
  print(f"{task.name}: {metrics}  ({result.seconds_per_step * 1e3:.1f} "
        "ms/step)")
  print(f"checkpoints (steps {result.steps}): {result.checkpoint_dir}")
  print(f"per-step log: {result.log_path}")
  print(f"output: {result.workdir}")
  return 0


def run() -> None:
  """Console-script entry point (``peat-golden``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
