"""Cost of playback FI: time per checkpoint and storage of its records.

Usage::

  python benchmarks/bench_campaign.py [--scenario=cnn] [--kut=native:conv2d:in_bf16]

In one process: a short golden run, then

* time: playback cost per checkpoint (restore, tapped step, references,
  signatures, diagnoses, substituted step; compilation excluded: the first
  checkpoint is not counted) vs one golden train step (median of 30 warm
  calls), and their ratio;
* storage: bytes of ``playback.msgpack`` vs storing every site's output
  activations (all sites of the step: fwd, bwd, upd) at every played-back
  step, and vs storing the selected sites' inputs and outputs (golden and
  KUT), with the ratios.
"""

import os
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

import peat_jax as peat
from peat_jax import _campaign
from peat_jax import models

_SCENARIO = flags.DEFINE_string("scenario", "cnn", "Training scenario.")
_KUT = flags.DEFINE_string("kut", "native:conv2d:in_bf16", "KUT spec.")
_CHECKPOINTS = flags.DEFINE_integer("checkpoints", 5,
                                    "Checkpoints played back.")


def _bytes(shapes, dtypes) -> int:
  return int(sum(np.prod(s, dtype=np.int64) * np.dtype(d).itemsize
                 for s, d in zip(shapes, dtypes)))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  task = models.get_task(_SCENARIO.value)
  n = _CHECKPOINTS.value
  with tempfile.TemporaryDirectory() as tmp:
    g = peat.golden_train(task, os.path.join(tmp, "golden"), steps=2 * n,
                          checkpoint_every=2, evaluate=False)
    state, batch = g.state, task.batch_at(int(g.state.data_position))
    task.train_step(state, batch)  # warm
    times = []
    for _ in range(30):
      t0 = time.perf_counter()
      _, m = task.train_step(state, batch)
      float(m["loss"])
      times.append(time.perf_counter() - t0)
    step_s = float(np.median(times))
    pb = _campaign.playback(task, g.workdir, _KUT.value, campaign_dir=tmp)
    rt = []
    for st in g.steps[1:-1]:
      t0 = time.perf_counter()
      peat.restore_state(g.checkpoint_dir, task, st)
      rt.append(time.perf_counter() - t0)
    restore_s = float(np.mean(rt))
    stored = os.path.getsize(os.path.join(tmp, _campaign.PLAYBACK_FILE))
    table = peat.discover_sites(task.step_fn, state, batch)
    all_out = sum(_bytes(s.out_shapes, s.out_dtypes) for s in table)
    sel = [s for s in table if s.name in set(pb.sites)]
    sel_io = sum(_bytes(s.in_shapes, s.in_dtypes)
                 + 2 * _bytes(s.out_shapes, s.out_dtypes) for s in sel)
    steps = len(pb.effects)
    print(f"scenario {task.name}, KUT {_KUT.value}, {len(pb.sites)} selected "
          f"sites of {len(table)}, {steps} checkpoints played back")
    print("| quantity | value | ratio |")
    print("| --- | --- | --- |")
    print(f"| golden train step (median of 30) | {step_s * 1e3:.2f} ms | 1 |")
    print(f"| playback per checkpoint (warm mean of {steps - 1}) | "
          f"{pb.seconds_per_step * 1e3:.1f} ms | "
          f"{pb.seconds_per_step / step_s:.1f} |")
    print(f"| of which: checkpoint restore (Orbax, mean) | "
          f"{restore_s * 1e3:.1f} ms | {restore_s / step_s:.1f} |")
    print(f"| playback per checkpoint without the restore | "
          f"{(pb.seconds_per_step - restore_s) * 1e3:.1f} ms | "
          f"{(pb.seconds_per_step - restore_s) / step_s:.1f} |")
    print(f"| playback.msgpack ({len(pb.records)} site records) | "
          f"{stored / 1024:.1f} KiB | 1 |")
    print(f"| every site's outputs at every step | "
          f"{all_out * steps / 2**20:.2f} MiB | {all_out * steps / stored:.0f} |")
    print(f"| selected sites' inputs + golden + KUT outputs | "
          f"{sel_io * steps / 2**20:.2f} MiB | {sel_io * steps / stored:.0f} |")
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))
