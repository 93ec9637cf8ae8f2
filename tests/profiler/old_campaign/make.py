"""Writes the pre-move campaign fixture (run once, with peat_jax at 7e3e18d).

  PYTHONPATH=<checkout of 7e3e18d> python tests/profiler/old_campaign/make.py DIR

The checkout needs the native library (peat_jax/kernels/_peat_kernels_cpu.so,
built from the same csrc/ sources as today's). DIR gets a whole validate
campaign: golden run with Orbax checkpoints, playback and runtime records,
campaign.json and the report.
"""

import os
import sys

sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import peat_jax as peat  # noqa: E402
import tiny  # noqa: E402

if __name__ == "__main__":
  assert not hasattr(peat, "profiler"), "run this with the pre-move peat_jax"
  out = os.path.abspath(sys.argv[1])
  paths = peat.validate(tiny.get_task(), tiny.KUT, out, **tiny.SETTINGS)
  print(paths.verdict, out)
