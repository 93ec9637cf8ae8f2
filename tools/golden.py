r"""Golden training of a reference model with Orbax checkpoints.

Usage::

  python -m peat_jax.tools.golden --scenario=cnn --campaign_dir=runs/cnn
  python -m peat_jax.tools.golden --scenario=gpt_finetune --steps=100
  # then the campaign tools on the same directory and task flags
  python -m peat_jax.tools.playback --campaign_dir=runs/cnn --scenario=cnn

The golden run goes to <campaign_dir>/golden (checkpoints, per-step log,
run.json), the campaign layout that peat-profile and peat-validate write and
peat-playback, peat-runtime and peat-scaleout read: pass them the same
--campaign_dir and the same --scenario, --batch_size, --overrides and --seed
(or --task). A finetuning scenario without --init_from first runs (or
resumes) its pretraining scenario in <campaign_dir>/task/pretrain, where the
other tools find it. --task=<module>:<function> trains the user's own task
instead (a function returning a peat.TrainTask, e.g. built by
peat.nnx_task).
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli
from absl import logging

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat

_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None,
    "Campaign directory; the golden run goes to <campaign_dir>/golden "
    "(where peat-playback, peat-runtime and peat-scaleout read it). Default "
    "runs/<scenario or task name>.", flag_values=FLAGS)
_STEPS, _CHECKPOINT_EVERY = _cli.define_golden_steps_flags(
    FLAGS, steps=None, checkpoint_every=None)
_RESUME = flags.DEFINE_bool(
    "resume", True, "Continue from the latest checkpoint in "
    "<campaign_dir>/golden.", flag_values=FLAGS)
_INIT_FROM = flags.DEFINE_string(
    "init_from", None,
    "Finetuning scenarios: an existing golden run of the pretraining "
    "scenario to start from (default: run it in "
    "<campaign_dir>/task/pretrain).", flag_values=FLAGS)
_TASK = _cli.define_task_flags(FLAGS)
_STORE_GOLDEN_STEP = _cli.define_store_golden_step_flag(FLAGS)
_cli.define_renamed_flags(
    FLAGS, workdir=("campaign_dir", "the golden run goes to "
                    "<campaign_dir>/golden"))


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
  try:
    _cli.check_task_flags(_TASK.user, _TASK.scenario, _TASK.batch_size,
                          _TASK.overrides, _INIT_FROM)
    if _TASK.user.value:
      task = _TASK.task("")
      directory = os.path.abspath(_CAMPAIGN_DIR.value or
                                  os.path.join("runs", task.name))
    else:
      directory = os.path.abspath(_CAMPAIGN_DIR.value or
                                  os.path.join("runs", _TASK.scenario.value))
      task = _TASK.task(directory, init_from=_INIT_FROM.value)
    result = peat.golden_train(
        task, os.path.join(directory, peat.profiler.GOLDEN_DIR),
        steps=_STEPS.value, checkpoint_every=_CHECKPOINT_EVERY.value,
        seed=_TASK.seed.value, resume=_RESUME.value, progress=print,
        store_golden_step=_STORE_GOLDEN_STEP.value == "on")
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  metrics = "  ".join(f"{k} {v:.4g}" for k, v in result.evaluation.items())
  print(f"{task.name}: {metrics}  ({result.seconds_per_step * 1e3:.1f} "
        "ms/step)")
  print(f"checkpoints (steps {result.steps}): {result.checkpoint_dir}")
  print(f"per-step log: {result.log_path}")
  stored = peat.profiler.golden.GoldenSteps(result.workdir).nbytes()
  if stored:
    print(f"golden steps (steps {sorted(stored)}): "
          f"{max(stored.values()) / 2**20:.2f} MiB per checkpoint in "
          f"{peat.profiler.golden.golden_step_dir(result.workdir)}")
  print(f"output: {result.workdir}")
  print(f"campaign: {directory}")
  return 0


def run() -> None:
  """Console-script entry point (``peat-golden``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
