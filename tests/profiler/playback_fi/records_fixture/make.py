"""Writes the record fixture (run with peat_jax at main 3ff0694; gpt_backward_kut
rewritten at ea885b3, after the attention backward pairing fix of 1883063;
cnn_conv2d and gpt_backward_kut again at d94508b, after eb10a7c; all four
for issue 34's triage: the paths that decided the records, screened
records without the decomposition, the port probe carried per site; all
four again for issue 34's probe of a primitive site on the device: a
first checkpoint's records that rounded inputs explain are no longer
decomposed (their decomposition fields neutral, as the carried ones'),
the ports' float fields moved in their last bits (at most 1.2e-13
relative), diagnoses, verdicts and paths as before; all four again at
the commit after f6289d9 for the Detector as hypotheses: the Signature's
base fields and exact-flip counts, the port's rounding mode and where it
rounds, the truncated TF32 operands tried; every diagnosis and verdict as
before).

  .venv/bin/python tests/profiler/playback_fi/records_fixture/make.py [case ...]
  .venv/bin/python tests/profiler/playback_fi/records_fixture/make.py --out=DIR [case ...]

Writes ``<case>.msgpack`` next to this file (or into DIR) for every case of
cases.py. Records made on one machine are bitwise reproducible there, so
two commits are compared byte for byte by running ``--out`` at each on the
same machine and ``cmp``-ing the files; the stored fixture is compared
across machines by tests/profiler/playback_fi/test_playback_records_fixed.py.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import peat_jax as peat  # noqa: E402
from peat_jax import models  # noqa: E402
import cases  # noqa: E402

if __name__ == "__main__":
  out = os.path.dirname(os.path.abspath(__file__))
  names = []
  for arg in sys.argv[1:]:
    if arg.startswith("--out="):
      out = os.path.abspath(arg[len("--out="):])
      os.makedirs(out, exist_ok=True)
    elif arg in cases.CASES:
      names.append(arg)
    else:
      sys.exit(f"unknown case or flag {arg!r}; cases: "
               f"{', '.join(cases.CASES)}; flag: --out=DIR")
  for name in names or cases.CASES:
    with tempfile.TemporaryDirectory() as tmp:
      path = cases.run(peat, models, name, tmp)
      shutil.copy(path, os.path.join(out, f"{name}.msgpack"))
      print(name, os.path.getsize(path), "bytes")
