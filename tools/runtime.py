r"""Runtime FI: train with a kernel under test at several frequencies.

Usage::

  python -m peat_jax.tools.runtime --campaign_dir=runs/profile_cnn \
      --kut=native:conv2d:in_bf16 --frequencies=every,every_4,fraction_0.25
  python -m peat_jax.tools.runtime --campaign_dir=runs/c1 \
      --kut=native:matmul:acc_bf16 --start_step=20 --runtime_steps=30

From the golden checkpoint --start_step of <campaign_dir>/golden, trains
--runtime_steps steps once per frequency with the KUT at the selected
sites:

  every          every call of every selected site
  every_<n>      every call on steps where step % n == 0, golden otherwise
  fraction_<p>   a seeded random share p of the calls (seed 0)

With --backward=kut the KUT's VJP runs at the backward sites of the
selected forward sites too (same schedule). Errors persist and propagate,
unlike playback FI. Each run's loss is
compared with the golden trajectory retrained from the same state; the
golden seed-to-seed spread (fresh runs with --seeds) sets the divergence
threshold: a run diverges at the first step whose loss is NaN/Inf, above
10x golden, or beyond 3x the spread envelope for 5 consecutive steps.
Results go to <campaign_dir>/runtime.msgpack (finished frequencies are
skipped when run again); the end prints a table per frequency. The golden
run must exist (peat-golden, peat-profile or peat-validate made it) and
--scenario, --batch_size, --overrides and --seed must match it.
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat

_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None, "Campaign directory holding golden/. Required.",
    flag_values=FLAGS)
_KUT = _cli.define_kut_flags(FLAGS)
_FREQUENCIES = flags.DEFINE_list(
    "frequencies", ["every", "every_4", "fraction_0.25"],
    "Frequencies: every, every_<n>, fraction_<p>.", flag_values=FLAGS)
_RUNTIME_STEPS = flags.DEFINE_integer(
    "runtime_steps", 40, "Runtime FI steps per frequency.",
    flag_values=FLAGS)
_START = flags.DEFINE_integer(
    "start_step", 0, "Saved golden checkpoint step to start from.",
    flag_values=FLAGS)
_SEEDS = flags.DEFINE_list(
    "seeds", ["1", "2"], "Golden seeds of the seed-to-seed spread.",
    flag_values=FLAGS)
_SELECT = flags.DEFINE_string(
    "select", None, "fnmatch pattern narrowing the KUT's sites.",
    flag_values=FLAGS)
_BACKWARD = _cli.define_backward_flag(FLAGS)
_TASK = _cli.define_task_flags(FLAGS)
_cli.define_renamed_flags(
    FLAGS, steps=("runtime_steps", "runtime FI steps per frequency; --steps "
                  "counts golden training steps only (peat-golden, "
                  "peat-profile, peat-validate)"))


def summary(result: peat.RuntimeResult) -> str:
  """Per-frequency table: final losses, largest loss gap, divergence."""
  rows = []
  for r in result.runs:
    gap = max(abs(a - b) for a, b in zip(r["loss"], r["golden_loss"]))
    rows.append((r["frequency"], len(r["loss"]), r["loss"][-1],
                 r["golden_loss"][-1], gap,
                 r["diverged_at"] if r["diverged_at"] is not None else "no",
                 r["reason"] or ""))
  return _cli.table(rows, ("frequency", "steps", "final loss",
                           "golden final", "max |loss - golden|",
                           "diverged at", "reason"))


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  try:
    directory, _ = _cli.campaign_dir_and_checkpoints(_CAMPAIGN_DIR.value,
                                                     None)
    seeds = tuple(int(s) for s in _SEEDS.value)
  except _cli.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except ValueError:
    print(f"error: --seeds must be integers; got {_SEEDS.value}",
          file=sys.stderr)
    return 2
  try:
    kut = _KUT.spec()  # parsed once, before any work
    for f in _FREQUENCIES.value:
      peat.profiler.parse_frequency(f)
    task = _TASK.task(directory)
    with peat.profiler.campaign_lock(directory):
      result = peat.runtime(
          task, os.path.join(directory, peat.profiler.GOLDEN_DIR), kut,
          frequencies=tuple(_FREQUENCIES.value), steps=_RUNTIME_STEPS.value,
          start_step=_START.value, seeds=seeds, campaign_dir=directory,
          select=_SELECT.value, backward=_BACKWARD.value,
          progress=_cli.Eta(len(_FREQUENCIES.value), prefixes=("runtime ",)))
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(summary(result))
  print(f"records: {os.path.join(directory, peat.profiler.RUNTIME_FILE)}")
  return 0


def run() -> None:
  """Console-script entry point (``peat-runtime``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
