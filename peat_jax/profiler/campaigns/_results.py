"""A campaign's results as data: :func:`read_campaign`.

Reads a campaign directory with the same reader as the report
(:func:`peat_jax.profiler.campaigns._campaign_report.read_campaign_files`) and the same
report data builder (:func:`peat_jax.report.report_data`), and returns them
as typed, immutable objects (docs/campaign.md):

>>> c = peat.read_campaign("runs/c1")                      # doctest: +SKIP
>>> c.verdict.verdict, c.sites()                           # doctest: +SKIP
>>> df = c.to_pandas()      # one row per (step, site)     # doctest: +SKIP
>>> c.fuzz_verdict and c.fuzz_verdict.verdict  # shapes beyond training
...                                                        # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import NamedTuple

from peat_jax import report as _report
from peat_jax.core import PeatError
from peat_jax.profiler.campaigns import _campaign_report


class SiteRecord(NamedTuple):
  """One (step, site) playback record: the KUT against golden there.

  Attributes:
    step: the checkpoint step.
    site: the site's name.
    kernel: the site's kernel.
    phase: ``fwd`` or ``bwd``.
    reduction: the reduction length the Detector used (None if none).
    model: the diagnosed error model (``exact``, ``precision:bf16``, ...).
    confidence: the diagnosis' confidence.
    verdict: ``pass``, ``warn`` or ``fail``.
    evidence: the rule's evidence, in words.
    noise_ratio: error vs the golden kernel's own distance to float64
      (None without a reference).
    share_differ: share of elements that differ from golden.
    abs_max: largest absolute error.
    rel_rms: RMS of the relative error.
    signature: every stored signature field (scalars and histograms).
  """

  step: int
  site: str
  kernel: str
  phase: str
  reduction: int | None
  model: str
  confidence: float
  verdict: str
  evidence: str
  noise_ratio: float | None
  share_differ: float
  abs_max: float
  rel_rms: float
  signature: dict


class EffectRecord(NamedTuple):
  """What the KUT did to one playback step as a whole.

  Attributes:
    step: the checkpoint step.
    loss_golden: the golden step's loss.
    loss_kut: the step's loss with the KUT at the selected sites.
    grad_rel_diff: relative difference of the gradient norms.
    update_rel_diff: ``||update_kut - update|| / ||update||``.
  """

  step: int
  loss_golden: float
  loss_kut: float
  grad_rel_diff: float
  update_rel_diff: float


class RuntimeRun(NamedTuple):
  """Runtime FI at one frequency against the golden trajectory.

  Attributes:
    frequency: the frequency's label (``every``, ``every 4 steps``, ...).
    steps: the step numbers.
    loss: the run's loss per step.
    golden_loss: the golden trajectory's loss per step.
    diverged_at: the first diverged step, or None.
    reason: why it diverged (or crashed), else ``""``.
    crashed: the worker crashed or hung (process isolation).
    extra: any further fields of the report's runtime entry.
  """

  frequency: str
  steps: tuple
  loss: tuple
  golden_loss: tuple
  diverged_at: int | None
  reason: str
  crashed: bool
  extra: dict


class Finding(NamedTuple):
  """A crash or hang of the KUT in an isolated worker.

  Attributes:
    kind: ``crash`` or ``hang``.
    phase: ``playback``, ``runtime`` or ``check``.
    step: the playback step (None for runtime FI).
    site: the site that reproduces it alone (None: several, or unknown).
    frequency: the runtime frequency (None for playback).
    signal: the signal's name, or None.
    timeout_s: the time limit that ran out (hangs), or None.
    message: what happened.
  """

  kind: str
  phase: str
  step: int | None
  site: str | None
  frequency: str | None
  signal: str | None
  timeout_s: float | None
  message: str


class CampaignVerdict(NamedTuple):
  """The KUT's verdict over the campaign.

  Attributes:
    verdict: ``pass``, ``warn`` or ``fail``.
    summary: one line on why.
    deciding: ``(site, step)`` pairs that decided it.
    localization: the first site and step beyond the noise floor
      (``{"site", "step", "noise_ratio", ...}``) or None.
  """

  verdict: str
  summary: str
  deciding: tuple
  localization: dict | None


class Provenance(NamedTuple):
  """What a campaign's verdict covers, and nothing else (docs/profiler.md).

  Attributes:
    kut: the KUT: ``spec``, ``source``, ``kernel``, ``variant``, ``tile``,
      ``site_kernel`` and ``content`` (``{"sha256", "files"}``, the hash of
      its library or module; None for the golden kernel). Only ``spec``
      when the campaign has no ``provenance.json``.
    platform: backend, device kind and count, visible cores, OS, Python
      (empty when not recorded).
    versions: peat_jax, jax, jaxlib, ... and ``xla_flags`` (those known
      to change numerics), ``xla_flags_other`` (empty when not recorded).
    sites: per site ``{"site", "kernel", "phase", "in_shapes",
      "in_dtypes"}`` (shapes and dtypes of the inputs exercised; a site
      only in the records has no shapes).
    phases: ``fwd``, ``bwd``: the phases the KUT ran in.
    backward: ``"kut"`` (its VJP at the backward sites) or ``"golden"``.
    checkpoint_steps: the playback checkpoints with records.
    frequencies: the runtime FI frequencies that ran.
    runtime_steps: the first and last runtime FI step, or None.
    earlier: the platforms and versions of earlier sessions of a resumed
      campaign.
    covers: the statement in words ("A pass covers exactly this and
      nothing else: ...").
  """

  kut: dict
  platform: dict
  versions: dict
  sites: tuple
  phases: tuple
  backward: str
  checkpoint_steps: tuple
  frequencies: tuple
  runtime_steps: tuple | None
  earlier: tuple
  covers: str


def _provenance(p: dict) -> Provenance:
  steps = p.get("runtime_steps")
  return Provenance(
      dict(p["kut"]), dict(p.get("platform") or {}),
      dict(p.get("versions") or {}),
      tuple(dict(s) for s in p.get("sites") or ()),
      tuple(p.get("phases") or ()), p.get("backward") or "golden",
      tuple(p.get("checkpoint_steps") or ()),
      tuple(p.get("frequencies") or ()),
      tuple(steps) if steps is not None else None,
      tuple(p.get("earlier") or ()), _report.covers_sentence(p))


class FuzzRecord(NamedTuple):
  """One fuzz variant of a site: the KUT against golden on inputs derived
  from the site's captured real inputs (``peat.fuzz``, ``fuzz.msgpack``).

  Attributes:
    site: the site's name.
    variant: the variant's name (``len=64``, ``batch=1``,
      ``q_len<kv_len``, ``scale=edge``, ...).
    family: its family (``batch``, ``rows``, ``length``, ``attention``,
      ``magnitude``, ``denormal``).
    shapes: the variant's input shapes.
    seed: the variants' seed.
    step: the captured step the inputs come from.
    kernel: the site's kernel.
    model: the diagnosed error model.
    confidence: the diagnosis' confidence.
    verdict: ``pass``, ``warn`` or ``fail``.
    evidence: the rule's evidence, in words.
    noise_ratio: error vs the golden kernel's own distance to float64
      (None without a reference).
    golden_from: the golden kernel of the variant: ``primitive``,
      ``site`` (the task's marked function) or ``standard``.
    signature: every stored signature field.
  """

  site: str
  variant: str
  family: str
  shapes: tuple
  seed: int | None
  step: int | None
  kernel: str | None
  model: str
  confidence: float
  verdict: str
  evidence: str
  noise_ratio: float | None
  golden_from: str | None
  signature: dict


class FuzzFinding(NamedTuple):
  """A fuzz variant the KUT failed on outright: it raised, or returned
  another shape or dtype than the golden kernel (a ``fail``).

  Attributes:
    site: the site's name.
    variant: the variant's name.
    family: its family.
    step: the captured step.
    seed: the variants' seed.
    error: what the KUT did.
  """

  site: str
  variant: str
  family: str
  step: int | None
  seed: int | None
  error: str


class FuzzVerdict(NamedTuple):
  """The verdict of the shapes beyond training, kept apart from the
  training verdict (:class:`CampaignVerdict`), which covers the
  training's shapes only.

  Attributes:
    verdict: ``pass``, ``warn`` or ``fail`` (a finding fails it).
    summary: one line on why.
    deciding: ``(site, variant)`` pairs that decided it.
    first_failure: the first variant in run order that failed (the
      report's ``fuzz.first_failure`` mapping), or None.
  """

  verdict: str
  summary: str
  deciding: tuple
  first_failure: dict | None


class CampaignResults(NamedTuple):
  """A campaign directory's settings, records and verdict (read_campaign).

  Attributes:
    directory: the campaign directory.
    kut: the KUT spec the records are of.
    scenario: the scenario's (task's) label.
    settings: ``campaign.json`` (what ``peat.validate`` ran; empty for a
      campaign made by the separate tools).
    source: ``playback`` or ``ops`` (op-level playback records).
    playback: the site records, by step, in execution order of the sites.
    effects: the playback effect records, by step.
    runtime: the runtime FI runs.
    crashes: the crash and hang findings.
    verdict: the verdict, with its summary and localization.
    provenance: what the verdict covers (:class:`Provenance`).
    report: the report data (docs/report.md), as ``report.json`` has it.
    fuzz: the KUT's fuzz records (:class:`FuzzRecord`, in run order):
      the shapes beyond training; empty without ``fuzz.msgpack``.
    fuzz_findings: its fuzz findings (:class:`FuzzFinding`).
    fuzz_verdict: their verdict (:class:`FuzzVerdict`), kept apart from
      ``verdict``; None without fuzz records.
  """

  directory: str
  kut: str
  scenario: str
  settings: dict
  source: str
  playback: tuple
  effects: tuple
  runtime: tuple
  crashes: tuple
  verdict: CampaignVerdict
  provenance: Provenance
  report: dict
  fuzz: tuple = ()
  fuzz_findings: tuple = ()
  fuzz_verdict: FuzzVerdict | None = None

  def sites(self) -> list[str]:
    """The site names of the records, in execution order."""
    return [e["site"] for e in self.report["sites"]]

  def to_pandas(self):
    """The site records as a ``pandas.DataFrame``, one row per (step, site).

    Columns: the fields of :class:`SiteRecord` but ``signature``, plus
    ``kut``; the effect of the record's step (``loss_golden``,
    ``loss_kut``, ``grad_rel_diff``, ``update_rel_diff``; NaN where
    none).

    Raises:
      PeatError: pandas is not installed (``pip install
        'peat_jax[pandas]'``).
    """
    try:
      import pandas as pd  # pylint: disable=g-import-not-at-top
    except ImportError as err:
      raise PeatError(
          "CampaignResults.to_pandas needs pandas, which is not installed. "
          "Fix: pip install 'peat_jax[pandas]' (or pip install pandas); the "
          "records are also plain tuples in .playback") from err
    effects = {e.step: e for e in self.effects}
    cols = [f for f in SiteRecord._fields if f != "signature"]
    nan = float("nan")
    rows = []
    for r in self.playback:
      e = effects.get(r.step)
      rows.append({"kut": self.kut, **{c: getattr(r, c) for c in cols},
                   "loss_golden": e.loss_golden if e else nan,
                   "loss_kut": e.loss_kut if e else nan,
                   "grad_rel_diff": e.grad_rel_diff if e else nan,
                   "update_rel_diff": e.update_rel_diff if e else nan})
    return pd.DataFrame(rows, columns=["kut", *cols, "loss_golden",
                                       "loss_kut", "grad_rel_diff",
                                       "update_rel_diff"])


def _site(r: dict) -> SiteRecord:
  sig, diag = r["signature"], r["diagnosis"]
  return SiteRecord(
      int(r["step"]), r["site"], r["kernel"], r["phase"], r.get("reduction"),
      diag["model"], float(diag["confidence"]), diag["verdict"],
      diag["evidence"], sig.get("noise_ratio"), float(sig["share_differ"]),
      float(sig["abs_max"]), float(sig["rel_rms"]), dict(sig))


def _fuzz_record(r: dict) -> FuzzRecord:
  sig, diag = r.get("signature") or {}, r["diagnosis"]
  nr = sig.get("noise_ratio")
  return FuzzRecord(
      r["site"], r["variant"], r.get("family") or "",
      tuple(tuple(s) for s in r.get("shapes") or ()), r.get("seed"),
      r.get("step"), r.get("kernel"), diag["model"],
      float(diag["confidence"]), diag["verdict"], diag["evidence"],
      None if nr is None else float(nr), r.get("golden_from"), dict(sig))


def _fuzz_finding(f: dict) -> FuzzFinding:
  return FuzzFinding(f["site"], f["variant"], f.get("family") or "",
                     f.get("step"), f.get("seed"), f.get("error") or "")


def _fuzz_verdict(fz: dict | None) -> FuzzVerdict | None:
  if not fz:
    return None
  return FuzzVerdict(fz["verdict"], fz["summary"],
                     tuple(tuple(k) for k in fz.get("deciding") or ()),
                     fz.get("first_failure"))


def _run(r: dict) -> RuntimeRun:
  known = ("frequency", "steps", "loss", "golden_loss", "diverged_at",
           "reason", "crashed")
  return RuntimeRun(r["frequency"], tuple(r["steps"]), tuple(r["loss"]),
                    tuple(r["golden_loss"]), r["diverged_at"],
                    r["reason"] or "", bool(r.get("crashed", False)),
                    {k: v for k, v in r.items() if k not in known})


def _finding(f: dict) -> Finding:
  return Finding(f["kind"], f["phase"], f.get("step"), f.get("site"),
                 f.get("frequency"), f.get("signal"), f.get("timeout_s"),
                 f.get("message", ""))


def read_campaign(directory: str | os.PathLike, *, kut: str | None = None,
                  source: str = "auto") -> CampaignResults:
  """A campaign's settings, records and verdict as typed objects.

  Args:
    directory: a campaign directory (``peat.validate``, or the tools).
    kut: the KUT whose records to read (default: the campaign's, or the
      only one in the records).
    source: ``"playback"``, ``"ops"`` (op-level playback records) or
      ``"auto"`` (playback records when there are any).

  Returns:
    :class:`CampaignResults` (``.to_pandas()`` for a DataFrame); its
    ``fuzz``, ``fuzz_findings`` and ``fuzz_verdict`` hold the shapes
    beyond training (``fuzz.msgpack``), apart from ``verdict``.

  Raises:
    PeatError: a missing directory, no records, several KUTs and no
      ``kut``, a corrupt record file.
  """
  files = _campaign_report.read_campaign_files(directory, kut=kut,
                                               source=source)
  data = _campaign_report.report_data_of(files)
  order = {e["site"]: i for i, e in enumerate(data["sites"])}
  playback = sorted((_site(r) for r in files.sites),
                    key=lambda r: (r.step, order.get(r.site, len(order))))
  effects = tuple(EffectRecord(int(e["step"]), e["loss_golden"],
                               e["loss_kut"], e["grad_rel_diff"],
                               e["update_rel_diff"])
                  for e in sorted(files.effects, key=lambda e: e["step"]))
  v = data["verdict"]
  verdict = CampaignVerdict(v["verdict"], v["summary"],
                            tuple(tuple(d) for d in v["deciding"]),
                            data.get("localization"))
  return CampaignResults(
      files.directory, files.kut, files.scenario, dict(files.settings),
      files.source, tuple(playback), effects,
      tuple(_run(r) for r in data.get("runtime") or ()),
      tuple(_finding(f) for f in files.findings), verdict,
      _provenance(files.provenance), data,
      tuple(_fuzz_record(r) for r in files.fuzz if r["kind"] == "site"),
      tuple(_fuzz_finding(f) for f in files.fuzz
            if f["kind"] == "fuzz_error"),
      _fuzz_verdict(data.get("fuzz")))
