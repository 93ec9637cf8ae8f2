"""Validation campaigns: playback FI, runtime FI, verdict, localization, report.

A campaign is one directory (docs/campaign.md)::

  <campaign>/campaign.json      settings; another campaign's settings -> error
  <campaign>/.lock              fcntl lock: one writer at a time
  <campaign>/golden/            golden run (peat.golden_train)
  <campaign>/playback.msgpack   one record per (step, site) + one per step
  <campaign>/runtime.msgpack    one record per frequency + golden/spread
  <campaign>/report.html, report.json

Records hold small numbers only (signature scalars, the ULP and bit-position
histograms, the diagnosis), never arrays of activations. Both record files
are append-only streams of msgpack maps; a restarted campaign reads them and
skips the steps / frequencies already done.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import math
import os
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import jax
import msgpack
import numpy as np

from peat_jax import _analyzer
from peat_jax import _detector
from peat_jax import _golden
from peat_jax import _report
from peat_jax import _sites
from peat_jax import _sites_subst
from peat_jax._checkpoint import saved_steps
from peat_jax._errors import PeatError
from peat_jax._train_state import TrainTask
from peat_jax.kernels import kut as _kut

PLAYBACK_FILE = "playback.msgpack"
RUNTIME_FILE = "runtime.msgpack"
SETTINGS_FILE = "campaign.json"
LOCK_FILE = ".lock"
#: noise ratio above which a site counts as leaving the noise floor.
LOCALIZE_NOISE_RATIO = 2.0


# --------------------------------------------------------------- records


def _append(path: str, records: Sequence[dict]) -> None:
  with open(path, "ab") as f:
    for r in records:
      f.write(msgpack.packb(r, use_bin_type=True))
    f.flush()
    os.fsync(f.fileno())


def read_records(path: str | os.PathLike) -> list[dict]:
  """Reads an append-only msgpack record file (missing file: no records).

  A truncated last record (a crash mid-write) is dropped.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    return []
  out = []
  with open(path, "rb") as f:
    unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
    try:
      for r in unpacker:
        out.append(r)
    except (msgpack.exceptions.ExtraData, ValueError,
            msgpack.exceptions.UnpackException):
      pass
  return out


def _rewrite(path: str, records: Sequence[dict]) -> None:
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    for r in records:
      f.write(msgpack.packb(r, use_bin_type=True))
  os.replace(tmp, path)


def _num(x) -> Any:
  a = np.asarray(x)
  if a.dtype == bool:
    return bool(a)
  if np.issubdtype(a.dtype, np.integer):
    return int(a)
  return float(a)


def signature_record(sig) -> dict:
  """The scalar fields of a Signature plus ulp_hist, bits_xor, rel_pct."""
  s = jax.device_get(sig)
  rec = {}
  for k, v in zip(s._fields, s):
    if np.ndim(v) == 0:
      rec[k] = _num(v)
  for k in ("ulp_hist", "bits_xor", "rel_pct", "abs_pct"):
    rec[k] = np.asarray(getattr(s, k)).tolist()
  return rec


def diagnosis_of(rec: dict) -> _detector.Diagnosis:
  """Rebuilds a Diagnosis (without candidates) from a stored record."""
  d = rec["diagnosis"]
  return _detector.Diagnosis(d["model"], d["confidence"], d["evidence"], {},
                             (), d["verdict"])


# -------------------------------------------------------------- playback


class SiteCall(NamedTuple):
  """One selected site of a playback, with what its reference needs."""

  site: _sites.Site
  sub: _sites_subst.Substitution


class PlaybackResult(NamedTuple):
  """What :func:`playback` recorded.

  Attributes:
    records: site records ``{"kind": "site", "step", "site", ...}`` in
      (step, execution order).
    effects: per-step records ``{"kind": "effect", "step", "loss_golden",
      "loss_kut", "grad_rel_diff", "update_rel_diff"}``.
    sites: the selected sites, execution order.
    localization: ``{"site", "step", "noise_ratio"}`` or None.
    seconds_per_step: mean wall time of one checkpoint's playback after the
      first (compilation excluded), NaN when fewer than two ran.
  """

  records: list
  effects: list
  sites: list
  localization: dict | None
  seconds_per_step: float


