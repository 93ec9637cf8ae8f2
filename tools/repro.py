r"""A regression test of one record, for the kernel's own repository.

Usage::

  # a fuzz variant that failed (peat-validate --fuzz, or peat.fuzz)
  python -m peat_jax.tools.repro --campaign_dir=runs/c1 \
      --site='fwd/Gpt/Block/MultiHeadAttention/attention/softmax:0' \
      --variant=len=64 --scenario=gpt
  pytest runs/c1/repro/<site>_len_64            # fails on the bug
  PEAT_REPRO_KUT=py:my_kernels:softmax_fixed PEAT_REPRO_PATH=. \
      pytest runs/c1/repro/<site>_len_64        # passes on the fix

Writes a folder (``--out``, default ``<campaign>/repro/<site>_<variant>``)
with the real inputs of the record (``case.npz``), the golden kernel's
outputs and their float64 reference beside them, the call
(``case.json``), and ``test_repro.py``: it runs the KUT spec on the inputs
and checks it with ``peat.testing.assert_matches_golden`` (the Detector's
noise-floor rule), with no training run. A variant the fuzz shrank is
exported at the smallest input that fails the same way, the variant as
found recorded beside it (``--nosmallest``: as found). Without
``--variant`` the record
is the captured training call of ``--step``. The KUT is the record's
(``--kut`` overrides it). When the record's golden kernel was the model's
own composite function, the task flags (``--scenario`` ... or ``--task``)
must name the campaign's task. Exit status 0, 2 on bad input.
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat

_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None, "Campaign directory with captures/ (and "
    "fuzz.msgpack for a variant). Required.", flag_values=FLAGS)
_SITE = flags.DEFINE_string("site", None, "The record's site. Required.",
                            flag_values=FLAGS)
_VARIANT = flags.DEFINE_string(
    "variant", None, "The fuzz variant (e.g. len=64); none for the "
    "captured training call.", flag_values=FLAGS)
_STEP = flags.DEFINE_integer("step", None, "The capture step (default: the "
                             "record's).", flag_values=FLAGS)
_KUT = _cli.define_kut_flags(FLAGS, default=None)
_FUZZ_SEED = flags.DEFINE_integer("fuzz_seed", None, "The fuzz seed "
                                  "(default: the record's).",
                                  flag_values=FLAGS)
_SMALLEST = flags.DEFINE_bool(
    "smallest", True, "Export the variant's shrunk form (the smallest input "
    "the fuzz found failing the same way) when there is one; "
    "--nosmallest: the variant as found.", flag_values=FLAGS)
_OUT = flags.DEFINE_string("out", None, "The folder (default "
                           "<campaign>/repro/<site>_<variant>).",
                           flag_values=FLAGS)
_TASK = _cli.define_task_flags(FLAGS, "The campaign's")


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  if not _CAMPAIGN_DIR.value or not _SITE.value:
    print("error: --campaign_dir and --site are required (peat-playback "
          "--ops or the fuzz summary names the sites)", file=sys.stderr)
    return 2
  directory = os.path.abspath(_CAMPAIGN_DIR.value)
  try:
    kut = _KUT.spec().spec if _KUT.kut.value else None
    task = None
    if _TASK.user.value or _TASK.scenario.present:
      task = _TASK.task(directory)
    folder = peat.export_repro(
        directory, site=_SITE.value, step=_STEP.value,
        variant=_VARIANT.value, kut=kut, seed=_FUZZ_SEED.value, task=task,
        out_dir=_OUT.value, smallest=_SMALLEST.value)
  except (peat.PeatError, _cli.UsageError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"repro: {folder}")
  meta = peat.testing.load_repro(folder).meta
  if meta.get("shrunk_from"):
    print(f"shrunk: {meta['variant']}, shapes {meta['site']['in_shapes']} "
          f"(found as {meta['shrunk_from']}, shapes "
          f"{meta['original_shapes']})")
  print(f"run: pytest {folder}  (PEAT_REPRO_KUT=<spec> to test another "
        "kernel, PEAT_REPRO_PATH=<dir> for its module)")
  return 0


def run() -> None:
  """Console-script entry point (``peat-repro``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
