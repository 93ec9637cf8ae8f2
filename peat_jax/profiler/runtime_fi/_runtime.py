"""Runtime FI: train with the KUT at a frequency, compare with golden.

Each frequency (every call, every n-th step, a seeded fraction of calls)
trains from a golden checkpoint with the KUT substituted; losses are
compared with the golden trajectory against the golden run's own
seed-to-seed spread, and the first divergent step is reported. At the saved
golden steps inside the window every run's weights are compared with the
golden ones, next to the same distance of the seed-to-seed runs and of a
bf16-proxy run (:mod:`peat_jax.profiler.runtime_fi._weights`): the training-level
significance of the KUT (:mod:`peat_jax.profiler.runtime_fi._significance`).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax.profiler import files as _files
from peat_jax.profiler import golden as _golden
from peat_jax.profiler.runtime_fi import _significance
from peat_jax.profiler.runtime_fi import _weights
from peat_jax import sites as _sites
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.kernels import kut as _kut
from peat_jax.profiler.golden import saved_steps
from peat_jax.profiler.playback_fi import select_calls
from peat_jax.profiler.files import (
    RUNTIME_FILE, append_records, of_campaign, read_records, tag_backward)
from peat_jax.profiler.golden import TrainTask


def parse_frequency(freq: str) -> tuple[Any, str]:
  """``every`` / ``every_<n>`` / ``fraction_<p>`` -> (schedule, label)."""
  if freq == "every":
    return _sites.EveryCall(), "every call"
  if freq.startswith("every_"):
    try:
      n = int(freq[6:])
    except ValueError:
      n = 0
    if n >= 1:
      return _sites.EveryNSteps(n), f"every {n}th step"
  if freq.startswith("fraction_"):
    try:
      p = float(freq[9:])
    except ValueError:
      p = -1.0
    if 0.0 < p <= 1.0:
      return _sites.Fraction(p, seed=0), f"{p:.0%} of calls (seed 0)"
  raise PeatError(f"unknown frequency {freq!r}; expected 'every', "
                  "'every_<n>' (n >= 1) or 'fraction_<p>' (0 < p <= 1), e.g. "
                  "'every_4', 'fraction_0.25'")


#: Record names of runtime FI's references: the golden trajectory, the
#: golden seed-to-seed spread and the bf16-proxy run (not frequencies).
REFERENCE_RUNS = ("golden", "spread", "bf16")


def _train(step, state, batch_at, n: int,
           watch: Callable[[int, Any], None] | None = None) -> list[float]:
  """Trains ``n`` steps: the losses; ``watch(count, params)`` after each."""
  losses = []
  for i in range(n):
    state, m = step(state, batch_at(int(state.data_position)))
    losses.append(float(m["loss"]))
    if watch is not None:
      watch(i + 1, state.params)
  return losses


def envelope(spread: Sequence[float], window: int = 10) -> np.ndarray:
  """Running max of the golden seed-to-seed loss spread over a window."""
  s = np.asarray(spread, np.float64)
  return np.array([s[max(0, i - window + 1):i + 1].max() if len(s) else 0.0
                   for i in range(len(s))])


def divergence(loss: Sequence[float], golden: Sequence[float],
               env: Sequence[float], *, consecutive: int = 5,
               factor: float = 3.0) -> tuple[int | None, str | None]:
  """First divergent index and why (None, None when the run stays close).

  Divergent: non-finite loss; loss above 10x golden; or |loss - golden|
  beyond ``factor`` x the envelope for ``consecutive`` steps in a row (the
  first of them is reported).
  """
  run = 0
  for i, (l, g, e) in enumerate(zip(loss, golden, env)):
    if not math.isfinite(l):
      return i, f"loss is {l} (non-finite)"
    if l > 10 * abs(g):
      return i, f"loss {l:.4g} > 10x golden {g:.4g}"
    run = run + 1 if abs(l - g) > factor * e else 0
    if run >= consecutive:
      j = i - consecutive + 1
      return j, (f"|loss - golden| beyond {factor:g}x the seed-to-seed "
                 f"envelope for {consecutive} consecutive steps from step "
                 f"{j}")
  return None, None


class RuntimeResult(NamedTuple):
  """What :func:`runtime` recorded.

  Attributes:
    runs: one mapping per frequency in the report's ``runtime`` schema.
    spread: ``{"steps", "loss_spread"}`` (golden seed-to-seed spread).
    golden_loss: golden losses from the start state.
  """

  runs: list
  spread: dict
  golden_loss: list


def run_frequencies(scheds: Sequence[tuple[str, Any, str]], *,
                    byname: dict, keep: Callable[[str, dict], None],
                    golden_step: Callable, fresh_state: Callable[[int], Any],
                    state0, batch_at: Callable, steps: int, start_step: int,
                    seeds: Sequence[int], kut_step: Callable[[Any], Callable],
                    say: Callable[[str], None], where: str = "",
                    weights: "_weights.WeightProbe | None" = None
                    ) -> RuntimeResult:
  """The runtime FI loop shared by :func:`runtime` and data-parallel runs.

  Trains the golden trajectory and the seed-to-seed spread (unless
  recorded), the bf16 proxy (with ``weights``, unless recorded or no
  frequency is left to run), then each frequency not yet recorded, and
  keeps each result as soon as it exists.

  Args:
    scheds: ``(name, schedule, label)`` per frequency.
    byname: the records already kept, by name (``keep`` adds to it).
    keep: ``keep(name, fields)`` appends one record and adds it to byname.
    golden_step: the golden train step.
    fresh_state: ``fresh_state(seed)``: a freshly initialised state.
    state0: the start state (the golden checkpoint ``start_step``).
    batch_at: batch at a data position.
    steps: steps per run.
    start_step: the first step's number.
    seeds: seeds of the spread.
    kut_step: ``kut_step(schedule)``: the step with the KUT at that
      schedule (built only for frequencies still to run).
    say: progress lines.
    where: appended to a frequency's label in its progress line.
    weights: records the weight distances at its saved steps (and trains
      the bf16 proxy); None: losses only.

  Returns:
    A :class:`RuntimeResult`.
  """
  counts = [s - start_step for s in weights.steps] if weights else []

  def train(step, state, reference=None) -> tuple[list[float], dict | None]:
    if weights is None:
      return _train(step, state, batch_at, steps), None
    tr = _weights.Tracker(counts, reference or (
        lambda c: weights.golden(start_step + c)), offset=start_step)
    return _train(step, state, batch_at, steps, tr.see), tr.record()

  if "golden" not in byname:
    loss, w = train(golden_step, state0)
    keep("golden", {"loss": loss, "weights": w})
  golden = byname["golden"]["loss"]
  if "spread" not in byname:
    base_params: dict = {}  # the seed-0 run's weights at the saved counts

    def keep_base(count: int, params) -> None:
      if count in counts:
        base_params[count] = params

    if start_step == 0:
      base, ref = golden, None  # golden: the checkpoints themselves
    else:
      base = _train(golden_step, fresh_state(0), batch_at, steps, keep_base)
      ref = base_params.__getitem__
    runs = [train(golden_step, fresh_state(seed), ref) for seed in seeds]
    sp = np.max([np.abs(np.asarray(l) - np.asarray(base))
                 for l, _ in runs], axis=0).tolist()
    keep("spread", {"loss": sp, "weights": _weights.worst(
        [w for _, w in runs])})
  spread = byname["spread"]["loss"]
  env = envelope(spread)
  step_ids = list(range(start_step, start_step + steps))
  todo = [f for f, _, _ in scheds if f not in byname]
  if weights is not None and "bf16" not in byname and todo:
    t0 = time.perf_counter()
    loss, w = train(weights.bf16_step(), state0)
    proxy = weights.proxy()
    keep("bf16", {"loss": loss, "label": _significance.BF16_LABEL,
                  "weights": w, "proxy": proxy})
    say(f"{_significance.proxy_label(proxy)}{where}: {steps} steps, final "
        f"loss "
        f"{loss[-1]:.6g} (golden {golden[-1]:.6g}), the yardstick of the "
        f"weight distances ({time.perf_counter() - t0:.1f} s)")
  for f, sched, label in scheds:
    if f not in byname:
      t0 = time.perf_counter()
      loss, w = train(kut_step(sched), state0)
      at, why = divergence(loss, golden, env)
      keep(f, {"loss": loss, "label": label,
               "diverged_at": None if at is None else step_ids[at],
               "reason": why, "weights": w})
      say(f"runtime {label}{where}: {steps} steps, final loss "
          f"{loss[-1]:.6g} (golden {golden[-1]:.6g}), "
          + (f"diverged at step {step_ids[at]}: {why}" if at is not None
             else "no divergence")
          + _significance.progress_note(byname, f)
          + f" ({time.perf_counter() - t0:.1f} s)")
  return runtime_result(list(byname.values()), [f for f, _, _ in scheds],
                        steps, start_step)


def runtime_result(records: Sequence[dict], frequencies: Sequence[str],
                   steps: int, start_step: int) -> RuntimeResult:
  """A :class:`peat_jax.RuntimeResult` from ``runtime.msgpack`` records.

  The one builder of runtime runs in the report's schema (runtime FI,
  isolated runtime FI and the report read from a campaign directory).

  Args:
    records: the records of one KUT and one (steps, start_step) group.
    frequencies: the frequencies to report, in order; those without a
      record are left out.
    steps: steps per run.
    start_step: the first step's number.

  Returns:
    A :class:`RuntimeResult`. A crashed frequency (process isolation) has
    ``crashed: True``, empty ``steps``, ``loss`` and ``golden_loss``, and
    the crash in ``reason``. A run with weight distances has
    ``significance`` (:func:`peat_jax.profiler.runtime_fi._significance.significance`);
    the spread has ``bf16_loss`` when the bf16 proxy ran.
  """
  byname = {r["name"]: r for r in records}
  golden = byname.get("golden", {}).get("loss", [])
  spread = byname.get("spread", {}).get("loss", [])
  bf16 = byname.get("bf16", {})
  step_ids = list(range(start_step, start_step + steps))
  runs = []
  for f in frequencies:
    if f not in byname:
      continue
    r = byname[f]
    crashed = r.get("crash") is not None
    run = {"frequency": r["label"],
           "steps": [] if crashed else step_ids, "loss": r["loss"],
           "golden_loss": [] if crashed else golden,
           "diverged_at": r["diverged_at"], "reason": r["reason"],
           "crashed": crashed}
    sig = _significance.significance(
        r.get("weights"), byname.get("spread", {}).get("weights"),
        bf16.get("weights"), proxy=bf16.get("proxy", "bf16"))
    if sig is not None:
      run["significance"] = sig
    runs.append(run)
  out = {"steps": step_ids if spread else [], "loss_spread": spread}
  if spread and len(bf16.get("loss") or []) == len(spread):
    out["bf16_loss"] = bf16["loss"]
  return RuntimeResult(runs, out, golden)


def runtime(task: TrainTask, golden_dir: str | os.PathLike,
            kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec", *,
            frequencies: Sequence[str] = ("every", "every_4",
                                          "fraction_0.25"),
            steps: int = 50, start_step: int = 0,
            seeds: Sequence[int] = (1, 2),
            campaign_dir: str | os.PathLike | None = None,
            select: str | Sequence[str] | None = None,
            progress: Callable[[str], None] | None = None,
            backward: str = "golden") -> RuntimeResult:
  """Runtime FI: train with the KUT at a frequency and compare with golden.

  From the golden checkpoint ``start_step`` each frequency trains ``steps``
  steps with ``peat.substitute(step_fn, ..., schedule=...)`` (jitted once
  per frequency); the golden trajectory is retrained from the same state.
  The golden seed-to-seed spread comes from fresh runs with ``seeds`` (same
  steps, from ``task.init_state(seed)``); its running-max envelope sets the
  divergence threshold (:func:`divergence`). At the golden run's saved
  steps inside the window, every run's weights are compared with the
  golden checkpoint there, and a bf16-proxy run is trained as a yardstick
  (:mod:`peat_jax.profiler.runtime_fi._weights`). Finished frequencies in
  ``runtime.msgpack`` are skipped.

  With ``backward="kut"`` the KUT's VJP runs at the backward sites of the
  selected forward sites too, under the same schedule: a backward site
  follows the decision of the forward call it belongs to (a call of the
  KUT is its forward and its backward). Records carry the setting
  (``"backward": "kut"``), so the two never mix.

  Returns:
    A :class:`RuntimeResult`.

  Raises:
    PeatError: unknown spec or frequency, a bad ``backward``, a backward
      site the KUT's VJP cannot run at.
  """
  _core.ensure_compilation_cache()  # compile once, reuse after
  kut = _kut.checked(kut_spec, backward)
  kut_spec = kut.name  # the records' key
  say = progress or (lambda s: None)
  _, ckpt, campaign_dir = _files.campaign_dirs(golden_dir, campaign_dir)
  path = os.path.join(campaign_dir, RUNTIME_FILE)
  old = [r for r in read_records(path) if of_campaign(r, kut_spec, backward)
         and r.get("n") == steps and r.get("start") == start_step]
  byname = {r["name"]: r for r in old}
  scheds = [(f, *parse_frequency(f)) for f in frequencies]
  state0 = _golden.restore_state(ckpt, task, start_step)
  weights = _weights.probe(
      task.step_fn, jax.jit, saved=saved_steps(ckpt), start_step=start_step,
      steps=steps, restore=lambda s: _golden.restore_state(ckpt, task, s),
      state=state0, batch=task.batch_at(int(state0.data_position)))

  def keep(name, rec):
    rec = tag_backward({"kut": kut_spec, "n": steps, "start": start_step,
                        "name": name, **rec}, backward)
    append_records(path, [rec])
    byname[name] = rec

  subs = []  # the KUT's substitution, built on first use

  def kut_step(sched):
    if not subs:
      batch = task.batch_at(int(state0.data_position))
      chosen, _ = select_calls(task, state0, batch, kut, select, backward)
      subs.append(_sites.Substitution(
          chosen[0].sub.kut, sites=tuple(c.site.name for c in chosen),
          backward=backward))
    return jax.jit(_sites.substitute(
        task.step_fn, subs[0]._replace(schedule=sched)))

  return run_frequencies(
      scheds, byname=byname, keep=keep, golden_step=task.train_step,
      fresh_state=lambda seed: _golden.committed(task.init_state(seed)),
      state0=state0, batch_at=task.batch_at,
      steps=steps, start_step=start_step, seeds=seeds, kut_step=kut_step,
      say=say, weights=weights)
