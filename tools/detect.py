r"""Detector: which error model explains a signature, or a campaign's records.

Usage::

  # one signature written by peat-analyze --out
  python -m peat_jax.tools.detect --signature=sig.npz --kernel=dot_general \
      --reduction=512
  # the diagnoses of a campaign's records and the KUT's verdict
  python -m peat_jax.tools.detect --campaign_dir=runs/c1
  python -m peat_jax.tools.detect --campaign_dir=runs/c1 --source=ops

The Detector step of PEAT. With --signature it runs `peat.detect` on a
signature saved by `peat-analyze --out` and prints the top error model, its
confidence, evidence and verdict (pass, warn, fail), then every candidate
whose rule held. --kernel and --reduction (the reduction length K, e.g. the
contracted size of a matmul) tell it what the site is, which separates
accumulation in a narrow format from rounded inputs.

With --campaign_dir it reads the diagnoses that playback stored with each
(step, site) record (--source=playback: playback.msgpack, ops: op-level
ops.msgpack, auto: playback when there is any) and prints one row per site
(worst record's model and verdict, largest noise ratio), the localization
and the verdict over all records. Error model names: docs/error_models.md.
"""

import collections
import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import numpy as np

import peat_jax as peat

_SIGNATURE = flags.DEFINE_string(
    "signature", None, "A signature .npz written by peat-analyze --out.",
    flag_values=FLAGS)
_KERNEL = flags.DEFINE_string(
    "kernel", None, "--signature: the site's kernel, e.g. dot_general.",
    flag_values=FLAGS)
_REDUCTION = flags.DEFINE_integer(
    "reduction", None, "--signature: the reduction length K of the site.",
    flag_values=FLAGS)
_CAMPAIGN_DIR = flags.DEFINE_string(
    "campaign_dir", None, "A campaign directory whose records to diagnose.",
    flag_values=FLAGS)
_SOURCE = flags.DEFINE_enum(
    "source", "auto", list(peat.profiler.SOURCES),
    "--campaign_dir: playback (playback.msgpack), ops (ops.msgpack) or auto.",
    flag_values=FLAGS)
_KUT = flags.DEFINE_string(
    "kut", None, "--campaign_dir: the KUT whose records to read (default: "
    "the campaign's).", flag_values=FLAGS)
_BACKWARD = _cli.define_report_backward_flag(FLAGS)


def load_signature(path: str) -> peat.Signature:
  """Reads a signature .npz written by ``peat-analyze --out``.

  Raises:
    peat_jax.PeatError: missing or unreadable file, missing fields.
  """
  try:
    z = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise peat.PeatError(f"{path} is not a readable signature .npz ({e})"
                         ) from e
  if not isinstance(z, np.lib.npyio.NpzFile):
    raise peat.PeatError(f"{path} holds one array, not signature fields; "
                         "expected an .npz written by peat-analyze --out")
  with z:
    missing = [k for k in peat.Signature._fields if k not in z.files]
    if missing:
      raise peat.PeatError(
          f"{path} lacks signature fields {missing[:5]}"
          f"{'...' if len(missing) > 5 else ''}; expected a file written by "
          "peat-analyze --out")
    return peat.Signature(*[z[k] for k in peat.Signature._fields])


def _one(path: str) -> int:
  ctx = {}
  if _KERNEL.value:
    ctx["kernel"] = _KERNEL.value
  if _REDUCTION.value:
    ctx["reduction"] = _REDUCTION.value
  d = peat.detect(load_signature(path), context=ctx or None)
  print(_cli.table([(c.model, c.confidence, c.evidence)
                    for c in d.candidates], ("candidate", "confidence",
                                              "evidence")))
  print(f"model: {d.model} (confidence {d.confidence:.2f})")
  print(f"evidence: {d.evidence}")
  print(f"verdict: {d.verdict}")
  return 0


def _campaign_dir(directory: str) -> int:
  data = peat.profiler.load_report_data(directory, kut=_KUT.value,
                                        source=_SOURCE.value,
                                        backward=_BACKWARD.value)
  print(peat.report.summary_table(data))
  counts = collections.Counter(s["model"] for s in data["sites"])
  print("sites per error model: " + ", ".join(
      f"{m} x{n}" for m, n in counts.most_common()))
  print(f"verdict: {data['verdict']['verdict']}")
  return 0


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  if bool(_SIGNATURE.value) == bool(_CAMPAIGN_DIR.value):
    print("error: give exactly one of --signature and --campaign_dir",
          file=sys.stderr)
    return 2
  try:
    if _SIGNATURE.value:
      return _one(_SIGNATURE.value)
    return _campaign_dir(_CAMPAIGN_DIR.value)
  except peat.PeatError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def run() -> None:
  """Console-script entry point (``peat-detect``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
