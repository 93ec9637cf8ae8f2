r"""Golden profile: golden training plus captured site inputs under a budget.

Usage::

  python -m peat_jax.tools.profile              # CNN, forward dot_general
  python -m peat_jax.tools.profile \
      --capture_kernel=conv_general_dilated,dot_general
  python -m peat_jax.tools.profile --scenario=vit --capture_kernel=softmax \
      --capture_steps=every_10 --budget=16MiB
  python -m peat_jax.tools.profile --capture_sites='fwd/Cnn/Conv/*' \
      --capture_kernel= --capture_phase= --capture_steps=0,5,39

Step 1 of the PEAT pipeline. Trains the scenario with the golden kernels
(Orbax checkpoints every --checkpoint_every steps in
<campaign_dir>/golden/, resumable) and captures, for the chosen sites at the
chosen steps, each site's inputs, the golden kernel's outputs and the call
parameters into <campaign_dir>/captures/ (one .npz per step and site, listed
with dtype, shape and SHA-256 in captures/index.json). Those records let
`peat-playback --ops` run a kernel under test on real training inputs with
no model.

Sites are chosen by kernel (--capture_kernel), phase (--capture_phase) and a
name pattern (--capture_sites); all given criteria must hold. List the site
names with `peat-sites --scenario=<scenario>`. Step s captures the inputs of
the update from step s to s + 1.

The storage budget (--budget) is applied before training: records are taken
in priority order (earliest step first; within a step, sites in execution
order), each kept when it fits in what is left, else skipped and listed. A
budget smaller than the smallest record is an error. Capturing never changes
the golden run (its checkpoints and log are bitwise those of a run without
capture).
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat

_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None,
    "Campaign directory (golden/ and captures/ go there); default "
    "runs/profile_<scenario>.", flag_values=FLAGS)
_STEPS, _CHECKPOINT_EVERY = _cli.define_golden_steps_flags(FLAGS)
_SITES = flags.DEFINE_string(
    "capture_sites", None,
    "fnmatch pattern over site names to capture, e.g. 'fwd/Cnn/Conv/*'.",
    flag_values=FLAGS)
_KERNEL = flags.DEFINE_list(
    "capture_kernel", ["dot_general"],
    "Kernels to capture (dot_general, conv_general_dilated, softmax, "
    "layer_norm, ...; each must occur in the scenario); empty for any "
    "kernel.", flag_values=FLAGS)
_PHASE = flags.DEFINE_list(
    "capture_phase", ["fwd"],
    "Phases to capture: fwd, bwd, upd; empty for every phase.",
    flag_values=FLAGS)
_CAPTURE_STEPS = flags.DEFINE_string(
    "capture_steps", None,
    "Steps to capture: a list '0,5,20', or 'every_<k>' (0, k, 2k, ...); "
    "default: the checkpoint steps before the last.", flag_values=FLAGS)
_BUDGET = flags.DEFINE_string(
    "budget", "64MiB",
    "Storage budget of the capture files: bytes, or with a unit (kB, KiB, "
    "MB, MiB, GB, GiB).", flag_values=FLAGS)
_TASK = _cli.define_task_flags(FLAGS)


def _steps_flag(text: str | None):
  if text is None:
    return None
  if text.startswith("every_"):
    return int(text[len("every_"):])
  return [int(s) for s in text.split(",") if s.strip()]


def _summary(result: peat.ProfileResult) -> str:
  rows: dict = {}
  for e in result.captured:
    r = rows.setdefault(e["site"], [e["site"], e["kernel"], [], 0, 0])
    r[2].append(e["step"])
    r[3] += e["bytes"]
  for s in result.skipped:
    r = rows.setdefault(s["site"], [s["site"], "-", [], 0, 0])
    r[4] += 1
  table = _cli.table(
      [(n, k, ",".join(map(str, st)) or "-", b, sk)
       for n, k, st, b, sk in rows.values()],
      ("site", "kernel", "steps captured", "bytes", "records skipped"))
  return (f"{table}\ncaptured {len(result.captured)} records, "
          f"{result.used_bytes} bytes of a {result.budget_bytes}-byte "
          f"budget; {len(result.skipped)} skipped for the budget")


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  label = (_TASK.user.value.replace(":", "_") if _TASK.user.value
           else _TASK.scenario.value)
  directory = os.path.abspath(_CAMPAIGN_DIR.value or os.path.join(
      "runs", f"profile_{label}"))
  try:
    budget = _cli.parse_bytes(_BUDGET.value)
    steps_sel = _steps_flag(_CAPTURE_STEPS.value)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  sel = {"capture_sites": _SITES.value,
         "capture_kernel": tuple(_KERNEL.value) or None,
         "capture_phase": tuple(_PHASE.value) or None}
  capturing = any(v is not None for v in sel.values())
  try:
    task = _TASK.task(directory)
    n_ckpt = -(-_STEPS.value // _CHECKPOINT_EVERY.value)
    n_cap = len(peat.profiler.capture_step_list(
        steps_sel, _STEPS.value, _CHECKPOINT_EVERY.value)) if capturing else 0
    golden_eta = _cli.Eta(n_ckpt, prefixes=("step ",))
    capture_eta = _cli.Eta(n_cap, prefixes=("captured step",),
                           out=golden_eta)

    result = peat.profile(
        task, directory, steps=_STEPS.value,
        checkpoint_every=_CHECKPOINT_EVERY.value, **sel,
        capture_steps=steps_sel, budget_bytes=budget if capturing else None,
        seed=_TASK.seed.value, progress=capture_eta)
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"golden run: {result.golden.workdir} (checkpoints "
        f"{result.golden.steps})")
  if result.captures_dir:
    print(_summary(result))
    print(f"captures: {result.captures_dir}")
  else:
    print("no capture selection: golden run only")
  return 0


def run() -> None:
  """Console-script entry point (``peat-profile``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
