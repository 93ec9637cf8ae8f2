r"""Signature of one pseudo-error: a test array against a golden array.

Usage::

  python -m peat_jax.tools.analyze --test=kut_out.npy --golden=golden_out.npy
  python -m peat_jax.tools.analyze --test=kut.npz:y --golden=gold.npz:y \
      --reference=ref64.npy --out=sig.npz
  # a record captured by peat-profile holds the golden output as out0
  python -m peat_jax.tools.analyze --test=mine.npy --golden=\
      runs/c1/captures/step_000000/fwd_Cnn_Linear_dot_general_0.npz:out0

The Analyzer step of PEAT: `peat.analyze(test, golden, reference)` on two
arrays of the same shape and dtype (float32, bfloat16, float16 or float64):
exact matches, NaN/Inf counts, absolute and relative error (max, mean, RMS,
percentiles), ULP distances, differing bit positions, bias, spatial
structure, permutation/shift/scale tests and, with a float64 --reference,
the error against the noise floor (docs/signature.md explains each field).

An array argument is a .npy file, or a .npz file with `:<name>` choosing
the array (optional when the file holds one). The fields are printed as a
table; --out writes the whole signature (every field, arrays included) as
an .npz that `peat-detect --signature=<file>` reads.
"""

import os
import sys

from absl import flags

from peat_jax.tools import _cli

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import numpy as np

import peat_jax as peat

_TEST = flags.DEFINE_string(
    "test", None, "Kernel-under-test output: file.npy or file.npz[:name]. "
    "Required.", flag_values=FLAGS)
_GOLDEN = flags.DEFINE_string(
    "golden", None, "Golden output on the same inputs: file.npy or "
    "file.npz[:name]. Required.", flag_values=FLAGS)
_REFERENCE = flags.DEFINE_string(
    "reference", None, "Optional float64 reference of the same operation "
    "(noise-floor fields).", flag_values=FLAGS)
_OUT = flags.DEFINE_string(
    "out", None, "Write the full signature to this .npz (for peat-detect).",
    flag_values=FLAGS)
_ARRAYS = flags.DEFINE_bool(
    "arrays", False, "Also print the array fields (histograms, per-row and "
    "per-column statistics).", flag_values=FLAGS)


def load_array(spec: str) -> np.ndarray:
  """Loads ``file.npy`` or ``file.npz[:name]``.

  Raises:
    peat_jax.PeatError: missing file, unknown name, an .npz of several
      arrays without a name, an unreadable file.
  """
  path, name = spec, None
  if not os.path.exists(path) and ":" in spec:
    path, name = spec.rsplit(":", 1)
  if not os.path.exists(path):
    raise peat.PeatError(f"array file {path} does not exist")
  try:
    loaded = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise peat.PeatError(f"{path} is not a readable .npy/.npz file ({e})"
                         ) from e
  if isinstance(loaded, np.ndarray):
    if name is not None:
      raise peat.PeatError(f"{path} is an .npy file (one array); drop "
                           f"':{name}'")
    return loaded
  with loaded:
    names = list(loaded.files)
    if name is None:
      if len(names) != 1:
        raise peat.PeatError(f"{path} holds arrays {names}; choose one with "
                             f"{path}:<name>")
      name = names[0]
    if name not in names:
      raise peat.PeatError(f"{path} has no array {name!r}; it holds {names}")
    return loaded[name]


def signature_rows(sig, arrays: bool = False) -> list:
  """(field, value) rows of a Signature: scalars, and arrays if asked."""
  rows = []
  for k, v in zip(sig._fields, sig):
    a = np.asarray(v)
    if a.ndim == 0:
      rows.append((k, a.item()))
    elif arrays:
      rows.append((k, np.array2string(a.ravel(), precision=4,
                                      max_line_width=10**6, threshold=64)))
  return rows


def main(argv: list[str]) -> int:
  if _cli.stray(argv) is not None:
    return 2
  if not _TEST.value or not _GOLDEN.value:
    print("error: --test and --golden are required", file=sys.stderr)
    return 2
  try:
    test, golden = load_array(_TEST.value), load_array(_GOLDEN.value)
    ref = load_array(_REFERENCE.value) if _REFERENCE.value else None
    sig = peat.analyze(test, golden, ref)
  except peat.PeatError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(_cli.table(signature_rows(sig, _ARRAYS.value), ("field", "value")))
  n, same = int(sig.n), int(sig.n_bit_equal)
  print(f"{n} elements, {n - same} differ ({float(sig.share_differ):.3g}); "
        f"max rel error {float(sig.rel_max):.3g}"
        + ("" if ref is None else
           f"; noise ratio {float(sig.noise_ratio):.3g}"))
  if _OUT.value:
    np.savez(_OUT.value, **{k: np.asarray(v)
                            for k, v in zip(sig._fields, sig)})
    print(f"signature: {_OUT.value}")
  return 0


def run() -> None:
  """Console-script entry point (``peat-analyze``)."""
  _cli.run(main, FLAGS, __doc__)


if __name__ == "__main__":
  run()
