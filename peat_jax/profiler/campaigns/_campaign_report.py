"""Report data of a campaign, built from the record files on disk.

:func:`report_data` assembles the report schema (docs/report.md) from site
records, playback effects and runtime runs; :func:`load_report_data` reads
them from a campaign directory (``campaign.json``, ``playback.msgpack``,
``ops.msgpack``, ``runtime.msgpack``, the crash findings of isolated runs,
``golden/run.json``, ``provenance.json``, ``fuzz.msgpack``) and
:func:`rebuild_report` rewrites ``report.html`` / ``report.json`` from them,
so a report can be remade without rerunning anything (after an interrupted
campaign, after op-level playback, or with another KUT of the same files).
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple, Sequence

from peat_jax.profiler import files as _files
from peat_jax import report as _report
from peat_jax.core import PeatError
from peat_jax.profiler.files import OPS_FILE
from peat_jax.profiler import isolation as _isolation
from peat_jax.profiler.campaigns import _provenance
from peat_jax.profiler import runtime_fi as _runtime_fi

SOURCES = ("auto", "playback", "ops")


def _read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise PeatError(f"{path} is not readable JSON ({e})") from e


def _order(records: Sequence[dict]) -> list[str]:
  out: list[str] = []
  for r in records:
    if r["site"] not in out:
      out.append(r["site"])
  return out


def _runtime_runs(records: Sequence[dict], kut: str, settings: dict,
                  backward: str = "golden"
                  ) -> tuple[list | None, dict | None]:
  """Runtime runs of a KUT in the report schema (the campaign's group)."""
  recs = [r for r in records if _files.of_campaign(r, kut, backward)]
  if not recs:
    return None, None
  n = settings.get("runtime_steps", recs[-1]["n"])
  start = recs[-1]["start"] if not settings else 0
  group = [r for r in recs if r["n"] == n and r["start"] == start]
  freqs = (settings["frequencies"].split(",") if settings.get("frequencies")
           else [r["name"] for r in group
                 if r["name"] not in _runtime_fi.REFERENCE_RUNS])
  result = _runtime_fi.runtime_result(group, freqs, n, start)
  if not result.runs:
    return None, None
  return result.runs, result.spread


class CampaignFiles(NamedTuple):
  """What a campaign directory holds, read once (the one reader of it).

  Attributes:
    directory: the campaign directory (absolute).
    settings: ``campaign.json`` (empty when there is none).
    run: ``golden/run.json`` (empty when there is none).
    source: ``"playback"`` or ``"ops"``: which site records.
    kut: the KUT reported.
    kuts: every KUT with site records of that source.
    sites: the KUT's site records, by step.
    effects: its playback effect records.
    findings: its crash and hang findings (playback source only).
    runtime: its runtime runs in the report schema, or None.
    runtime_spread: the seed-to-seed spread, or None.
    scenario: the scenario's label.
    backward: the campaign's backward setting of the records read.
    provenance: what the records cover (the report's ``provenance``:
      ``provenance.json`` joined with the records).
    fuzz: the KUT's entries of ``fuzz.msgpack`` in file (run) order: fuzz
      site records and ``fuzz_error`` findings (empty when none).
  """

  directory: str
  settings: dict
  run: dict
  source: str
  kut: str
  kuts: list
  sites: list
  effects: list
  findings: list
  runtime: list | None
  runtime_spread: dict | None
  scenario: str
  backward: str
  provenance: dict
  fuzz: tuple = ()


def read_fuzz(directory: str, kut: str) -> tuple:
  """A KUT's entries of ``<directory>/fuzz.msgpack`` (records, findings).

  Raises:
    RecordFileError: a corrupt ``fuzz.msgpack``.
  """
  path = os.path.join(directory, _files.FUZZ_FILE)
  return tuple(r for r in _files.read_records(path)
               if r.get("kind") in ("site", "fuzz_error")
               and r.get("kut") == kut)


def read_campaign_files(directory: str | os.PathLike, *,
                        kut: str | None = None,
                        source: str = "auto",
                        backward: str | None = None) -> CampaignFiles:
  """Reads a campaign directory's settings and records of one KUT.

  Args:
    directory: the campaign directory.
    kut: the KUT to read (default: ``campaign.json``'s, or the only KUT
      in the record file).
    source: ``"playback"`` (``playback.msgpack``), ``"ops"``
      (``ops.msgpack``, op-level playback) or ``"auto"`` (playback records
      when there are any, else op-level ones).
    backward: the records of which ``backward`` setting (default:
      ``campaign.json``'s, else ``"kut"`` when the KUT has only such
      records, else ``"golden"``).

  Returns:
    :class:`CampaignFiles`.

  Raises:
    PeatError: a missing directory, an unknown source, no record, several
      KUTs and no ``kut``, a corrupt file.
  """
  d = os.path.abspath(os.fspath(directory))
  if not os.path.isdir(d):
    raise PeatError(f"campaign directory {d} does not exist")
  if source not in SOURCES:
    raise PeatError(f"source must be one of {SOURCES}; got {source!r}")
  settings = _read_json(os.path.join(d, _files.SETTINGS_FILE))
  run = _read_json(os.path.join(d, _files.GOLDEN_DIR, _files.RUN_FILE))
  pb = _files.read_records(os.path.join(d, _files.PLAYBACK_FILE))
  ops = _files.read_records(os.path.join(d, OPS_FILE))
  if source == "auto":
    # Op-level records only when there is nothing of playback: no site
    # record and no crash finding (an isolated KUT that crashed at every
    # checkpoint has findings and no record).
    source = ("playback" if any(r.get("kind") == "site" for r in pb)
              or _isolation.read_findings(d) or not ops else "ops")
  recs = pb if source == "playback" else ops
  sites = [r for r in recs if r.get("kind") == "site"]
  kuts = sorted({r["kut"] for r in sites})
  kut = kut or settings.get("kut")
  if kut is None:
    if len(kuts) != 1:
      raise PeatError(
          f"{d}: expected the records of one KUT in its {source} records, "
          f"found {kuts or 'none'}. Fix: pass the KUT to report (--kut)")
    kut = kuts[0]
  if backward is None:
    backward = settings.get("backward")
  if backward is None:
    mine = {_files.record_backward(r) for r in sites if r["kut"] == kut}
    backward = "kut" if mine == {"kut"} else "golden"
  sites = [r for r in sites if _files.of_campaign(r, kut, backward)]
  findings = (_isolation.read_findings(d, kut, backward)
              if source == "playback" else [])
  if not sites and not findings:
    raise PeatError(f"{d} holds no {source} record of KUT {kut!r} (KUTs "
                    f"there: {kuts}); run playback first")
  effects = [r for r in recs if r.get("kind") == "effect"
             and _files.of_campaign(r, kut, backward)]
  rt, spread = _runtime_runs(
      _files.read_records(os.path.join(d, _files.RUNTIME_FILE)), kut,
      settings, backward)
  scenario = settings.get("scenario") or run.get("task") or "unknown"
  sites.sort(key=lambda r: r["step"])
  prov = _provenance.provenance(_provenance.read(d), kut, sites, rt,
                                backward=backward)
  return CampaignFiles(d, settings, run, source, kut, kuts, sites, effects,
                       findings, rt, spread, scenario, backward, prov,
                       read_fuzz(d, kut))


def report_data_of(files: CampaignFiles) -> dict:
  """The report data (:func:`peat_jax.report.report_data`) of read files."""
  shown = {k: v for k, v in files.settings.items() if k != "task_config"}
  shown.setdefault("backward", files.backward)
  nb = sum(r.get("phase") == "bwd" for r in files.sites)
  shown.setdefault("records", f"{files.source} ({len(files.sites)} site "
                   "records" + (f", {nb} at backward sites" if nb else "")
                   + ")")
  title = (f"peat_jax validation: {files.kut} with its VJP at the backward "
           f"sites on {files.scenario}" if files.backward == "kut" else None)
  return _report.report_data(
      kut=files.kut, scenario=files.scenario, records=files.sites,
      sites=_order(files.sites), effects=files.effects, runtime=files.runtime,
      runtime_spread=files.runtime_spread, findings=files.findings,
      settings=shown, title=title, provenance=files.provenance,
      fuzz=files.fuzz)


def load_report_data(directory: str | os.PathLike, *, kut: str | None = None,
                     source: str = "auto",
                     backward: str | None = None) -> dict:
  """Builds the report data of a campaign directory from its files.

  Args:
    directory: the campaign directory.
    kut: see :func:`read_campaign_files`.
    source: see :func:`read_campaign_files`.
    backward: see :func:`read_campaign_files`.

  Returns:
    The report data (:func:`peat_jax.report.report_data`).

  Raises:
    PeatError: as :func:`read_campaign_files`.
  """
  return report_data_of(read_campaign_files(directory, kut=kut,
                                            source=source, backward=backward))


class Rebuilt(NamedTuple):
  """What :func:`rebuild_report` wrote.

  Attributes:
    html: ``report.html``.
    json: ``report.json``.
    verdict: the KUT's verdict.
    data: the report data.
    fuzz_verdict: the verdict of the shapes beyond training (its fuzz
      records), or None without fuzz records.
  """

  html: str
  json: str
  verdict: str
  data: dict
  fuzz_verdict: str | None = None


def rebuild_report(directory: str | os.PathLike, *, kut: str | None = None,
                   source: str = "auto",
                   backward: str | None = None) -> Rebuilt:
  """Rewrites a campaign's ``report.html`` and ``report.json`` from its files.

  The KUT's fuzz records (``fuzz.msgpack``), when there are any, make the
  report's "Shapes beyond training" section and ``fuzz`` verdict, kept
  apart from the training verdict.

  Args:
    directory: the campaign directory.
    kut: see :func:`load_report_data`.
    source: see :func:`load_report_data`.
    backward: see :func:`load_report_data`.

  Returns:
    :class:`Rebuilt`.

  Raises:
    PeatError: as :func:`load_report_data`.
  """
  data: dict[str, Any] = load_report_data(directory, kut=kut, source=source,
                                          backward=backward)
  paths = _report.write_report(data, os.fspath(directory))
  return Rebuilt(str(paths.html), str(paths.json),
                 data["verdict"]["verdict"], data, fuzz_verdict_of(data))


def fuzz_verdict_of(data: dict) -> str | None:
  """The report data's fuzz verdict, None without fuzz records."""
  return (data.get("fuzz") or {}).get("verdict")