def _reduction(site: _sites.Site, params: dict) -> int:
  shapes = site.in_shapes
  if site.kernel == "dot_general":
    return _kut.dot_general_reduction(shapes, params["dimension_numbers"])
  if site.kernel == "conv_general_dilated":
    rhs = shapes[1]
    out_dim = params["dimension_numbers"].rhs_spec[0]
    return int(np.prod(rhs) // rhs[out_dim])
  return int(shapes[0][-1]) if shapes and shapes[0] else 1


def _tree_rel(a, b, base) -> float:
  """||a - b|| / ||base|| over pytrees (float64 on host)."""
  num = sum(float(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2))
            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  den = sum(float(np.sum(np.asarray(x, np.float64) ** 2))
            for x in jax.tree.leaves(base))
  if den == 0.0:
    return 0.0 if num == 0.0 else math.inf
  return math.sqrt(num / den)


def _select(task: TrainTask, state, batch, kut_spec: str,
            select: str | Sequence[str] | None) -> tuple[list, list]:
  subs = _kut.resolve_kut(kut_spec)
  table = _sites.discover_sites(task.step_fn, state, batch)
  chosen = []
  for sub in subs:
    kw = dict(kernel=sub.kernel, phase=sub.phase, pattern=sub.pattern)
    if isinstance(select, str):
      if kw["pattern"] is not None:
        raise PeatError("select= and the spec's pattern both set")
      kw["pattern"] = select
    elif select is not None:
      kw["names"] = tuple(select)
    chosen += [SiteCall(s, sub) for s in _sites.select_sites(table, **kw)]
  order = {s.name: i for i, s in enumerate(table)}
  chosen.sort(key=lambda c: order[c.site.name])
  if not chosen:
    raise PeatError(f"KUT {kut_spec!r} selects no site of task {task.name!r}"
                    f" (select={select!r}); expected at least one")
  return chosen, table


def _site_reference(site: _sites.Site, params: dict, inputs) -> Any:
  """float64 reference of a site's golden kernel on its tapped inputs.

  Under ``scan`` the taps have a leading iteration axis: the reference is
  computed per iteration. None when no reference applies.
  """
  try:
    fn = _kut.reference_fn(site.kernel, params)
    inputs = [np.asarray(x) for x in inputs]
    if "scan" in site.where and inputs and inputs[0].ndim == len(
        site.in_shapes[0]) + 1:
      return np.stack([np.asarray(fn(*[x[i] for x in inputs]))
                       for i in range(inputs[0].shape[0])])
    return fn(*inputs)
  except (PeatError, TypeError, ValueError):
    return None


def site_record(site: _sites.Site, params: dict, tp: _sites_subst.Tap,
                kut_spec: str, step: int) -> dict:
  """One (step, site) record: signature vs golden and float64, diagnosis.

  Args:
    site: the tapped site.
    params: its call parameters, as recorded by ``kut.recording``.
    tp: the site's tap (inputs, golden and KUT outputs of one step).
    kut_spec: the KUT's spec, stored with the record.
    step: the step the tap comes from.

  Returns:
    A msgpack-ready dict (``kind == "site"``).
  """
  ref = _site_reference(site, params, tp.inputs)
  test, gold = tp.kut, tp.golden
  if isinstance(gold, tuple):
    test, gold = test[0], gold[0]
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
  if ref is not None and np.shape(ref) != np.shape(gold):
    ref = None
  sig = _analyzer.analyze(test, gold, ref)
  red = _reduction(site, params)
  diag = _detector.detect(sig, context={"kernel": site.kernel,
                                        "reduction": red})
  return {
      "kind": "site", "kut": kut_spec, "step": step, "site": site.name,
      "kernel": site.kernel, "phase": site.phase, "reduction": red,
      "signature": signature_record(sig),
      "diagnosis": {"model": diag.model, "confidence": float(diag.confidence),
                    "evidence": diag.evidence, "verdict": diag.verdict}}


def localize(records: Sequence[dict], site_order: Sequence[str]
             ) -> dict | None:
  """First site (execution order) leaving the noise floor, earliest step.

  A record leaves it when its noise ratio exceeds
  :data:`LOCALIZE_NOISE_RATIO`, or when it is not exact and its diagnosis
  fails.
  """
  order = {n: i for i, n in enumerate(site_order)}
  hits = []
  for r in records:
    nr = r["signature"].get("noise_ratio", math.nan)
    bad = (nr == nr and nr > LOCALIZE_NOISE_RATIO) or (
        r["diagnosis"]["model"] != "exact"
        and r["diagnosis"]["verdict"] == "fail")
    if bad:
      hits.append((order.get(r["site"], 1 << 30), r["step"], r["site"], nr))
  if not hits:
    return None
  _, step, site, nr = min(hits)
  return {"site": site, "step": int(step),
          "noise_ratio": None if nr != nr else float(nr)}


def playback(task: TrainTask, golden_dir: str | os.PathLike, kut_spec: str,
             *, campaign_dir: str | os.PathLike | None = None,
             steps: Sequence[int] | None = None,
             select: str | Sequence[str] | None = None,
             progress: Callable[[str], None] | None = None
             ) -> PlaybackResult:
  """Playback FI of a KUT at every saved checkpoint of a golden run.

  For each saved step s (all but the last, or ``steps``): restore, run the
  step once with the golden kernel and the KUT tapped at every selected site
  (one jitted function compiled once), compute each site's float64
  reference, Signature and Diagnosis, then run the step with the KUT
  substituted (second jitted function) to measure the effect on loss,
  gradient norm and parameter update.

  Args:
    task: the golden run's task.
    golden_dir: the golden run's workdir (or its checkpoint directory).
    kut_spec: a spec of :func:`peat_jax.kernels.kut.resolve_kut`.
    campaign_dir: where ``playback.msgpack`` goes (default: ``golden_dir``'s
      parent). Finished steps found there are skipped.
    steps: checkpoint steps to play back (default: all saved but the last).
    select: narrow the spec's sites: an ``fnmatch`` pattern or site names.
    progress: called with one line per step.

  Returns:
    A :class:`PlaybackResult`.

  Raises:
    PeatError: unknown spec, no selected site, a step that is not saved.
  """
  say = progress or (lambda s: None)
  golden_dir = os.path.abspath(os.fspath(golden_dir))
  ckpt = _golden._checkpoint_dir_of(golden_dir)
  campaign_dir = os.path.abspath(os.fspath(
      campaign_dir or os.path.dirname(golden_dir)))
  os.makedirs(campaign_dir, exist_ok=True)
  path = os.path.join(campaign_dir, PLAYBACK_FILE)
  saved = saved_steps(ckpt)
  if steps is None:
    steps = saved[:-1] if len(saved) > 1 else saved
  missing = [s for s in steps if s not in saved]
  if missing:
    raise PeatError(f"playback steps {missing} are not saved in {ckpt}; "
                    f"saved steps: {saved}")

  # Resume: keep complete steps (with an effect record), drop partial ones.
  old = read_records(path)
  done = {r["step"] for r in old if r.get("kind") == "effect"
          and r.get("kut") == kut_spec}
  kept = [r for r in old if r.get("step") in done and r.get("kut") == kut_spec]
  if len(kept) != len(old):
    _rewrite(path, kept)

  todo = [s for s in steps if s not in done]
  chosen: list = []
  store: dict = {}
  tapped = kstep = None
  timings = []
  for s in todo:
    t0 = time.perf_counter()
    state = _golden.restore_state(ckpt, task, s)
    batch = task.batch_at(int(state.data_position))
    if tapped is None:
      chosen, _ = _select(task, state, batch, kut_spec, select)
      subs = [_sites_subst.Substitution(
          _kut.recording(c.sub.kut, c.site.name, c.site.kernel,
                         c.site.composite, store), sites=(c.site.name,))
              for c in chosen]
      tapped = jax.jit(_sites_subst.tap(task.step_fn, *subs))
      names = tuple(c.site.name for c in chosen)
      eff = [_sites_subst.Substitution(
          chosen[0].sub.kut, sites=names, backward=chosen[0].sub.backward)]
      kstep = jax.jit(_sites_subst.substitute(task.step_fn, *eff))
    (gstate, gm), taps = tapped(state, batch)
    kstate, km = kstep(state, batch)
    recs = [site_record(c.site, store[c.site.name], taps[c.site.name],
                        kut_spec, int(s)) for c in chosen]
    lg, lk = float(gm["loss"]), float(km["loss"])
    gng, gnk = float(gm["grad_norm"]), float(km["grad_norm"])
    dg = jax.tree.map(lambda a, b: np.asarray(a, np.float64)
                      - np.asarray(b, np.float64), gstate.params, state.params)
    dk = jax.tree.map(lambda a, b: np.asarray(a, np.float64)
                      - np.asarray(b, np.float64), kstate.params, state.params)
    eff_rec = {
        "kind": "effect", "kut": kut_spec, "step": int(s), "loss_golden": lg,
        "loss_kut": lk,
        "grad_rel_diff": (abs(gnk - gng) / gng if gng else
                          (0.0 if gnk == gng else math.inf)),
        "update_rel_diff": _tree_rel(dk, dg, dg)}
    _append(path, recs + [eff_rec])
    timings.append(time.perf_counter() - t0)
    worst = max(recs, key=lambda r: (
        {"fail": 2, "warn": 1, "pass": 0}[r["diagnosis"]["verdict"]]))
    say(f"playback step {s}: {len(recs)} sites, worst "
        f"{worst['diagnosis']['model']} ({worst['diagnosis']['verdict']}) at "
        f"{worst['site']}; loss {lg:.6g} -> {lk:.6g} "
        f"({timings[-1]:.2f} s)")
  for s in steps:
    if s in done:
      say(f"playback step {s}: done before, skipped")

  allrecs = read_records(path)
  site_recs = [r for r in allrecs if r.get("kind") == "site"
               and r["step"] in steps]
  effects = sorted((r for r in allrecs if r.get("kind") == "effect"
                    and r["step"] in steps), key=lambda r: r["step"])
  order: list[str] = []
  for r in site_recs:
    if r["site"] not in order:
      order.append(r["site"])
  if chosen:
    order = [c.site.name for c in chosen]
  site_recs.sort(key=lambda r: (r["step"], order.index(r["site"])))
  sps = float(np.mean(timings[1:])) if len(timings) > 1 else math.nan
  return PlaybackResult(site_recs, effects, order,
                        localize(site_recs, order), sps)


# --------------------------------------------------------------- runtime


def parse_frequency(freq: str) -> tuple[Any, str]:
  """``every`` / ``every_<n>`` / ``fraction_<p>`` -> (schedule, label)."""
  if freq == "every":
    return _sites_subst.EveryCall(), "every call"
  if freq.startswith("every_"):
    try:
      n = int(freq[6:])
    except ValueError:
      n = 0
    if n >= 1:
      return _sites_subst.EveryNSteps(n), f"every {n}th step"
  if freq.startswith("fraction_"):
    try:
      p = float(freq[9:])
    except ValueError:
      p = -1.0
    if 0.0 < p <= 1.0:
      return _sites_subst.Fraction(p, seed=0), f"{p:.0%} of calls (seed 0)"
  raise PeatError(f"unknown frequency {freq!r}; expected 'every', "
                  "'every_<n>' (n >= 1) or 'fraction_<p>' (0 < p <= 1), e.g. "
                  "'every_4', 'fraction_0.25'")


def _train(step, state, batch_at, n: int) -> list[float]:
  losses = []
  for _ in range(n):
    state, m = step(state, batch_at(int(state.data_position)))
    losses.append(float(m["loss"]))
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


def runtime(task: TrainTask, golden_dir: str | os.PathLike, kut_spec: str, *,
            frequencies: Sequence[str] = ("every", "every_4",
                                          "fraction_0.25"),
            steps: int = 50, start_step: int = 0,
            seeds: Sequence[int] = (1, 2),
            campaign_dir: str | os.PathLike | None = None,
            select: str | Sequence[str] | None = None,
            progress: Callable[[str], None] | None = None) -> RuntimeResult:
  """Runtime FI: train with the KUT at a frequency and compare with golden.

  From the golden checkpoint ``start_step`` each frequency trains ``steps``
  steps with ``peat.substitute(step_fn, ..., schedule=...)`` (jitted once
  per frequency); the golden trajectory is retrained from the same state.
  The golden seed-to-seed spread comes from fresh runs with ``seeds`` (same
  steps, from ``task.init_state(seed)``); its running-max envelope sets the
  divergence threshold (:func:`divergence`). Finished frequencies in
  ``runtime.msgpack`` are skipped.

  Returns:
    A :class:`RuntimeResult`.
  """
  say = progress or (lambda s: None)
  golden_dir = os.path.abspath(os.fspath(golden_dir))
  ckpt = _golden._checkpoint_dir_of(golden_dir)
  campaign_dir = os.path.abspath(os.fspath(
      campaign_dir or os.path.dirname(golden_dir)))
  path = os.path.join(campaign_dir, RUNTIME_FILE)
  old = [r for r in read_records(path) if r.get("kut") == kut_spec
         and r.get("n") == steps and r.get("start") == start_step]
  byname = {r["name"]: r for r in old}
  scheds = [(f, *parse_frequency(f)) for f in frequencies]
  state0 = _golden.restore_state(ckpt, task, start_step)

  def keep(name, rec):
    rec = {"kut": kut_spec, "n": steps, "start": start_step, "name": name,
           **rec}
    _append(path, [rec])
    byname[name] = rec

  if "golden" not in byname:
    keep("golden", {"loss": _train(task.train_step, state0, task.batch_at,
                                   steps)})
  golden = byname["golden"]["loss"]
  if "spread" not in byname:
    seed_losses = [
        _train(task.train_step, task.init_state(seed), task.batch_at, steps)
        for seed in seeds]
    base = (golden if start_step == 0 else
            _train(task.train_step, task.init_state(0), task.batch_at, steps))
    sp = np.max([np.abs(np.asarray(l) - np.asarray(base))
                 for l in seed_losses], axis=0).tolist()
    keep("spread", {"loss": sp})
  spread = byname["spread"]["loss"]
  env = envelope(spread)
  step_ids = list(range(start_step, start_step + steps))
  runs = []
  base_subs = None
  for f, sched, label in scheds:
    if f not in byname:
      if base_subs is None:
        batch = task.batch_at(int(state0.data_position))
        chosen, _ = _select(task, state0, batch, kut_spec, select)
        names = tuple(c.site.name for c in chosen)
        base_subs = _sites_subst.Substitution(
            chosen[0].sub.kut, sites=names, backward=chosen[0].sub.backward)
      t0 = time.perf_counter()
      step = jax.jit(_sites_subst.substitute(
          task.step_fn, base_subs._replace(schedule=sched)))
      loss = _train(step, state0, task.batch_at, steps)
      at, why = divergence(loss, golden, env)
      keep(f, {"loss": loss, "label": label,
               "diverged_at": None if at is None else step_ids[at],
               "reason": why})
      say(f"runtime {label}: {steps} steps, final loss {loss[-1]:.6g} "
          f"(golden {golden[-1]:.6g}), "
          + (f"diverged at step {step_ids[at]}: {why}" if at is not None
             else "no divergence")
          + f" ({time.perf_counter() - t0:.1f} s)")
    r = byname[f]
    runs.append({"frequency": r["label"], "steps": step_ids,
                 "loss": r["loss"], "golden_loss": golden,
                 "diverged_at": r["diverged_at"], "reason": r["reason"]})
  return RuntimeResult(runs, {"steps": step_ids, "loss_spread": spread},
                       golden)


# --------------------------------------------------------------- campaign


@contextlib.contextmanager
def campaign_lock(directory: str) -> Iterator[None]:
  """Holds ``<directory>/.lock`` (fcntl.flock), or raises PeatError."""
  os.makedirs(directory, exist_ok=True)
  f = open(os.path.join(directory, LOCK_FILE), "a+")
  try:
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
      raise PeatError(
          f"campaign directory {directory} is locked by another campaign "
          f"(expected no other writer; got a held {LOCK_FILE}). Fix: wait "
          "for it to finish or use another --campaign_dir.") from err
    yield
  finally:
    f.close()


def _check_settings(directory: str, settings: dict) -> None:
  path = os.path.join(directory, SETTINGS_FILE)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    diff = {k: (old.get(k), settings.get(k))
            for k in set(old) | set(settings) if old.get(k) != settings.get(k)}
    if diff:
      lines = "; ".join(f"{k}: expected {a!r} (stored), got {b!r}"
                        for k, (a, b) in sorted(diff.items()))
      raise PeatError(
          f"campaign directory {directory} holds a campaign with other "
          f"settings ({lines}). Fix: use another campaign directory or the "
          "stored settings.")
    return
  with open(path + ".tmp", "w") as f:
    json.dump(settings, f, indent=1, sort_keys=True)
  os.replace(path + ".tmp", path)


_WORST = {"fail": 0, "warn": 1, "pass": 2}


def _site_entries(records: Sequence[dict], order: Sequence[str]) -> list:
  out = []
  for name in order:
    rs = sorted((r for r in records if r["site"] == name),
                key=lambda r: r["step"])
    if not rs:
      continue
    top = min(rs, key=lambda r: (_WORST[r["diagnosis"]["verdict"]],
                                 -r["diagnosis"]["confidence"]))
    sig0 = rs[0]["signature"]
    mant = {0: 23, 1: 7, 2: 10, 3: 52}.get(sig0.get("dtype_code", 0), 23)
    expo = {0: 8, 1: 8, 2: 5, 3: 11}.get(sig0.get("dtype_code", 0), 8)
    bits = np.sum([r["signature"]["bits_xor"] for r in rs], axis=0)
    ulp = np.sum([r["signature"]["ulp_hist"] for r in rs], axis=0)
    out.append({
        "site": name, "kernel": rs[0]["kernel"],
        "direction": "bwd" if rs[0]["phase"] == "bwd" else "fwd",
        "model": top["diagnosis"]["model"],
        "confidence": top["diagnosis"]["confidence"],
        "evidence": f"step {top['step']}: {top['diagnosis']['evidence']}",
        "verdict": top["diagnosis"]["verdict"],
        "steps": [r["step"] for r in rs],
        "noise_ratio": [r["signature"].get("noise_ratio") for r in rs],
        "rel_rms": [r["signature"]["rel_rms"] for r in rs],
        "share_differ": [r["signature"]["share_differ"] for r in rs],
        "ulp_hist": ulp.tolist(), "bits_xor": bits.tolist(),
        "mantissa_bits": mant, "exponent_bits": expo})
  return out


class CampaignPaths(NamedTuple):
  """Where :func:`validate` wrote a campaign.

  Attributes:
    directory: the campaign directory.
    html: report.html.
    json: report.json.
    verdict: the KUT's verdict (``pass``/``warn``/``fail``).
  """

  directory: str
  html: str
  json: str
  verdict: str


def summary_table(data: dict) -> str:
  """A plain-text summary of report data (what :func:`validate` prints)."""
  lines = [f"KUT {data['kut']} on {data['scenario']}: "
           f"{data['verdict']['verdict'].upper()}",
           f"  {data['verdict']['summary']}"]
  w = max([len(s["site"]) for s in data["sites"]] + [4])
  lines.append(f"  {'site':<{w}}  {'model':<20} {'verdict':<7} max_noise_ratio")
  for s in data["sites"]:
    nr = [x for x in s["noise_ratio"] if x is not None and x == x]
    lines.append(f"  {s['site']:<{w}}  {s['model']:<20} {s['verdict']:<7} "
                 f"{max(nr) if nr else float('nan'):.3g}")
  loc = data.get("localization")
  lines.append("  localization: " + (
      f"{loc['site']} at step {loc['step']} (noise ratio "
      f"{loc['noise_ratio'] if loc['noise_ratio'] is not None else float('nan'):.3g})"
      if loc else "none (every site within the noise floor)"))
  pb = data.get("playback")
  if pb and pb["steps"]:
    lines.append("  playback max |loss_kut - loss_golden| = "
                 f"{max(abs(a - b) for a, b in zip(pb['loss_kut'], pb['loss_golden'])):.3g}"
                 f", max update rel diff = {max(pb['update_rel_diff']):.3g}")
  for r in data.get("runtime") or []:
    lines.append(f"  runtime {r['frequency']:<24} final loss {r['loss'][-1]:.5g}"
                 f" (golden {r['golden_loss'][-1]:.5g}): "
                 + (f"diverged at step {r['diverged_at']} ({r['reason']})"
                    if r["diverged_at"] is not None else "no divergence"))
  return "\n".join(lines)


def validate(task: TrainTask, kut_spec: str, campaign_dir: str | os.PathLike,
             *, steps: int | None = None, checkpoint_every: int | None = None,
             frequencies: Sequence[str] = ("every", "every_4",
                                           "fraction_0.25"),
             runtime_steps: int | None = None, select: str | None = None,
             seed: int = 0, scenario: str | None = None,
             progress: Callable[[str], None] | None = print
             ) -> CampaignPaths:
  """Runs a whole campaign: golden, playback, runtime FI, verdict, report.

  Args:
    task: the model scenario (``peat_jax.models.get_task(name)``).
    kut_spec: the KUT spec (``peat_jax.kernels.kut``).
    campaign_dir: the campaign directory (created; resumable).
    steps: golden training steps (task default when None).
    checkpoint_every: checkpoint interval (task default when None).
    frequencies: runtime FI frequencies (``every``, ``every_<n>``,
      ``fraction_<p>``); empty to skip runtime FI.
    runtime_steps: runtime FI steps from step 0 (default: ``steps``).
    select: narrow the spec's sites by an ``fnmatch`` pattern.
    seed: golden seed.
    scenario: the scenario's label in the report (default ``task.name``).
    progress: called with progress lines (None: silent).

  Returns:
    :class:`CampaignPaths`.

  Raises:
    PeatError: a campaign with other settings in ``campaign_dir``, a
      campaign running there, an unknown spec or frequency.
  """
  say = progress or (lambda s: None)
  directory = os.path.abspath(os.fspath(campaign_dir))
  steps = int(steps or task.default_steps)
  checkpoint_every = int(checkpoint_every or task.default_checkpoint_every)
  runtime_steps = int(runtime_steps or steps)
  _kut.parse_kut(kut_spec)
  for f in frequencies:
    parse_frequency(f)
  settings = {"scenario": scenario or task.name, "task": task.name,
              "task_config": json.dumps(task.config, sort_keys=True,
                                        default=str),
              "kut": kut_spec, "steps": steps,
              "checkpoint_every": checkpoint_every,
              "frequencies": ",".join(frequencies),
              "runtime_steps": runtime_steps, "select": select or "",
              "seed": seed}
  with campaign_lock(directory):
    _check_settings(directory, settings)
    t0 = time.perf_counter()
    say(f"[1/4] golden run: {steps} steps, checkpoint every "
        f"{checkpoint_every} -> {directory}/golden")
    g = _golden.golden_train(task, os.path.join(directory, "golden"),
                             steps=steps, checkpoint_every=checkpoint_every,
                             seed=seed, resume=True, evaluate=False)
    say(f"[2/4] playback FI of {kut_spec} at {len(g.steps) - 1} checkpoints")
    pb = playback(task, g.workdir, kut_spec, campaign_dir=directory,
                  select=select, progress=say)
    rt = None
    if frequencies:
      say(f"[3/4] runtime FI: {', '.join(frequencies)}, {runtime_steps} steps")
      rt = runtime(task, g.workdir, kut_spec, frequencies=frequencies,
                   steps=runtime_steps, campaign_dir=directory,
                   select=select, progress=say)
    say("[4/4] verdict and report")
    diags = {(r["site"], r["step"]): diagnosis_of(r) for r in pb.records}
    v = _detector.verdict(diags)
    data = {
        "title": f"peat_jax validation: {kut_spec} on {settings['scenario']}",
        "kut": kut_spec, "scenario": settings["scenario"],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds"),
        "verdict": {"verdict": v.verdict, "summary": v.summary,
                    "deciding": [list(k) for k in v.deciding[:50]]},
        "sites": _site_entries(pb.records, pb.sites),
        "localization": pb.localization,
        "playback": {
            "steps": [e["step"] for e in pb.effects],
            "loss_golden": [e["loss_golden"] for e in pb.effects],
            "loss_kut": [e["loss_kut"] for e in pb.effects],
            "grad_rel_diff": [e["grad_rel_diff"] for e in pb.effects],
            "update_rel_diff": [e["update_rel_diff"] for e in pb.effects]},
        "runtime": rt.runs if rt else None,
        "runtime_spread": rt.spread if rt else None,
        "settings": {k: v for k, v in settings.items() if k != "task_config"},
    }
    paths = _report.write_report(data, directory)
    say(summary_table(data))
    say(f"report: {paths.html} ({time.perf_counter() - t0:.1f} s)")
    return CampaignPaths(directory, str(paths.html), str(paths.json),
                         v.verdict)
