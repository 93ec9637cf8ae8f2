r"""Lists the kernel sites of a reference model's train step.

Usage::

  python -m peat_jax.tools.sites --scenario=gpt
  python -m peat_jax.tools.sites --scenario=vit --counts
  python -m peat_jax.tools.sites --scenario=cnn \
      --kernel=conv_general_dilated --phase=bwd
  python -m peat_jax.tools.sites --scenario=gpt \
      --select='fwd/*/attention:*' --names

  python -m peat_jax.tools.sites --task=my_model:task   # your own model

The step is traced, never run: the state comes from ``jax.eval_shape`` of the
task's ``init_state``, so even large configs list in about a second. Sites
of composite kernels (``*``) include the standard implementations
(``jax.nn.softmax``, ``nnx.LayerNorm``, ``nnx.MultiHeadAttention``'s
attention, optax's softmax cross-entropy, ...), recognized without model
change (docs/sites.md).
"""

import json
import sys

from absl import flags

from peat_jax.tools import _cli
import jax

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat
from peat_jax import models

_SCENARIO = flags.DEFINE_string(
    "scenario", models.DEFAULT_SCENARIO,
    f"Scenario whose train step is listed, one of {models.scenario_names()}.",
    flag_values=FLAGS)
_OVERRIDES = flags.DEFINE_string(
    "overrides", "{}",
    'Config overrides as JSON, e.g. \'{"batch_size": 8, "model_kwargs": {"depth": 1}}\'.', flag_values=FLAGS)
_KERNEL = flags.DEFINE_list("kernel", None, "Only these kernels (e.g. dot_general,softmax).", flag_values=FLAGS)
_PHASE = flags.DEFINE_list("phase", None, "Only these phases: fwd, bwd, upd.", flag_values=FLAGS)
_SELECT = flags.DEFINE_string(
    "select", None, "fnmatch pattern narrowing the sites (over site names, "
    "e.g. 'fwd/*/attention:*').", flag_values=FLAGS)
_COUNTS = flags.DEFINE_bool("counts", False, "Print site counts per kernel and phase only.", flag_values=FLAGS)
_NAMES = flags.DEFINE_bool("names", False, "Print site names only, one per line.", flag_values=FLAGS)
_TASK = _cli.define_task_flag(FLAGS)
_STRUCTURAL = flags.DEFINE_bool(
    "structural", False, "Also list data-movement primitives (reshape, broadcast, ...).", flag_values=FLAGS)
_cli.define_renamed_flags(
    FLAGS,
    model=("scenario", "the scenario whose train step is listed, as in the "
           "other tools"),
    pattern=("select", "the fnmatch pattern narrowing the sites, as in the "
             "other tools"))


def list_sites(model: "str | peat.TrainTask", overrides: dict | None = None, *,
               kernel=None, phase=None, pattern=None,
               include_structural: bool = False) -> peat.SiteTable:
  """Discovers (and optionally selects) the sites of a scenario's train step.

  Args:
    model: scenario name from ``peat_jax.models``, or a task.
    overrides: config overrides for ``models.get_task``.
    kernel: kernel name(s) to keep.
    phase: phase(s) to keep.
    pattern: fnmatch glob over site names to keep.
    include_structural: also list data-movement primitives.

  Returns:
    The sites.

  Raises:
    PeatError: unknown scenario, config key, kernel, phase or an empty
      pattern match.
  """
  task = (model if isinstance(model, peat.TrainTask)
          else models.get_task(model, **(overrides or {})))
  state = jax.eval_shape(lambda: task.init_state(0))
  sites = peat.discover_sites(task.step_fn, state, task.batch_at(0),
                                include_structural=include_structural)
  if kernel or phase or pattern:
    sites = peat.select_sites(sites, kernel=kernel, phase=phase, pattern=pattern)
  return sites


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  try:
    overrides = json.loads(_OVERRIDES.value)
  except json.JSONDecodeError as e:
    print(f"error: --overrides must be a JSON object; got {_OVERRIDES.value!r} ({e})",
          file=sys.stderr)
    return 2
  try:
    _cli.check_task_flags(_TASK, _SCENARIO, _OVERRIDES)
    model = (_cli.user_task(_TASK.value).build() if _TASK.value
             else _SCENARIO.value)
    sites = list_sites(model, overrides, kernel=_KERNEL.value,
                       phase=_PHASE.value, pattern=_SELECT.value,
                       include_structural=_STRUCTURAL.value)
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if _COUNTS.value:
    print(sites.counts_table())
  elif _NAMES.value:
    print("\n".join(sites.names()))
  else:
    print(sites.table())
  return 0


def run() -> None:
  """Console-script entry point."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
