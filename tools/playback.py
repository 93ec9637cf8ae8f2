r"""Playback FI of a kernel under test: over checkpoints, or op by op.

Usage::

  # model playback at every saved checkpoint of the campaign's golden run
  python -m peat_jax.tools.playback --campaign_dir=runs/profile_cnn \
      --kut=native:conv2d:in_bf16
  # op-level playback on the inputs captured by peat-profile (no model)
  python -m peat_jax.tools.playback --campaign_dir=runs/profile_cnn \
      --kut=native:matmul:acc_bf16 --ops
  # shapes beyond training: the KUT on variants of the captured inputs
  python -m peat_jax.tools.playback --campaign_dir=runs/profile_gpt \
      --kut=native:softmax:default --fuzz --fuzz_budget=60 --scenario=gpt

Model playback (default): for each saved checkpoint s of
<campaign_dir>/golden (all but the last, or --checkpoints), restore the training
state, run step s once with the golden kernel and the KUT on identical
inputs at every selected site, and record each site's signature and
diagnosis plus the step's effect on loss, gradient norm and parameter update
in <campaign_dir>/playback.msgpack. With --backward=kut the KUT's VJP runs
at the backward sites of the selected forward sites too, and each backward
site is recorded (one signature per cotangent, against the golden VJP and a
float64 reference VJP). With --invariance the KUT is also probed for stale
outputs, inputs changed in place, ignored inputs and batch variance at each
played site (docs/detector.md). The golden run must exist
(peat-golden, peat-profile or peat-validate made it) and --scenario,
--batch_size, --overrides and --seed must match it.

Op-level playback (--ops): for each (step, site) record that peat-profile
captured for the KUT's kernel, load the site's inputs, run the KUT and the
golden kernel on them (no model, no training state), compare with the
float64 reference, and append the records to <campaign_dir>/ops.msgpack.
--checkpoints then lists capture steps. Corrupt capture files are named in
the error.

Fuzz (--fuzz): for each site of the KUT's kernel that peat-profile
captured, the KUT on variants of its real inputs (other batch sizes, one
row, lengths around multiples of 8..128 and 4096 and past 2^14, attention
masks and head layouts, magnitudes up to the overflow edge, denormals;
peat.fuzz, docs/fuzz.md), each compared with the golden kernel and the
float64 reference, recorded in <campaign_dir>/fuzz.msgpack; --fuzz_budget,
--fuzz_seed, --fuzz_families narrow it. The golden kernel of a composite
site is the model's own function when the task flags (--scenario ... or
--task) are given, else its kind's standard golden. The verdict printed is
the variants' (shapes beyond training). peat-repro turns a record into a
regression test.

All resume: records already there are skipped. The end prints a summary
table (per site: diagnosed error model, verdict, largest noise ratio) and
the KUT's verdict; `peat-report` turns the records into the HTML report.
KUT specs: golden, native:<matmul|conv2d|softmax|layer_norm>:<variant>[@tile]
(peat_jax.kernels.kut.known_specs()), or your own py:, ffi:,
torch:<module>:<function> with --kernel (docs/kernels.md); the user's model
with --task=<module>:<function>. Exit status 1 when the verdict reaches
--fail_on (default fail), 2 on bad input.
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat

_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None,
    "Campaign directory holding golden/ (model playback) or captures/ "
    "(--ops). Required.", flag_values=FLAGS)
_KUT = _cli.define_kut_flags(FLAGS)
_FAIL_ON = _cli.define_fail_on(FLAGS)
_OPS = flags.DEFINE_bool(
    "ops", False, "Op-level playback on the captured site inputs (no model) "
    "instead of model playback over checkpoints.", flag_values=FLAGS)
_SELECT = flags.DEFINE_string(
    "select", None, "fnmatch pattern narrowing the KUT's sites.",
    flag_values=FLAGS)
_CHECKPOINTS = flags.DEFINE_list(
    "checkpoints", None, "Checkpoint steps to play back, e.g. 0,10; default "
    "all saved but the last. With --ops: the capture steps to play back; "
    "default all captured.", flag_values=FLAGS)
_PHASE = flags.DEFINE_list(
    "phase", ["fwd"], "--ops only: site phases to play back (fwd, bwd); "
    "empty for every captured phase.", flag_values=FLAGS)
_FUZZ = _cli.define_fuzz_flags(FLAGS)
_BACKWARD = _cli.define_backward_flag(FLAGS)
_INVARIANCE = _cli.define_invariance_flag(FLAGS)
_TASK = _cli.define_task_flags(FLAGS, "Model playback: the golden run's")
_cli.define_renamed_flags(FLAGS, steps=_cli.CHECKPOINTS_RENAMED)


def _model(directory: str, steps, kut) -> tuple[list, list, list]:
  task = _TASK.task(directory)
  golden = os.path.join(directory, peat.profiler.GOLDEN_DIR)
  if steps is None:
    saved = peat.saved_steps(os.path.join(golden,
                                          peat.profiler.CHECKPOINT_DIR))
    n = max(len(saved) - 1, 1)
  else:
    n = len(steps)
  result = peat.playback(
      task, golden, kut, campaign_dir=directory, steps=steps,
      select=_SELECT.value, backward=_BACKWARD.value,
      invariance=_INVARIANCE.value,
      progress=_cli.Eta(n, prefixes=("playback step",)))
  return result.records, result.sites, result.effects


def _ops(directory: str, steps, kut) -> tuple[list, list, list]:
  cdir = peat.profiler.captures_dir_of(directory)
  phase = tuple(_PHASE.value) or None
  n = len(peat.profiler.select_entries(
      peat.profiler.read_index(cdir), kut, select=_SELECT.value,
      phase=phase, steps=steps))
  result = peat.playback_ops(
      directory, kut, select=_SELECT.value, phase=phase, steps=steps,
      campaign_dir=directory, progress=_cli.Eta(n, prefixes=("op ",)))
  return result.records, result.sites, []


def _fuzz(directory: str, steps, kut, settings: dict
          ) -> tuple[list, list, list]:
  cdir = peat.profiler.captures_dir_of(directory)
  task = (_TASK.task(directory) if _TASK.user.value or _TASK.scenario.present
          else None)
  phase = tuple(_PHASE.value) or None
  n = len({e["site"] for e in peat.profiler.select_entries(
      peat.profiler.read_index(cdir), kut, select=_SELECT.value,
      phase=phase, steps=steps)})
  result = peat.fuzz(directory, kut, task=task, select=_SELECT.value,
                     phase=phase, steps=steps, campaign_dir=directory,
                     progress=_cli.Eta(n * 40, prefixes=("fuzz ",)),
                     **settings)
  print(result.summary)
  print(peat.profiler.fuzz_coverage_line(result.coverage))
  for e in result.errors:
    print(f"finding: {e['site']} {e['variant']}: {e['error']}")
  if not result.records:
    raise peat.PeatError(f"no fuzz variant ran ({len(result.skipped)} "
                         "skipped); raise --fuzz_budget")
  sites = list(dict.fromkeys(r["site"] for r in result.records))
  recs = [dict(r, site=f"{r['site']} [{r['variant']}]")
          for r in result.records]
  order = list(dict.fromkeys(r["site"] for r in recs))
  del sites
  return recs, order, []


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  try:
    directory, steps = _cli.campaign_dir_and_checkpoints(
        _CAMPAIGN_DIR.value, _CHECKPOINTS.value)
  except _cli.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if _OPS.value and _BACKWARD.value != "golden":
    print("error: --ops replays captured site inputs, one kernel call at a "
          "time, without the KUT's VJP; --backward=kut needs model playback "
          "(drop --ops)", file=sys.stderr)
    return 2
  if _OPS.value and _INVARIANCE.value:
    print("error: --invariance probes the KUT at the sites of model "
          "playback (its outputs over checkpoints, in-place writes into "
          "live buffers); --ops replays captured inputs. Drop one of them",
          file=sys.stderr)
    return 2
  try:
    fuzz = _FUZZ.settings()
    if fuzz is not None and (_OPS.value or _BACKWARD.value != "golden"
                             or _INVARIANCE.value):
      raise _cli.UsageError("--fuzz runs the KUT on variants of captured "
                            "inputs, a mode of its own: drop --ops, "
                            "--backward=kut and --invariance")
    kut = _KUT.spec()  # parsed once, before any work
    with peat.profiler.campaign_lock(directory):
      if fuzz is not None:
        records, sites, effects = _fuzz(directory, steps, kut, fuzz)
      else:
        records, sites, effects = (_ops if _OPS.value else _model)(
            directory, steps, kut)
    data = peat.report.report_data(
        kut=kut.spec, scenario=(_TASK.label() or _task_name(directory))
        if not (_OPS.value or fuzz is not None) else "captured inputs",
        records=records, sites=sites,
        effects=effects, settings={"backward": _BACKWARD.value})
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(peat.report.summary_table(data))
  name = (peat.profiler.FUZZ_FILE if fuzz is not None else
          peat.profiler.OPS_FILE if _OPS.value else
          peat.profiler.PLAYBACK_FILE)
  print(f"records: {os.path.join(directory, name)}")
  print(f"{'fuzz verdict' if fuzz is not None else 'verdict'}: "
        f"{data['verdict']['verdict']}")
  return _cli.exit_status(data["verdict"]["verdict"], _FAIL_ON.value)


def _task_name(directory: str) -> str:
  return _TASK.task(directory).name


def run() -> None:
  """Console-script entry point (``peat-playback``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
