"""Golden profile: golden training plus captured site inputs under a budget.

:func:`profile` runs (or resumes) the golden run of a campaign and captures,
for chosen sites at chosen steps, what op-level playback needs to rerun each
site without the model: the site's inputs, the golden kernel's outputs and
the call parameters (``<campaign>/captures/``, docs/campaign.md).

Capture never touches the golden trajectory: the golden run is
:func:`peat_jax.golden_train` itself, and each capture step s is replayed
from the nearest saved checkpoint at or before s with the same jitted train
step (bitwise, same machine), then the tapped step runs once on that state
and its outputs are discarded.

The storage budget is applied before anything runs: every candidate record
(capture step, site) gets its size from the traced shapes (an upper bound of
its file size, :func:`peat_jax.profiler.capture._capture_io.planned_bytes`); candidates are
taken in the priority order

  1. capture steps ascending (every selected site at the earliest step
     before any site at a later step),
  2. within a step, sites in execution order,

and each is kept when it fits in what is left of the budget, else skipped
(first fit). The skipped records are listed in the index and in the result.
A budget smaller than the smallest record is an error.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax.profiler import files as _files
from peat_jax.profiler.capture import _capture_io as io
from peat_jax.profiler import golden as _golden
from peat_jax import sites as _sites
from peat_jax.profiler.golden import saved_steps
from peat_jax.core import PeatError
from peat_jax.profiler.golden import TrainTask

CAPTURE_DIR = _files.CAPTURE_DIR


class Candidate(NamedTuple):
  """One (step, site) record the profile may capture.

  Attributes:
    step: the capture step (the step's inputs, before its update).
    site: the site.
    bytes: upper bound of its file size.
    file: its path relative to the captures directory.
  """

  step: int
  site: _sites.Site
  bytes: int
  file: str


class CapturePlan(NamedTuple):
  """Which candidates fit the budget (:func:`plan`).

  Attributes:
    kept: candidates to capture, priority order.
    skipped: candidates over the budget, priority order.
    budget_bytes: the budget.
    planned_bytes: sum of the kept candidates' sizes (<= budget).
  """

  kept: list
  skipped: list
  budget_bytes: int
  planned_bytes: int


class ProfileResult(NamedTuple):
  """What :func:`profile` produced.

  Attributes:
    directory: the campaign directory.
    golden: the golden run (:class:`peat_jax.GoldenResult`).
    captures_dir: ``<campaign>/captures`` (None when nothing was selected).
    captured: index entries of the captured records, priority order.
    skipped: ``{"step", "site", "bytes", "reason"}`` of each record left out.
    used_bytes: bytes of the capture files on disk.
    budget_bytes: the budget.
  """

  directory: str
  golden: _golden.GoldenResult
  captures_dir: str | None
  captured: list
  skipped: list
  used_bytes: int
  budget_bytes: int | None


def _safe(name: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def record_file(step: int, site: str) -> str:
  """A record's path relative to the captures directory."""
  return f"step_{step:06d}/{_safe(site)}.npz"


def _tap_arrays(tap: _sites.Tap) -> dict:
  outs = tap.golden if isinstance(tap.golden, tuple) else (tap.golden,)
  arrays = {f"in{i}": x for i, x in enumerate(tap.inputs)}
  arrays.update({f"out{i}": x for i, x in enumerate(outs)})
  return arrays


def plan(candidates: Sequence[Candidate], budget_bytes: int) -> CapturePlan:
  """First-fit selection of candidates (priority order) under a budget.

  Args:
    candidates: in priority order (module docstring).
    budget_bytes: the storage budget in bytes.

  Returns:
    A :class:`CapturePlan`.

  Raises:
    PeatError: a budget that is not a positive integer, or one smaller than
      the smallest candidate.
  """
  if (isinstance(budget_bytes, bool) or not isinstance(budget_bytes,
                                                       (int, np.integer))
      or budget_bytes <= 0):
    raise PeatError(f"budget_bytes must be a positive integer (bytes); got "
                    f"{budget_bytes!r}")
  if not candidates:
    raise PeatError("nothing to capture: no (step, site) candidate")
  smallest = min(candidates, key=lambda c: c.bytes)
  if budget_bytes < smallest.bytes:
    raise PeatError(
        f"capture budget of {budget_bytes} bytes is smaller than the smallest "
        f"record ({smallest.bytes} bytes: site {smallest.site.name!r} at step "
        f"{smallest.step}); expected at least {smallest.bytes} bytes. Fix: "
        "raise the budget or capture smaller sites")
  kept, skipped, left = [], [], int(budget_bytes)
  for c in candidates:
    if c.bytes <= left:
      kept.append(c)
      left -= c.bytes
    else:
      skipped.append(c)
  return CapturePlan(kept, skipped, int(budget_bytes),
                     int(budget_bytes) - left)


def capture_step_list(capture_steps: int | Sequence[int] | None, steps: int,
                      checkpoint_every: int) -> list[int]:
  """The capture steps of a profile, ascending.

  Args:
    capture_steps: a list of steps, an interval k (0, k, 2k, ... < steps),
      or None for the checkpoint steps before the last (0, k, 2k, ...).
    steps: golden training steps.
    checkpoint_every: checkpoint interval.

  Returns:
    Sorted unique steps in [0, steps - 1].

  Raises:
    PeatError: a step outside the run, an interval < 1, no step.
  """
  if capture_steps is None:
    out = list(range(0, steps, checkpoint_every))
  elif isinstance(capture_steps, (int, np.integer)) and not isinstance(
      capture_steps, bool):
    if capture_steps < 1:
      raise PeatError(f"capture_steps as an interval must be >= 1; got "
                      f"{capture_steps}")
    out = list(range(0, steps, int(capture_steps)))
  else:
    out = sorted({int(s) for s in capture_steps})
  bad = [s for s in out if not 0 <= s < steps]
  if bad:
    raise PeatError(f"capture steps {bad} are outside the run; expected "
                    f"steps in [0, {steps - 1}] (step s captures the inputs "
                    "of the update from s to s + 1)")
  if not out:
    raise PeatError("capture_steps selects no step")
  return out


def _settings(task: TrainTask, steps: int, every: int, seed: int,
              selection: dict, capture_steps: list, budget: int) -> dict:
  return {"task": task.name,
          "task_config": json.dumps(task.config, sort_keys=True, default=str),
          "seed": seed, "steps": steps, "checkpoint_every": every,
          "selection": selection, "capture_steps": capture_steps,
          "budget_bytes": budget}


def _check_index(captures_dir: str, settings: dict) -> dict | None:
  if not os.path.exists(os.path.join(captures_dir, io.INDEX_FILE)):
    return None
  index = io.read_index(captures_dir)
  diff = sorted(k for k in settings if index["settings"].get(k) != settings[k])
  if diff:
    got = "; ".join(f"{k}: stored {index['settings'].get(k)!r}, got "
                    f"{settings[k]!r}" for k in diff)
    raise PeatError(f"{captures_dir} holds captures made with other settings "
                    f"({got}). Fix: use another campaign directory or the "
                    "stored settings")
  return index


def profile(task: TrainTask, campaign_dir: str | os.PathLike, *,
            steps: int | None = None, checkpoint_every: int | None = None,
            capture_sites: str | Sequence[str] | None = None,
            capture_kernel: str | Sequence[str] | None = None,
            capture_phase: str | Sequence[str] | None = None,
            capture_steps: int | Sequence[int] | None = None,
            budget_bytes: int | None = None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> ProfileResult:
  """Golden run of a campaign plus captured site inputs under a budget.

  >>> r = profile(task, "runs/c1", steps=40, checkpoint_every=10,
  ...             capture_kernel="conv_general_dilated", capture_phase="fwd",
  ...             capture_steps=10, budget_bytes=64 << 20)  # doctest: +SKIP
  >>> r.captured[0]["file"], r.skipped                      # doctest: +SKIP

  Args:
    task: the model scenario.
    campaign_dir: the campaign directory; the golden run goes to
      ``<campaign>/golden`` (shared with :func:`peat_jax.validate`), the
      captures to ``<campaign>/captures``. Running again resumes both.
    steps: golden training steps (task default when None).
    checkpoint_every: checkpoint interval (task default when None).
    capture_sites: an ``fnmatch`` pattern over site names, or site names.
    capture_kernel: kernel name(s) to capture (e.g. ``"dot_general"``).
    capture_phase: ``"fwd"``, ``"bwd"``, ``"upd"`` or several.
    capture_steps: steps whose inputs to capture: a list, an interval k
      (0, k, 2k, ... < steps) or None for the saved checkpoint steps
      before the last.
    budget_bytes: storage budget of the capture files (required when a
      capture selection is given).
    seed: golden seed.
    progress: called with one line per checkpoint and per capture step.

  Returns:
    A :class:`ProfileResult`.

  Raises:
    PeatError: a selection that matches no site, a parameter that cannot be
      stored, bad capture steps, a missing or too small budget, captures of
      other settings in the directory, or a campaign running there.
  """
  say = progress or (lambda s: None)
  directory = os.path.abspath(os.fspath(campaign_dir))
  steps = int(steps or task.default_steps)
  every = int(checkpoint_every or task.default_checkpoint_every)
  selection = {"sites": capture_sites, "kernel": capture_kernel,
               "phase": capture_phase}
  capturing = any(v is not None for v in selection.values())
  if capturing and budget_bytes is None:
    raise PeatError("a capture selection needs a storage budget: pass "
                    "budget_bytes (e.g. 64 << 20 for 64 MiB)")
  with _files.campaign_lock(directory):
    if not capturing:
      g = _golden.golden_train(task, os.path.join(directory, _files.GOLDEN_DIR),
                               steps=steps, checkpoint_every=every,
                               seed=seed, evaluate=False, progress=say)
      return ProfileResult(directory, g, None, [], [], 0, budget_bytes)
    # Plan before training: errors come before any work.
    state = _golden.abstract_state(task)
    batch = task.batch_at(0)
    chosen, params, tapped_fn = _select(task, state, batch, selection)
    shapes = jax.eval_shape(tapped_fn, state, batch)[1]
    cap_steps = capture_step_list(capture_steps, steps, every)
    sizes = {s.name: io.planned_bytes(
        {k: (v.shape, v.dtype) for k, v in _tap_arrays(shapes[s.name]).items()})
        for s in chosen}
    cands = [Candidate(st, s, sizes[s.name], record_file(st, s.name))
             for st in cap_steps for s in chosen]
    pl = plan(cands, int(budget_bytes))
    captures_dir = os.path.join(directory, CAPTURE_DIR)
    settings = _settings(task, steps, every, seed, _jsonable(selection),
                         cap_steps, int(budget_bytes))
    index = _check_index(captures_dir, settings) or {
        "format": io.FORMAT_VERSION, "settings": settings, "records": []}
    index["skipped"] = [
        {"step": c.step, "site": c.site.name, "bytes": c.bytes,
         "reason": "over the budget"} for c in pl.skipped]
    say(f"capture plan: {len(pl.kept)} of {len(cands)} records "
        f"({len(chosen)} sites x {len(cap_steps)} steps), "
        f"{pl.planned_bytes} of {pl.budget_bytes} bytes; "
        f"{len(pl.skipped)} skipped for the budget")

    g = _golden.golden_train(task, os.path.join(directory, _files.GOLDEN_DIR),
                             steps=steps, checkpoint_every=every, seed=seed,
                             evaluate=False, progress=say)
    _capture(task, g, pl, cap_steps, params, tapped_fn, captures_dir, index,
             say)
    used = sum(e["bytes"] for e in index["records"])
    return ProfileResult(directory, g, captures_dir, list(index["records"]),
                         list(index["skipped"]), used, int(budget_bytes))


def _jsonable(selection: dict) -> dict:
  return {k: (list(v) if isinstance(v, (list, tuple)) else v)
          for k, v in selection.items()}


def _select(task: TrainTask, state, batch, selection: dict):
  """Selected sites, their stored parameters and the tapped step."""
  closed, _ = _sites.trace(task.step_fn, state, batch)
  table = _sites.walk(closed)
  sites = selection["sites"]
  kw = {"kernel": selection["kernel"], "phase": selection["phase"]}
  if isinstance(sites, str):
    kw["pattern"] = sites
  elif sites is not None:
    kw["names"] = tuple(sites)
  chosen = list(_sites.select_sites(table, **kw))
  if not chosen:
    raise PeatError(f"capture selection {selection} matches no site of task "
                    f"{task.name!r}; list them with peat-sites")
  params = {s.name: io.encode_params(s, io.eqn_at(closed, s.address))
            for s in chosen}
  tapped = _sites.tap(task.step_fn, _sites.Substitution(
      None, sites=tuple(s.name for s in chosen)))
  return chosen, params, tapped


def _capture(task: TrainTask, g: _golden.GoldenResult, pl: CapturePlan,
             cap_steps: Sequence[int], params: dict, tapped_fn,
             captures_dir: str, index: dict,
             say: Callable[[str], None]) -> None:
  """Captures the kept records that the index does not hold yet."""
  have = {(e["step"], e["site"]) for e in index["records"]
          if os.path.exists(os.path.join(captures_dir, e["file"]))
          and os.path.getsize(os.path.join(captures_dir, e["file"]))
          == e["bytes"]}
  index["records"] = [e for e in index["records"]
                      if (e["step"], e["site"]) in have]
  todo: dict[int, list[Candidate]] = {}
  for c in pl.kept:
    if (c.step, c.site.name) not in have:
      todo.setdefault(c.step, []).append(c)
  os.makedirs(captures_dir, exist_ok=True)
  io.write_index(captures_dir, index)
  saved = saved_steps(g.checkpoint_dir)
  tapped = jax.jit(tapped_fn)
  cur = cur_step = None
  planned = {c.step for c in pl.kept}
  order = {(c.step, c.site.name): i for i, c in enumerate(pl.kept)}
  for step in cap_steps:
    if step not in todo:
      say(f"captured step {step}: " + ("done before, skipped" if step in
                                       planned else "no record within the "
                                       "budget, skipped"))
      continue
    t0 = time.perf_counter()
    base = max(s for s in saved if s <= step)
    if cur is None or not base <= cur_step <= step:
      # On the host: restored arrays are committed to a device, which would
      # recompile the train step that golden training compiled already.
      cur = jax.device_get(_golden.restore_state(g.checkpoint_dir, task,
                                                 base))
      cur_step = base
    while cur_step < step:  # replay the golden step: bitwise the same states
      cur, _ = task.train_step(cur, task.batch_at(int(cur.data_position)))
      cur_step += 1
    _, taps = tapped(cur, task.batch_at(int(cur.data_position)))
    taps = jax.device_get(taps)
    for c in todo[step]:
      data, meta = io.record_bytes(_tap_arrays(taps[c.site.name]))
      if len(data) > c.bytes:  # planned_bytes is an upper bound
        raise PeatError(f"internal: record of {c.site.name!r} is {len(data)}"
                        f" bytes, planned {c.bytes}; please report")
      io.write_file(os.path.join(captures_dir, c.file), data)
      index["records"].append({
          "file": c.file, "step": step, **io.site_fields(c.site),
          "params": params[c.site.name], "arrays": meta, "bytes": len(data)})
    index["records"].sort(key=lambda e: order.get((e["step"], e["site"]), 0))
    io.write_index(captures_dir, index)
    say(f"captured step {step}: {len(todo[step])} sites, "
        f"{sum(e['bytes'] for e in index['records'])} bytes so far "
        f"({time.perf_counter() - t0:.2f} s)")
