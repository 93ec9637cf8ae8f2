r"""Validation campaign of a kernel under test (KUT) inside real training.

Usage::

  python -m peat_jax.tools.validate                      # CNN, native conv2d in_bf16
  python -m peat_jax.tools.validate --scenario=vit --kut=native:matmul:acc_bf16
  python -m peat_jax.tools.validate --kut=native:matmul:tile_edge_bug@4 \
      --steps=40 --checkpoint_every=10 --frequencies=every,every_4
  # your own model and kernel (docs/kernels.md); exit status 1 on fail
  python -m peat_jax.tools.validate --task=my_model:task \
      --kut=py:my_kernels:layer_norm --kernel=layer_norm --fail_on=fail
  # also the shapes beyond training: 40 variants of the captured inputs
  python -m peat_jax.tools.validate --scenario=gpt \
      --kut=native:softmax:default --fuzz --fuzz_budget=40

Runs (or resumes) the golden run, playback FI at every checkpoint, runtime FI
at each frequency, the verdict and the report, all in ``--campaign_dir``.
``--backward=kut`` also runs the KUT's VJP at the backward sites of its
forward sites (each one recorded and diagnosed); the default
``--backward=golden`` asks the forward-only question. ``--invariance``
also probes the KUT for stale outputs, inputs changed in place, ignored
inputs and batch variance at every played site. ``--fuzz`` then captures
the inputs of the KUT's forward sites at step 0 and runs the KUT on
variants of them (``peat.fuzz``: other batch sizes, one row, other
lengths, attention masks and layouts, magnitudes, denormals; budget
``--fuzz_budget=40`` variants or ``=120s``, ``--fuzz_seed``,
``--fuzz_families``): the shapes beyond training, whose verdict is printed
as ``fuzz verdict: <v>`` after ``verdict: <v>`` and kept apart from the
training verdict (which covers the training's shapes only).

Exit status: 0, or 1 when the training verdict or the fuzz verdict (with
``--fuzz``, or fuzz records of the KUT already in the campaign) reaches
``--fail_on`` (default ``fail``; ``warn`` for a stricter CI gate,
``never``), 2 on bad input (a bad ``--fuzz_budget`` too).

The default KUT, ``native:conv2d:in_bf16``, replaces the three forward
convolutions of the default CNN (where nearly all of its compute is) by the
native im2col+GEMM kernel that rounds its inputs to bfloat16: the classic
question of a port (is bf16 input rounding fit for training?), fast on CPU,
and an interesting answer: playback names ``precision:bf16`` at every conv
site far above the float32 noise floor (verdict ``warn``), while runtime FI
shows the training loss staying within the seed-to-seed spread.
"""

import json
import os
import sys

from absl import flags

from peat_jax.tools import _cli
from absl import logging

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat
from peat_jax import models

_KUT = _cli.define_kut_flags(FLAGS)
_TASK = _cli.define_task_flags(FLAGS)
_FAIL_ON = _cli.define_fail_on(FLAGS)
_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None,
    "Campaign directory; default runs/campaign_<scenario or task>_<kut>.",
    flag_values=FLAGS)
_STEPS, _CHECKPOINT_EVERY = _cli.define_golden_steps_flags(
    FLAGS, steps_note=" Also the runtime FI steps unless --runtime_steps.")
_FREQUENCIES = flags.DEFINE_list(
    "frequencies", ["every", "every_4", "fraction_0.25"],
    "Runtime FI frequencies: every, every_<n>, fraction_<p>; empty to skip.", flag_values=FLAGS)
_RUNTIME_STEPS = flags.DEFINE_integer(
    "runtime_steps", None, "Runtime FI steps; default --steps.", flag_values=FLAGS)
_SELECT = flags.DEFINE_string(
    "select", None, "fnmatch pattern narrowing the KUT's sites.", flag_values=FLAGS)
