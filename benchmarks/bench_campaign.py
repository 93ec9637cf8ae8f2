"""Cost of playback FI and runtime FI, and storage of playback records.

Usage::

  python benchmarks/bench_campaign.py [--scenario=cnn] [--kut=native:conv2d:in_bf16]
  python benchmarks/bench_campaign.py --scenario=gpt --kut=native:matmul:in_bf16

In one process: a short golden run, then, every ratio against the golden
train step measured in the same run (median of ``--repeats`` warm calls):

* playback per checkpoint: ``Player.play`` on a restored state (tapped and
  substituted steps in one jitted call, float64 references, signatures,
  diagnoses, update difference), and of it the fused two-step call alone
  (the compute floor of this design: one golden step with the KUT tapped at
  every selected site plus one step with the KUT substituted); the Orbax
  restore; and :func:`playback` end to end per checkpoint (warm mean, the
  first checkpoint's compilation excluded, and the first checkpoint with
  it), restoring in this thread
  (``prefetch=0``) and in a background thread ahead of play
  (``prefetch=1``); ``--kut=golden`` gives a lower bound of the
  framework's cost (the KUT is the golden kernel, so the two steps are one
  computation and XLA merges them);
* runtime FI: one jitted step with the KUT substituted at every call, every
  4th step and a seeded 25% of calls vs the plain golden step, each at
  steps that cover the schedule (median of ``--repeats`` rounds of 4
  consecutive steps, interleaved with the golden step);
* with ``--together``: :func:`playback_many` of ``--kut`` and those KUTs,
  its wall time per checkpoint divided by the number of KUTs;
* storage: bytes of ``playback.msgpack`` vs storing every site's output
  activations (all sites of the step: fwd, bwd, upd) at every played-back
  step, and vs storing the selected sites' inputs and outputs (golden and
  KUT).
"""

import collections
import json
import os
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

import peat_jax as peat
from peat_jax import models

_SCENARIO = flags.DEFINE_string("scenario", "cnn", "Training scenario.")
_KUT = flags.DEFINE_string("kut", "native:conv2d:in_bf16", "KUT spec.")
_CHECKPOINTS = flags.DEFINE_integer("checkpoints", 5,
                                    "Checkpoints played back.")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Repeats of each timing.")
_TOGETHER = flags.DEFINE_list(
    "together", [], "More KUT specs played back with --kut in one "
    "`playback_many` (one restore and golden step per checkpoint); adds "
    "its cost per checkpoint and per KUT.")
_PARTS = flags.DEFINE_list(
    "parts", ["play", "e2e", "runtime", "storage"],
    "Parts to measure: play, e2e, runtime, storage (storage needs e2e).")
_JSON = flags.DEFINE_string("json", None,
                            "Also write the figures to this JSON file.")


def _bytes(shapes, dtypes) -> int:
  return int(sum(np.prod(s, dtype=np.int64) * np.dtype(d).itemsize
                 for s, d in zip(shapes, dtypes)))


