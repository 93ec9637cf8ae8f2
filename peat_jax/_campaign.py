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
import os
import time
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from peat_jax import _detector
from peat_jax import _golden
from peat_jax import _report
from peat_jax._errors import PeatError
# Re-exported: the campaign layers, reachable from one module.
from peat_jax._playback import LOCALIZE_NOISE_RATIO  # noqa: F401
from peat_jax._playback import PlaybackResult  # noqa: F401
from peat_jax._playback import SiteCall  # noqa: F401
from peat_jax._playback import localize  # noqa: F401
from peat_jax._playback import playback
from peat_jax._playback import select_calls  # noqa: F401
from peat_jax._playback import site_record  # noqa: F401
from peat_jax._records import PLAYBACK_FILE  # noqa: F401
from peat_jax._records import RUNTIME_FILE  # noqa: F401
from peat_jax._records import append_records  # noqa: F401
from peat_jax._records import diagnosis_of
from peat_jax._records import read_records  # noqa: F401
from peat_jax._records import signature_record  # noqa: F401
from peat_jax._runtime import RuntimeResult  # noqa: F401
from peat_jax._runtime import divergence  # noqa: F401
from peat_jax._runtime import envelope  # noqa: F401
from peat_jax._runtime import parse_frequency
from peat_jax._runtime import runtime
from peat_jax._train_state import TrainTask
from peat_jax.kernels import kut as _kut

SETTINGS_FILE = "campaign.json"
LOCK_FILE = ".lock"


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