_ISOLATE = flags.DEFINE_enum(
    "isolate", "auto", ["auto", "on", "off"],
    "Run playback and runtime FI in worker processes with time and memory "
    "limits, so that a KUT that crashes, hangs or exhausts memory becomes a "
    "crash/hang finding instead of killing the campaign. auto: on for "
    "native: and ffi: KUTs (required for the deliberately broken ones).",
    flag_values=FLAGS)
_TIMEOUT_S = flags.DEFINE_float(
    "timeout_s", peat.profiler.TIMEOUT_S,
    "Isolation: seconds one checkpoint (or runtime frequency) may take "
    "before the worker is killed and a hang is recorded.", flag_values=FLAGS)
_STARTUP_S = flags.DEFINE_float(
    "startup_s", peat.profiler.STARTUP_S,
    "Isolation: extra seconds for each worker's first checkpoint (import, "
    "tracing, compilation).", flag_values=FLAGS)
_BACKWARD = _cli.define_backward_flag(FLAGS)
_INVARIANCE = _cli.define_invariance_flag(FLAGS)
_STORE_GOLDEN_STEP = _cli.define_store_golden_step_flag(FLAGS)
_FUZZ = _cli.define_fuzz_flags(FLAGS)
_MEMORY_LIMIT_MB = flags.DEFINE_integer(
    "memory_limit_mb", peat.profiler.MEMORY_LIMIT_MB,
    "Isolation: resident memory (MiB) a worker may use; 0 for no limit.",
    flag_values=FLAGS)


def _safe(s: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  logging.set_verbosity(logging.WARNING)
  try:
    _cli.check_task_flags(_TASK.user, _TASK.scenario, _TASK.batch_size,
                          _TASK.overrides)
    overrides = (json.loads(_TASK.overrides.value) if _TASK.overrides.value
                 else {})
    fuzz = _FUZZ.settings()
  except (_cli.UsageError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if _TASK.batch_size.value:
    overrides["batch_size"] = _TASK.batch_size.value
  label = _safe(_TASK.user.value) if _TASK.user.value else _scenario()
  directory = os.path.abspath(_CAMPAIGN_DIR.value or os.path.join(
      "runs", f"campaign_{label}_{_safe(_KUT.kut.value)}"
      + ("_bwd" if _BACKWARD.value == "kut" else "")))
  try:
    spec = _KUT.spec()  # parsed once, before any work
    if _TASK.user.value:  # the user's task: a recipe workers rebuild it from
      factory = peat.TaskFactory.from_spec(_TASK.user.value)
    else:  # a recipe, not a task: isolated workers rebuild the task from it
      factory = models.prepare_task_factory(
          _scenario(), os.path.join(directory, "task"), seed=_TASK.seed.value,
          progress=print, **overrides)
    paths = peat.validate(
        factory, spec, directory, steps=_STEPS.value,
        checkpoint_every=_CHECKPOINT_EVERY.value,
        frequencies=tuple(_FREQUENCIES.value),
        runtime_steps=_RUNTIME_STEPS.value, select=_SELECT.value,
        seed=_TASK.seed.value,
        scenario=None if _TASK.user.value else _scenario(),
        isolate={"auto": None, "on": True, "off": False}[_ISOLATE.value],
        timeout_s=_TIMEOUT_S.value, startup_s=_STARTUP_S.value,
        memory_limit_mb=_MEMORY_LIMIT_MB.value or None, progress=print,
        backward=_BACKWARD.value, invariance=_INVARIANCE.value, fuzz=fuzz,
        store_golden_step=_STORE_GOLDEN_STEP.value == "on")
  except peat.PeatError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"verdict: {paths.verdict}")
  if fuzz is not None or paths.fuzz_verdict is not None:
    print(f"fuzz verdict: {paths.fuzz_verdict or 'none (no variant ran)'}")
  print(f"report: {paths.html}")
  print(f"data: {paths.json}")
  return _cli.exit_status(paths.verdict, _FAIL_ON.value, paths.fuzz_verdict)


def _scenario() -> str:
  return _TASK.scenario.value


def run() -> None:
  """Console-script entry point."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