def _median(fn, n: int) -> float:
  fn()  # warm (compiles)
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def _steps(step, state, batch_at, n: int):
  """Runs ``n`` consecutive steps from ``state`` and waits for the last."""
  def run():
    s = state
    for _ in range(n):
      s, m = step(s, batch_at(int(s.data_position)))
    jax.block_until_ready(m["loss"])
  return run


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  parts = set(_PARTS.value)
  unknown = parts - {"play", "e2e", "runtime", "storage"}
  if unknown or ("storage" in parts and "e2e" not in parts):
    raise app.UsageError(f"--parts={','.join(_PARTS.value)}: expected a "
                         "subset of play,e2e,runtime,storage (storage needs "
                         "e2e)")
  task = models.get_task(_SCENARIO.value)
  kut, n, reps = _KUT.value, _CHECKPOINTS.value, _REPEATS.value
  rows, notes = [], []
  figures = {"scenario": task.name, "kut": kut, "jax": jax.__version__,
             "backend": jax.default_backend(),
             "device": str(jax.devices()[0].device_kind), "rows": []}

  def row(what, seconds, base):
    rows.append(f"| {what} | {seconds * 1e3:.1f} ms | {seconds / base:.2f} |")
    figures["rows"].append({"what": what, "seconds": seconds,
                            "ratio_to_golden_step": seconds / base})

  with tempfile.TemporaryDirectory() as tmp:
    g = peat.golden_train(task, os.path.join(tmp, "golden"), steps=2 * n,
                          checkpoint_every=2, evaluate=False)
    state = peat.restore_state(g.checkpoint_dir, task, g.steps[1])
    batch = task.batch_at(int(state.data_position))

    def golden():
      jax.block_until_ready(task.train_step(state, batch)[1]["loss"])

    step_s = _median(golden, 2 * reps)
    row("golden train step (median)", step_s, step_s)

    calls, _ = peat.profiler.select_calls(task, state, batch, kut, None)
    ksub = peat.Substitution(
        calls[0].sub.kut, sites=tuple(c.site.name for c in calls))
    figures["selected_sites"] = len(calls)
    if "play" in parts:
      _play(task, kut, g, state, batch, ksub, reps, step_s, row, notes)

    # Playback end to end, both restore modes (a fresh Player each: the
    # first checkpoint compiles and is not counted).
    if "e2e" in parts:
      pb, steps = _end_to_end(task, kut, g, tmp, step_s, row)
    if "runtime" in parts:
      _runtime(task, state, ksub, reps, row)
    if "storage" in parts:
      storage = _storage(task, state, batch, pb, tmp)

  played = f", {steps} checkpoints played back" if "e2e" in parts else ""
  print(f"scenario {task.name}, KUT {kut}, {len(calls)} selected sites"
        f"{played}, {os.cpu_count()} CPUs, {jax.default_backend()} "
        f"({figures['device']}), load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
  print("| quantity | time | ratio to the golden step |")
  print("| --- | --- | --- |")
  print("\n".join(rows))
  for line in notes:
    print(line)
  figures["notes"] = notes
  if "storage" in parts:
    stored, all_out, sel_io, n_records = storage
    print()
    print("| storage | size | ratio to playback.msgpack |")
    print("| --- | --- | --- |")
    print(f"| playback.msgpack ({n_records} site records) | "
          f"{stored / 1024:.1f} KiB | 1 |")
    print(f"| every site's outputs at every step | "
          f"{all_out * steps / 2**20:.2f} MiB | "
          f"{all_out * steps / stored:.0f} |")
    print(f"| selected sites' inputs + golden + KUT outputs | "
          f"{sel_io * steps / 2**20:.2f} MiB | {sel_io * steps / stored:.0f} |")
    figures["storage"] = {"playback_bytes": stored,
                          "all_outputs_bytes": all_out * steps,
                          "selected_io_bytes": sel_io * steps}
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(figures, f, indent=1)
  return 0


def _play(task, kut, g, state, batch, ksub, reps, step_s, row, notes):
  """One checkpoint's playback parts, warm."""
  player = peat.profiler.Player(task, kut, state, batch)
  kstep = jax.jit(peat.substitute(task.step_fn, ksub))
  row("step with the KUT substituted (median)",
      _median(lambda: jax.block_until_ready(kstep(state, batch)), reps),
      step_s)
  two = _median(lambda: jax.block_until_ready(
      player._steps(state, batch)), reps)  # pylint: disable=protected-access
  play = _median(lambda: player.play(g.steps[1], state), reps)
  restore_once = _median(lambda: peat.restore_state(
      g.checkpoint_dir, task, g.steps[1]), reps)
  row("playback per checkpoint without the restore (`Player.play`)",
      play, step_s)
  row("of which: tapped + substituted steps (one jitted call)", two,
      step_s)
  # Where a checkpoint's time goes: every phase waits for its device work
  # (Player.play(timings=...)), mean of `reps` warm calls. The first
  # checkpoint of a campaign runs the port probe whole where a record
  # calls for it (a fresh probe cache each time); a later one carries it
  # (the cache holds the first checkpoint's probes).
  first, later = {}, {}
  for _ in range(reps):
    player._probe_cache = peat.profiler.ProbeCache()  # pylint: disable=protected-access
    player.play(g.steps[1], state, timings=first)
  player.play(g.steps[1], state)  # the campaign's first checkpoint
  state2 = peat.restore_state(g.checkpoint_dir, task, g.steps[2])
  player.play(g.steps[2], state2)  # warm (what a carried probe compiles)
  for _ in range(reps):
    player.play(g.steps[2], state2, timings=later)
  totals = {}
  for label, phases in (("first checkpoint", first),
                        ("later checkpoint", later)):
    totals[label] = sum(phases.values()) / reps
    row(f"{label}: phases, each waited for (`Player.play(timings=...)`, "
        "mean)", totals[label], step_s)
    for name, sec in phases.items():
      row(f"- {name}", sec / reps, step_s)
  recs = player.play(g.steps[2], state2)[:-1]
  paths = collections.Counter(r["decided_by"] for r in recs)
  notes.append("a later checkpoint's records, decided by: " + ", ".join(
      f"{k} {v}" for k, v in sorted(paths.items())))
  reader = peat.profiler.StateReader(g.checkpoint_dir, task)
  restore = _median(lambda: reader.restore(g.steps[1]), reps)
  reader.close()
  row("amortized over 4 checkpoints, restore in turn: (first + 3 later) / 4"
      " + restore", (totals["first checkpoint"]
                     + 3 * totals["later checkpoint"]) / 4 + restore, step_s)
  notes.append(f"first / later checkpoint (phases): "
               f"{totals['first checkpoint'] / totals['later checkpoint']:.2f}")
  row("checkpoint restore (Orbax, one `StateReader` for all, median)",
      restore, step_s)
  row("checkpoint restore alone (`peat.restore_state`, median)",
      restore_once, step_s)


def _end_to_end(task, kut, g, tmp, step_s, row):
  """`playback` end to end, both restore modes, and ``--together``.

  Returns:
    (the prefetch=1 PlaybackResult, the checkpoints it played back).
  """
  per = {}
  for ahead in (0, 1):
    d = os.path.join(tmp, f"pb{ahead}")
    t0 = time.perf_counter()
    pb = peat.playback(task, g.workdir, kut, campaign_dir=d, prefetch=ahead)
    wall = time.perf_counter() - t0
    per[ahead] = pb.seconds_per_step
  steps = len(pb.effects)
  row("`playback`'s first checkpoint, compilation included (prefetch=1: "
      "the run's wall time less the warm checkpoints)",
      wall - (steps - 1) * per[1], step_s)
  row(f"`playback` per checkpoint, restore in turn (prefetch=0, warm mean "
      f"of {steps - 1})", per[0], step_s)
  row(f"`playback` per checkpoint, restore ahead (prefetch=1, warm mean "
      f"of {steps - 1})", per[1], step_s)
  if _TOGETHER.value:
    specs = [kut] + _TOGETHER.value
    many = peat.playback_many(task, g.workdir, specs,
                              campaign_dir=os.path.join(tmp, "many"))
    each = many[kut].seconds_per_step / len(specs)
    row(f"`playback_many` of {len(specs)} KUTs per checkpoint and KUT "
        f"(prefetch=1, warm mean of {steps - 1})", each, step_s)
  return pb, steps


def _runtime(task, state, ksub, reps, row):
  """Runtime FI: substituted steps at each frequency vs the plain step."""
  runs = {"golden step (4 steps)": _steps(task.train_step, state,
                                         task.batch_at, 4)}
  for f in ("every", "every_4", "fraction_0.25"):
    sched, label = peat.profiler.parse_frequency(f)
    fstep = jax.jit(peat.substitute(task.step_fn,
                                    ksub._replace(schedule=sched)))
    runs[f"runtime FI, KUT at {label} (4 steps)"] = _steps(
        fstep, state, task.batch_at, 4)
  for fn in runs.values():
    fn()  # compile
  times = {k: [] for k in runs}
  for _ in range(reps):
    for k, fn in runs.items():
      t0 = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - t0)
  base4 = float(np.median(times["golden step (4 steps)"]))
  for k, v in times.items():
    row(k, float(np.median(v)), base4)


def _storage(task, state, batch, pb, tmp):
  """Bytes of playback.msgpack vs the activations it replaces.

  Returns:
    (stored bytes, bytes of every site's outputs per step, bytes of the
    selected sites' inputs and outputs per step, site records).
  """
  stored = os.path.getsize(os.path.join(tmp, "pb1",
                                        peat.profiler.PLAYBACK_FILE))
  table = peat.discover_sites(task.step_fn, state, batch)
  all_out = sum(_bytes(s.out_shapes, s.out_dtypes) for s in table)
  sel = [s for s in table if s.name in set(pb.sites)]
  sel_io = sum(_bytes(s.in_shapes, s.in_dtypes)
               + 2 * _bytes(s.out_shapes, s.out_dtypes) for s in sel)
  return stored, all_out, sel_io, len(pb.records)


if __name__ == "__main__":
  sys.exit(app.run(main))
