"""The report data: the one builder of a campaign's report (docs/report.md).

:func:`report_data` turns a KUT's site records, playback effects, runtime
runs, crash findings and fuzz records into the schema :func:`write_report`
renders (the fuzz records into a section and a verdict of their own,
``_shapes``); the campaign drivers (``peat.validate``) and the rebuild
from a campaign directory (``peat.rebuild_report``, ``peat-report``) both
call it, on the records read back from the campaign's files.
:func:`summary_table` is the plain-text summary of the same data.
"""

from __future__ import annotations

import datetime as _dt
from typing import Sequence

import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import core as _core
from peat_jax import detector as _detector
from peat_jax.core import PeatError
from peat_jax.report import _shapes
from peat_jax.report import _training
from peat_jax.report._html import finding_cause


def site_entries(records: Sequence[dict], order: Sequence[str]) -> list:
  """The report's site table: one entry per site, worst record first.

  Args:
    records: site records of one KUT (docs/campaign.md).
    order: site names in execution order.

  Returns:
    The report schema's ``sites`` list.
  """
  out = []
  for name in order:
    rs = sorted((r for r in records if r["site"] == name),
                key=lambda r: r["step"])
    if not rs:
      continue
    top = min(rs, key=lambda r: (-_detector.severity(r["diagnosis"]["verdict"]),
                                 -_ratio_key(r["signature"].get("noise_ratio")),
                                 -r["diagnosis"]["confidence"]))
    sig0 = rs[0]["signature"]
    fmt = _core.format_of_code(sig0.get("dtype_code", 0))
    bits = np.sum([r["signature"]["bits_xor"] for r in rs], axis=0)
    ulp = np.sum([r["signature"]["ulp_hist"] for r in rs], axis=0)
    sec = top["diagnosis"].get("secondary")
    extra = {"ratios": _json_ratios(_analyzer.metric_ratios(top["signature"]))}
    if sec:
      extra["secondary"] = {"model": sec["model"],
                            "confidence": sec["confidence"],
                            "evidence": sec["evidence"]}
    out.append({
        **extra,
        "site": name, "kernel": rs[0]["kernel"],
        "direction": "bwd" if rs[0]["phase"] == "bwd" else "fwd",
        "model": top["diagnosis"]["model"],
        "confidence": top["diagnosis"]["confidence"],
        "evidence": f"step {top['step']}: {top['diagnosis']['evidence']}",
        "verdict": top["diagnosis"]["verdict"],
        "top_step": top["step"],
        "top_noise_ratio": _finite_or_none(
            top["signature"].get("noise_ratio")),
        "steps": [r["step"] for r in rs],
        "noise_ratio": [r["signature"].get("noise_ratio") for r in rs],
        "verdicts": [r["diagnosis"]["verdict"] for r in rs],
        "rel_rms": [_analyzer.relative_to_scale(r["signature"])["rel_rms"]
                    for r in rs],
        "share_differ": [r["signature"]["share_differ"] for r in rs],
        "ulp_hist": ulp.tolist(), "bits_xor": bits.tolist(),
        "mantissa_bits": fmt.mantissa_bits,
        "exponent_bits": fmt.exponent_bits})
  for entry, trend in zip(out, _training.site_trends(out)):
    entry["noise_trend"] = trend
  return out


def _ratio_key(x) -> float:
  """A noise ratio for ordering: NaN (and None) rank as the worst."""
  if x is None:
    return -1.0
  x = float(x)
  return np.inf if np.isnan(x) else x


def _finite_or_none(x):
  return None if x is None or not np.isfinite(float(x)) else float(x)


def _json_ratios(r: dict) -> dict:
  """The ratio view with non-finite values as None (JSON has no NaN)."""
  return {k: (v if isinstance(v, int) or np.isfinite(v) else None)
          for k, v in r.items()}


