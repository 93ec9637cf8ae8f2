r"""Playback FI over many devices and hosts; data-parallel runtime FI.

Usage::

  # one host: checkpoints spread over all its devices
  python -m peat_jax.tools.scaleout --campaign_dir=runs/campaign_cnn \
      --kut=native:conv2d:in_bf16
  # two hosts (run on each, with its own --process_id)
  python -m peat_jax.tools.scaleout --campaign_dir=/shared/campaign_cnn \
      --kut=native:conv2d:in_bf16 --coordinator=host0:12355 \
      --num_processes=2 --process_id=0
  # runtime FI of data-parallel training over this host's devices
  python -m peat_jax.tools.scaleout --mode=runtime \
      --campaign_dir=runs/campaign_cnn --kut=native:matmul:acc_bf16

Playback (default): the checkpoints of <campaign_dir>/golden (all saved but
the last, or --checkpoints) are played on --devices devices of each process;
with --num_processes > 1 every process joins jax.distributed at
--coordinator (process 0's host:port), plays its share into
<campaign_dir>/playback_shards/, and process 0 merges the shards into
<campaign_dir>/playback.msgpack. <campaign_dir> must be one directory shared
by all hosts. Records equal those of peat-playback (--backward=kut: with
the KUT's VJP at the backward sites, as peat-playback --backward=kut);
finished steps are skipped (resume). peat-report turns them into the report.

Runtime (--mode=runtime): data-parallel runtime FI on this process's
devices (batch split over them, KUT on every device's shard), records in
<campaign_dir>/runtime_data_parallel.msgpack.

The golden run must exist (peat-golden, peat-profile or peat-validate made
it) and --scenario, --batch_size, --overrides and --seed must match it.
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat  # pylint: disable=g-import-not-at-top,wrong-import-position
from peat_jax import models  # pylint: disable=g-import-not-at-top,wrong-import-position

_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None, "Campaign directory holding golden/ (shared by all "
    "hosts). Required.", flag_values=FLAGS)
_KUT = _cli.define_kut_flags(FLAGS)
_MODE = flags.DEFINE_enum(
    "mode", "playback", ["playback", "runtime"],
    "playback: playback FI over devices and processes; runtime: "
    "data-parallel runtime FI on this process's devices.", flag_values=FLAGS)
_DEVICES = flags.DEFINE_integer(
    "devices", None, "Local devices to use (the first n); default all.",
    flag_values=FLAGS)
_COORDINATOR = flags.DEFINE_string(
    "coordinator", None, "host:port of process 0's coordinator (needed with "
    "--num_processes > 1); default $JAX_COORDINATOR_ADDRESS.",
    flag_values=FLAGS)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", 1, "Processes (one per host).", flag_values=FLAGS)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", 0, "This process, 0 .. num_processes-1.", flag_values=FLAGS)
_SELECT = flags.DEFINE_string(
    "select", None, "fnmatch pattern narrowing the KUT's sites.",
    flag_values=FLAGS)
_CHECKPOINTS = flags.DEFINE_list(
    "checkpoints", None, "Playback: checkpoint steps to play back, e.g. "
    "0,10; default all saved but the last.", flag_values=FLAGS)
_FREQUENCIES = flags.DEFINE_list(
    "frequencies", ["every", "every_4", "fraction_0.25"],
    "Runtime: every, every_<n>, fraction_<p>.", flag_values=FLAGS)
_RUNTIME_STEPS = flags.DEFINE_integer(
    "runtime_steps", 40, "Runtime: runtime FI steps per frequency.",
    flag_values=FLAGS)
_START_STEP = flags.DEFINE_integer(
    "start_step", 0, "Runtime: golden checkpoint to start from.",
    flag_values=FLAGS)
_BACKWARD = _cli.define_backward_flag(FLAGS)
_TASK = _cli.define_task_flags(FLAGS)
_cli.define_renamed_flags(FLAGS, steps=_cli.CHECKPOINTS_RENAMED)


def _task(directory: str):
  if (_NUM_PROCESSES.value > 1 and not _TASK.user.value
      and models.scenario_config(_TASK.scenario.value).get("pretrain")):
    raise peat.PeatError(
        f"scenario {_TASK.scenario.value!r} finetunes a pretraining checkpoint, "
        "which every process would restore through Orbax's all-process "
        "manager; run its playback with --num_processes=1 (all devices of "
        "one host)")
  return _TASK.task(directory)


def _playback(task, directory: str, steps, kut) -> None:
  me = _PROCESS_ID.value
  tag = f"[process {me}] " if _NUM_PROCESSES.value > 1 else ""

  def say(line: str) -> None:
    print(tag + line, flush=True)

  result = peat.sharded_playback(
      task, os.path.join(directory, peat.profiler.GOLDEN_DIR), kut,
      devices=_DEVICES.value, campaign_dir=directory, steps=steps,
      select=_SELECT.value, progress=say, backward=_BACKWARD.value)
  if me != 0:
    return
  worst = {}
  for r in result.records:
    worst[r["site"]] = max(worst.get(r["site"], "pass"),
                           r["diagnosis"]["verdict"],
                           key=("pass", "warn", "fail").index)
  print(_cli.table([(s, worst.get(s)) for s in result.sites],
                   ("site", "worst verdict")))
  loc = result.localization
  print("localization: " + (f"{loc['site']} at step {loc['step']}" if loc
                            else "none (every site within its noise floor)"))
  if result.seconds_per_step == result.seconds_per_step:  # NaN: < 2 played
    print(f"seconds per checkpoint and device (compilation excluded): "
          f"{result.seconds_per_step:.3g}")
  print(f"records: {os.path.join(directory, peat.profiler.PLAYBACK_FILE)}")


def _runtime(task, directory: str, kut) -> None:
  result = peat.data_parallel_runtime(
      task, os.path.join(directory, peat.profiler.GOLDEN_DIR), kut,
      devices=_DEVICES.value, frequencies=tuple(_FREQUENCIES.value),
      steps=_RUNTIME_STEPS.value, start_step=_START_STEP.value,
      campaign_dir=directory, select=_SELECT.value, progress=print)
  print(_cli.table([(r["frequency"], r["loss"][-1], r["golden_loss"][-1],
                     r["diverged_at"]) for r in result.runs],
                   ("frequency", "final loss", "golden", "diverged at")))
  print(f"records: {os.path.join(directory, peat.profiler.RUNTIME_DP_FILE)}")


def _work(task, directory: str, steps, kut) -> None:
  if _MODE.value == "playback":
    _playback(task, directory, steps, kut)
  else:
    _runtime(task, directory, kut)


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  try:
    directory, steps = _cli.campaign_dir_and_checkpoints(
        _CAMPAIGN_DIR.value, _CHECKPOINTS.value)
  except _cli.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  many = _NUM_PROCESSES.value > 1
  try:
    kut = _KUT.spec()  # parsed once, before any work
    if _MODE.value == "runtime" and _BACKWARD.value != "golden":
      raise peat.PeatError(
          "--mode=runtime (data-parallel runtime FI) runs the KUT at forward "
          "sites only; --backward=kut needs --mode=playback, or peat-runtime "
          "--backward=kut on one device")
    if many and _MODE.value == "runtime":
      raise peat.PeatError(
          "--mode=runtime trains data-parallel on one process's devices; "
          f"got --num_processes={_NUM_PROCESSES.value}. Run it on one host")
    if many:
      peat.init_distributed(
          _COORDINATOR.value or os.environ.get("JAX_COORDINATOR_ADDRESS", ""),
          _NUM_PROCESSES.value, _PROCESS_ID.value)
    task = _task(directory)
    if many:  # the processes share the directory; process 0 alone writes it
      _work(task, directory, steps, kut)
    else:
      with peat.profiler.campaign_lock(directory):
        _work(task, directory, steps, kut)
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


def run() -> None:
  """Console-script entry point (``peat-scaleout``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
