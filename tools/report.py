r"""Rebuilds a campaign's report.html and report.json from its record files.

Usage::

  python -m peat_jax.tools.report --campaign_dir=runs/c1
  python -m peat_jax.tools.report --campaign_dir=runs/c1 --source=ops \
      --kut=native:matmul:acc_bf16

Reads what the campaign directory holds (campaign.json, playback.msgpack or
the op-level ops.msgpack, runtime.msgpack, golden/run.json), recomputes the
verdict, per-site table and localization from the stored diagnoses, and
writes <campaign_dir>/report.html (self-contained: open it in a browser) and
report.json (the same data, docs/report.md). Nothing is rerun, so it works
on an interrupted campaign, after `peat-playback --ops`, or to report
another KUT whose records share the directory. Prints the summary table.
Exit status 1 when the verdict, or the fuzz verdict of the shapes beyond
training (fuzz.msgpack), reaches --fail_on (default fail), 2 on bad
input.
"""

import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat

_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None, "Campaign directory to report. Required.",
    flag_values=FLAGS)
_SOURCE = flags.DEFINE_enum(
    "source", "auto", list(peat.profiler.SOURCES),
    "Site records: playback (playback.msgpack), ops (op-level ops.msgpack) "
    "or auto (playback when there is any).", flag_values=FLAGS)
_KUT = flags.DEFINE_string(
    "kut", None, "KUT to report (default: the campaign's, or the only one "
    "in the records).", flag_values=FLAGS)
_BACKWARD = _cli.define_report_backward_flag(FLAGS)
_FAIL_ON = _cli.define_fail_on(FLAGS)


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  if not _CAMPAIGN_DIR.value:
    print("error: --campaign_dir is required", file=sys.stderr)
    return 2
  try:
    out = peat.rebuild_report(_CAMPAIGN_DIR.value, kut=_KUT.value,
                              source=_SOURCE.value, backward=_BACKWARD.value)
  except peat.PeatError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(peat.report.summary_table(out.data))
  print(f"verdict: {out.verdict}")
  if out.fuzz_verdict is not None:
    print(f"fuzz verdict: {out.fuzz_verdict}")
  print(f"report: {out.html}")
  print(f"data: {out.json}")
  return _cli.exit_status(out.verdict, _FAIL_ON.value, out.fuzz_verdict)


def run() -> None:
  """Console-script entry point (``peat-report``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
