"""Writes the record fixture (run with peat_jax at main 3ff0694; gpt_backward_kut
rewritten at ea885b3, after the attention backward pairing fix of 1883063;
cnn_conv2d and gpt_backward_kut again at d94508b, after eb10a7c).

  .venv/bin/python tests/profiler/records_fixture/make.py

Writes ``<case>.msgpack`` next to this file for every case of cases.py.
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
  here = os.path.dirname(os.path.abspath(__file__))
  for name in sys.argv[1:] or cases.CASES:
    with tempfile.TemporaryDirectory() as tmp:
      path = cases.run(peat, models, name, tmp)
      shutil.copy(path, os.path.join(here, f"{name}.msgpack"))
      print(name, os.path.getsize(path), "bytes")
