"""Validation campaigns: playback FI, runtime FI, verdict, localization, report.

A campaign is one directory; :mod:`peat_jax.profiler._layout` names every
file in it (docs/campaign.md).

Records hold small numbers only (signature scalars, the ULP and bit-position
histograms, the diagnosis), never arrays of activations. Both record files
are append-only streams of checksummed msgpack records (``_records``); a
restarted campaign reads them and skips the steps / frequencies already
done. Native KUTs run in worker processes by default (``_isolate``): a KUT
that crashes, hangs or exhausts memory becomes a finding, not the end of
the campaign (docs/reliability.md).
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

from peat_jax.profiler import _layout
from peat_jax import detector as _detector
from peat_jax.profiler import _golden as _golden
from peat_jax.profiler import _isolate as _isolate
from peat_jax import report as _report
from peat_jax.core import PeatError
# Re-exported: the campaign layers, reachable from one module.
from peat_jax.profiler._playback import playback
from peat_jax.profiler._runtime import parse_frequency
from peat_jax.profiler._runtime import runtime
from peat_jax.profiler._isolate import TaskFactory
from peat_jax.profiler._train_state import TrainTask
from peat_jax.kernels import kut as _kut
from peat_jax.profiler import _isolated

SETTINGS_FILE = _layout.SETTINGS_FILE
LOCK_FILE = _layout.LOCK_FILE
#: Version of the campaign directory's layout and record formats, stored in
#: campaign.json ("format"); a directory of another version is refused.
#: 2: checksummed record frames, crashes.msgpack.
CAMPAIGN_FORMAT = 2


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
  """Stores the settings, or checks them against the stored ones.

  Raises:
    PeatError: a corrupt campaign.json, one of another campaign format
      (another peat_jax version), or other settings; nothing is changed.
  """
  path = os.path.join(directory, SETTINGS_FILE)
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        old = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
      raise PeatError(
          f"campaign settings file {path} is corrupt ({err}); expected the "
          "JSON written by peat.validate. Nothing was changed. Fix: restore "
          "it from a copy, or use another campaign directory.") from err
    if not isinstance(old, dict):
      raise PeatError(f"campaign settings file {path} holds a "
                      f"{type(old).__name__}; expected a JSON object. Fix: "
                      "restore it or use another campaign directory.")
    if old.get("format") != settings["format"]:
      raise PeatError(
          f"campaign directory {directory} was written by another version "
          f"of peat_jax: {path} has campaign format {old.get('format')!r} "
          f"(None: from before format versions), this peat_jax reads format "
          f"{settings['format']}. Nothing was changed. Fix: run the campaign "
          "in a new directory, or finish it with the peat_jax version that "
          "started it.")
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
  try:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(settings, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
  except OSError as err:
    with contextlib.suppress(OSError):
      os.remove(path + ".tmp")
    raise PeatError(
        f"cannot write campaign settings file {path}: {err.strerror or err}."
        " Fix: free disk space or fix the directory's permissions, then run "
        "the same command again.") from err


def _site_entries(records: Sequence[dict], order: Sequence[str]) -> list:
  out = []
  for name in order:
    rs = sorted((r for r in records if r["site"] == name),
                key=lambda r: r["step"])
    if not rs:
      continue
    top = min(rs, key=lambda r: (-_detector.severity(r["diagnosis"]["verdict"]),
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
      if loc else "none (every site within the noise floor)" if data["sites"]
      else "none (no playback record)"))
  pb = data.get("playback")
  if pb and pb["steps"]:
    lines.append("  playback max |loss_kut - loss_golden| = "
                 f"{max(abs(a - b) for a, b in zip(pb['loss_kut'], pb['loss_golden'])):.3g}"
                 f", max update rel diff = {max(pb['update_rel_diff']):.3g}")
  for r in data.get("runtime") or []:
    if r.get("crashed") or not r["loss"]:
      lines.append(f"  runtime {r['frequency']:<24} {r['reason']}")
      continue
    lines.append(f"  runtime {r['frequency']:<24} final loss {r['loss'][-1]:.5g}"
                 f" (golden {r['golden_loss'][-1]:.5g}): "
                 + (f"diverged at step {r['diverged_at']} ({r['reason']})"
                    if r["diverged_at"] is not None else "no divergence"))
  crashes = data.get("crashes") or []
  if crashes:
    lines.append(f"  crash and hang findings ({len(crashes)}):")
    for f in crashes:
      lines.append(f"    {_finding_line(f)}")
  return "\n".join(lines)


def _finding_line(f: dict) -> str:
  """One line of a crash or hang finding."""
  where = (f"playback step {f['step']} at site {f['site'] or '(several)'}"
           if f["phase"] == "playback" else
           f"runtime FI {f['frequency']}" if f["phase"] == "runtime" else
           f["phase"])
  return f"{f['kind']}: {where}: {_report.finding_cause(f)}"


def _verdict_data(diags: dict, findings: Sequence[dict]) -> dict:
  """The report's verdict: the Detector's, failed by crash/hang findings."""
  v = _detector.verdict(diags) if diags else None
  if not findings:
    if v is None:
      raise PeatError("the campaign has no playback record and no finding; "
                      "expected at least one played checkpoint")
    return {"verdict": v.verdict, "summary": v.summary,
            "deciding": [list(k) for k in v.deciding[:50]]}
  kinds = sorted({f["kind"] for f in findings})
  verbs = {"crash": "crashed", "hang": "hung"}
  summary = (f"fail: the KUT {' and '.join(verbs[k] for k in kinds)} "
             f"({len(findings)} finding{'s' if len(findings) > 1 else ''}): "
             + "; ".join(_finding_line(f) for f in findings[:5])
             + (f"; and {len(findings) - 5} more" if len(findings) > 5
                else ""))
  if v is not None:
    summary += f". Playback records: {v.summary}"
  deciding = [[f["site"] or f"{f['phase']} {f['frequency'] or ''}".strip(),
               f["step"]] for f in findings]
  if v is not None and v.verdict == "fail":
    deciding += [list(k) for k in v.deciding]
  return {"verdict": "fail", "summary": summary, "deciding": deciding[:50]}


def _use_isolation(isolate: bool | None, spec: _kut.KutSpec,
                   factory: TaskFactory | None,
                   say: Callable[[str], None]) -> bool:
  """Whether validate runs the KUT in worker processes (see validate)."""
  if isolate is None:
    isolate = spec.source == "native" and factory is not None
    if spec.source == "native" and factory is None:
      if _kut.is_broken(spec):
        raise PeatError(
            f"KUT {spec.spec!r} is deliberately broken (it crashes, hangs or "
            "exhausts memory) and needs process isolation, which needs a "
            "peat.TaskFactory instead of a TrainTask (e.g. "
            "TaskFactory('peat_jax.models', 'get_task', {'name': 'cnn'})).")
      say("[isolation] off: native KUTs run in worker processes when "
          "validate gets a peat.TaskFactory instead of a TrainTask")
  if isolate and factory is None:
    raise PeatError("isolate=True needs a peat.TaskFactory (a picklable "
                    "recipe that rebuilds the task in a worker process) "
                    "instead of a TrainTask, e.g. TaskFactory("
                    "'peat_jax.models', 'get_task', {'name': 'cnn'})")
  if not isolate and _kut.is_broken(spec):
    raise PeatError(f"KUT {spec.spec!r} is deliberately broken (it crashes, "
                    "hangs or exhausts memory); run it with isolate=True "
                    "(or None) and a peat.TaskFactory")
  return bool(isolate)


def validate(task: TrainTask | TaskFactory, kut_spec: str,
             campaign_dir: str | os.PathLike,
             *, steps: int | None = None, checkpoint_every: int | None = None,
             frequencies: Sequence[str] = ("every", "every_4",
                                           "fraction_0.25"),
             runtime_steps: int | None = None, select: str | None = None,
             seed: int = 0, scenario: str | None = None,
             isolate: bool | None = None,
             timeout_s: float = _isolate.TIMEOUT_S,
             startup_s: float = _isolate.STARTUP_S,
             memory_limit_mb: int | None = _isolate.MEMORY_LIMIT_MB,
             progress: Callable[[str], None] | None = print
             ) -> CampaignPaths:
  """Runs a whole campaign: golden, playback, runtime FI, verdict, report.

  With isolation, playback and runtime FI run in worker processes with time
  and memory limits (``peat_jax.profiler._isolate``): a KUT that crashes, hangs or
  exhausts memory becomes a crash/hang finding (``crashes.msgpack``, the
  report, verdict ``fail``) and the campaign goes on. The records are the
  same with and without isolation.

  Args:
    task: the model scenario: a :class:`peat_jax.TrainTask`, or a
      :class:`TaskFactory` that builds it (needed for isolation, since a
      worker process rebuilds the task).
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
    isolate: run playback and runtime FI in worker processes. None
      (default): yes for native KUTs when ``task`` is a TaskFactory.
      Deliberately broken KUTs require it.
    timeout_s: isolation: time limit of one checkpoint / frequency.
    startup_s: isolation: extra time of the first checkpoint / frequency of
      each worker (import, tracing, compilation).
    memory_limit_mb: isolation: a worker's resident memory limit.
    progress: called with progress lines (None: silent).

  Returns:
    :class:`CampaignPaths`.

  Raises:
    PeatError: a campaign with other settings (or of another peat_jax
      version) in ``campaign_dir``, a campaign running there, an unknown
      spec or frequency, isolation without a TaskFactory, a corrupt record
      file (:class:`peat_jax.profiler._records.RecordFileError`).
  """
  say = progress or (lambda s: None)
  directory = os.path.abspath(os.fspath(campaign_dir))
  factory = task if isinstance(task, TaskFactory) else None
  spec = _kut.parse_kut(kut_spec)
  isolated = _use_isolation(isolate, spec, factory, say)
  if factory is not None:
    task = factory.build()
  steps = int(steps or task.default_steps)
  checkpoint_every = int(checkpoint_every or task.default_checkpoint_every)
  runtime_steps = int(runtime_steps or steps)
  for f in frequencies:
    parse_frequency(f)
  settings = {"format": CAMPAIGN_FORMAT,
              "scenario": scenario or task.name, "task": task.name,
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
    g = _golden.golden_train(task, os.path.join(directory, _layout.GOLDEN_DIR),
                             steps=steps, checkpoint_every=checkpoint_every,
                             seed=seed, resume=True, evaluate=False)
    iso = (f" (isolated: worker processes, {timeout_s:g} s per unit, "
           f"{memory_limit_mb} MiB)" if isolated else "")
    limits = dict(timeout_s=timeout_s, startup_s=startup_s,
                  memory_limit_mb=memory_limit_mb)
    say(f"[2/4] playback FI of {kut_spec} at {len(g.steps) - 1} "
        f"checkpoints{iso}")
    if isolated:
      pb = _isolated.isolated_playback(factory, g.workdir, kut_spec,
                                      campaign_dir=directory, select=select,
                                      progress=say, **limits)
    else:
      pb = playback(task, g.workdir, kut_spec, campaign_dir=directory,
                    select=select, progress=say)
    rt = None
    if frequencies:
      say(f"[3/4] runtime FI: {', '.join(frequencies)}, {runtime_steps} "
          f"steps{iso}")
      if isolated:
        rt = _isolated.isolated_runtime(
            factory, g.workdir, kut_spec, frequencies=frequencies,
            steps=runtime_steps, campaign_dir=directory, select=select,
            progress=say, **limits)
      else:
        rt = runtime(task, g.workdir, kut_spec, frequencies=frequencies,
                     steps=runtime_steps, campaign_dir=directory,
                     select=select, progress=say)
    say("[4/4] verdict and report")
    diags = {(r["site"], r["step"]): _detector.diagnosis_of(r) for r in pb.records}
    findings = _isolated.read_findings(directory, kut_spec)
    verdict = _verdict_data(diags, findings)
    data = {
        "title": f"peat_jax validation: {kut_spec} on {settings['scenario']}",
        "kut": kut_spec, "scenario": settings["scenario"],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds"),
        "verdict": verdict,
        "crashes": findings,
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
                         verdict["verdict"])