def verdict_data(diags: dict, findings: Sequence[dict],
                 runtime: Sequence[dict] | None = None) -> dict:
  """The report's verdict: the Detector's, failed by crash/hang findings.

  Runtime runs with a ``significance`` add a sentence on how far the KUT
  moves the weights; beyond the bf16 proxy a ``pass`` becomes ``warn``
  (``peat_jax.report._training.with_significance``).

  Args:
    diags: ``{(site, step): Diagnosis}`` of the playback records.
    findings: crash and hang findings of process isolation.
    runtime: the report's runtime runs (None: none).

  Returns:
    The report schema's ``verdict`` mapping.

  Raises:
    PeatError: neither a diagnosis nor a finding.
  """
  return _training.with_significance(_record_verdict(diags, findings),
                                     runtime, _benign_warn(diags, findings))


def _benign_warn(diags: dict, findings: Sequence[dict]) -> bool:
  """Whether only benign records (exact/reordering, no other cause beside
  them) warn, with no failing record and no finding."""
  if findings or not diags:
    return False
  loud = [d for d in diags.values() if d.verdict != "pass"]
  if not loud or any(d.verdict == "fail" for d in loud):
    return False
  for d in loud:
    sec = getattr(d, "secondary", None)
    if d.model not in _detector.BENIGN or (
        sec is not None and sec.model not in _detector.BENIGN):
      return False
  return True


def _record_verdict(diags: dict, findings: Sequence[dict]) -> dict:
  """The verdict of playback records and findings (see verdict_data)."""
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
             + "; ".join(finding_line(f) for f in findings[:5])
             + (f"; and {len(findings) - 5} more" if len(findings) > 5
                else ""))
  if v is not None:
    summary += f". Playback records: {v.summary}"
  deciding = [[f["site"] or f"{f['phase']} {f['frequency'] or ''}".strip(),
               f["step"]] for f in findings]
  if v is not None and v.verdict == "fail":
    deciding += [list(k) for k in v.deciding]
  return {"verdict": "fail", "summary": summary, "deciding": deciding[:50]}


def _num(x) -> float:
  return float("nan") if x is None else float(x)


def summary_table(data: dict) -> str:
  """A plain-text summary of report data (what :func:`validate` prints)."""
  bwd = [s for s in data["sites"] if s.get("direction") == "bwd"]
  with_bwd = (data.get("settings") or {}).get("backward") == "kut" or bwd
  lines = [f"KUT {data['kut']} on {data['scenario']}"
           + (" (backward: kut, the KUT's VJP at the backward sites)"
              if with_bwd else "")
           + f": {data['verdict']['verdict'].upper()}",
           f"  {data['verdict']['summary']}"]
  w = max([len(s["site"]) for s in data["sites"]] + [4])
  lines.append(f"  {'site':<{w}}  {'model':<24} {'verdict':<7} "
               "noise_ratio  rmse_x  max_rel_x")
  for s in data["sites"]:
    # Model, verdict and ratios of one record: the site's worst.
    nr = s.get("top_noise_ratio")
    if "top_step" not in s:  # report data of before the worst record's
      vals = [x for x in s["noise_ratio"] if x is not None and x == x]
      nr = max(vals) if vals else None
    rt = s.get("ratios") or {}
    model = s["model"] + (f" + {s['secondary']['model']}"
                          if s.get("secondary") else "")
    lines.append(f"  {s['site']:<{w}}  {model:<24} {s['verdict']:<7} "
                 f"{_num(nr):<11.2g}  "
                 f"{_num(rt.get('rmse')):<6.2g}  {_num(rt.get('max_rel')):.2g}")
  if with_bwd:
    worst = [s for s in bwd if s["verdict"] != "pass"]
    lines.append(f"  backward sites: {len(bwd)} of {len(data['sites'])}"
                 + (f", {len(worst)} not pass (worst "
                    f"{max(worst, key=lambda s: _detector.severity(s['verdict']))['site']})"
                    if worst else ", all pass"))
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
    if r.get("significance"):
      lines.append(f"  {'':<32} "
                   + _training.significance_sentence(r["significance"]))
  for s in data["sites"]:
    line = _training.trend_sentence(s)
    if line:
      lines.append(f"  rising: {line}")
  lines += ["  " + line for line in _shapes.fuzz_lines(data.get("fuzz"))]
  crashes = data.get("crashes") or []
  if crashes:
    lines.append(f"  crash and hang findings ({len(crashes)}):")
    for f in crashes:
      lines.append(f"    {finding_line(f)}")
  if data.get("provenance"):
    lines += ["  provenance: " + line
              for line in _training.provenance_lines(data["provenance"])]
  return "\n".join(lines)


def finding_line(f: dict) -> str:
  """One line of a crash or hang finding (summary and verdict)."""
  where = (f"playback step {f['step']} at site {f['site'] or '(several)'}"
           if f["phase"] == "playback" else
           f"runtime FI {f['frequency']}" if f["phase"] == "runtime" else
           f["phase"])
  return f"{f['kind']}: {where}: {finding_cause(f)}"


def report_data(*, kut: str, scenario: str, records: Sequence[dict],
                sites: Sequence[str], effects: Sequence[dict] = (),
                runtime: Sequence[dict] | None = None,
                runtime_spread: dict | None = None,
                findings: Sequence[dict] = (),
                settings: dict | None = None,
                title: str | None = None,
                provenance: dict | None = None,
                fuzz: Sequence[dict] = ()) -> dict:
  """The report data (docs/report.md schema) of one KUT's records.

  Args:
    kut: the KUT spec.
    scenario: the scenario label.
    records: site records (``kind == "site"``) of that KUT.
    sites: site names in execution order.
    effects: playback effect records (``kind == "effect"``).
    runtime: runtime runs in the report's ``runtime`` schema, or None.
    runtime_spread: ``{"steps", "loss_spread"}`` or None.
    findings: crash and hang findings of process-isolated runs (they fail
      the verdict).
    settings: shown in the report's settings table.
    title: default ``"peat_jax validation: <kut> on <scenario>"``.
    provenance: what the verdict covers (docs/report.md ``provenance``),
      or None.
    fuzz: the KUT's fuzz records and findings (``fuzz.msgpack``, in file
      order): the report's ``fuzz`` section, "Shapes beyond training",
      with a verdict of its own; the training ``verdict`` does not read
      them.

  Returns:
    The data mapping for :func:`write_report`.

  Raises:
    PeatError: no site record and no finding.
  """
  if not records and not findings:
    raise PeatError(f"no site record of KUT {kut!r}: nothing to report; run "
                    "playback (or op-level playback) first")
  diags = {(r["site"], r["step"]): _detector.diagnosis_of(r) for r in records}
  verdict = verdict_data(diags, list(findings), runtime)
  effects = sorted(effects, key=lambda e: e["step"])
  entries = site_entries(records, sites)
  return {
      "title": title or f"peat_jax validation: {kut} on {scenario}",
      "kut": kut, "scenario": scenario,
      "created": _dt.datetime.now(_dt.timezone.utc).isoformat(
          timespec="seconds"),
      "verdict": verdict,
      "crashes": list(findings),
      "sites": entries,
      "localization": _detector.localize(records, sites),
      "playback": {
          "steps": [e["step"] for e in effects],
          "loss_golden": [e["loss_golden"] for e in effects],
          "loss_kut": [e["loss_kut"] for e in effects],
          "grad_rel_diff": [e["grad_rel_diff"] for e in effects],
          "update_rel_diff": [e["update_rel_diff"] for e in effects]}
                  if effects else None,
      "runtime": list(runtime) if runtime else None,
      "runtime_spread": runtime_spread if runtime else None,
      "settings": dict(settings or {}),
      "provenance": dict(provenance) if provenance else None,
      "fuzz": _shapes.fuzz_data(fuzz),
  }
