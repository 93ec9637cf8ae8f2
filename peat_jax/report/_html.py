"""The campaign report: one self-contained HTML page and the same data as JSON.

:func:`write_report` takes the Profiler's campaign summary (a plain mapping,
schema below; numpy arrays and scalars are accepted anywhere a list or a
number is expected) and writes two files into a directory:

* ``report.json``: the data as given, as strict JSON. Numpy arrays become
  lists, numpy scalars numbers, tuples lists; NaN is written as ``null`` and
  +/-Inf as the strings ``"Infinity"`` / ``"-Infinity"``, so every JSON
  parser reads the file.
* ``report.html``: one file with no external reference (inline CSS, plots as
  inline SVG drawn by :mod:`peat_jax.report._charts`, no JavaScript). Sections, in
  order: title (kernel under test, model scenario); the first screen
  (:mod:`peat_jax.report._overview`): verdict badge and summary, what
  decided it, and the site map (every site at every checkpoint, colored
  by verdict, sized by noise ratio); crash and hang findings; the evidence
  per site (one collapsed row per site, worst first);
  localization, shapes beyond training (the fuzz verdict, kept apart from
  the training verdict, and each site's variants), noise-ratio heat
  table (sites x steps), noise ratio over training (per site against the
  checkpoint step, rising sites named), error / ULP-distance / bit-position
  histograms of the top sites, playback effect, runtime FI loss curves,
  training-level significance (weight distances in units of the seed and
  bf16 proxies), what the verdict covers (provenance), campaign settings,
  footer (peat_jax version, JSON file name). An absent optional section is
  replaced by a one-line note.

Schema (``docs/report.md`` has the same table with examples). Required keys
are marked *, everything else may be missing or ``None``::

  title*        str
  kut*          str      kernel under test, e.g. "matmul:native_bf16"
  scenario*     str      model scenario, e.g. "ViT-Ti pretraining, CIFAR-10"
  peat_version  str      (default: the installed peat_jax.__version__)
  created       str      ISO 8601 time
  verdict*      {"verdict"*: "pass"|"warn"|"fail", "summary"*: str,
                 "deciding": [[site, step], ...]}
  sites*        [site, ...] in execution order (may be empty), each:
    site*        str     e.g. "fwd/Block_0/Attn/dot_general:1"
    kernel       str
    direction*   "fwd"|"bwd"
    model*       str     diagnosed error model (DESIGN.md names)
    confidence   float   in [0, 1]
    evidence     str     the Detector's evidence sentence
    secondary    {"model", "confidence", "evidence"} the second cause
                         (e.g. reordering under an indexing fault)
    ratios       {"rmse", "mean_rel", "max_rel", "small_err": float|None
                  (KUT over golden error vs float64), "bias",
                  "beyond_ulps": float|None, "nonfinite_mismatch": int}
                         peat.analyzer.metric_ratios of the record shown
    verdict*     "pass"|"warn"|"fail"
    steps        [int]   checkpoint steps of the per-step lists below
    verdicts     [str]   each step's record verdict (default: the site's)
    noise_ratio  [float] pseudo-error RMS / noise floor, per step
    rel_rms      [float] relative RMS error against the tensor's scale, per step
    share_differ [float] share of differing elements, per step
    rel_hist     {"edges": [float] (n+1), "counts": [int] (n)}
    ulp_hist     [int]   bucket 0: distance 0; bucket k: [2**(k-1), 2**k)
    bits_xor     [int]   differing-bit counts; index 0 = mantissa LSB,
                         last = sign (needs mantissa_bits, exponent_bits)
    mantissa_bits int    stored mantissa bits (float32: 23)
    exponent_bits int    exponent bits (float32: 8)
    noise_trend  {"rises": bool, "factor": float|None, "factor_loo":
                  float|None, "from_step": int|None, "to_step": int|None,
                  "points": int}
  localization  {"site"*: str, "step"*: int, "noise_ratio": float}
  playback      {"steps"*: [int], "loss_golden"*: [float],
                 "loss_kut"*: [float], "grad_rel_diff": [float],
                 "update_rel_diff": [float]}
  runtime       [{"frequency"*: str, "steps"*: [int], "loss"*: [float],
                  "golden_loss": [float], "diverged_at": int|None,
                  "reason": str|None, "crashed": bool,
                  "significance": {"metric", "step", "vs_seed", "vs_bf16",
                                   "steps", "total", "layers"}}, ...]
                (a crashed run has empty lists and the crash as reason)
  crashes       [{"kind"*: "crash"|"hang", "phase"*: str, "message"*: str,
                  "step": int|None, "site": str|None,
                  "frequency": str|None, "signal": str|None,
                  "timeout_s": float|None}, ...]
                crash and hang findings of process isolation
  runtime_spread {"steps"*: [int], "loss_spread"*: [float],
                  "bf16_loss": [float]}
  settings      {str: str|int|float}
  provenance    {"kut"*: {"spec"*, ...}, "platform"*: {...},
                 "versions"*: {...}, "sites"*: [{"site"*, "kernel", "phase",
                 "in_shapes", "in_dtypes"}], "phases", "backward",
                 "checkpoint_steps", "frequencies", "runtime_steps"}
  fuzz          {"verdict"*: "pass"|"warn"|"fail", "summary"*: str,
                 "scope": str, "deciding": [[site, variant], ...],
                 "counts": {"variants", "findings", "pass", "warn",
                            "fail": int},
                 "families": [str], "sites": [str],
                 "variants"*: [{"site"*, "variant"*, "family", "kernel",
                   "shapes": [[int]], "model"*, "confidence",
                   "verdict"*, "evidence", "noise_ratio": float|None,
                   "secondary", "seed", "step", "golden_from"}, ...],
                 "findings": [{"site"*, "variant"*, "family", "step",
                   "seed", "error"*: str}, ...],
                 "first_failure": a variant or a finding, or None}
                the shapes beyond training: the KUT's fuzz records
                (peat.fuzz), their verdict kept apart from ``verdict``

Lists that belong together (a site's per-step lists and ``steps``; the
playback lists; a runtime run's lists) must have equal lengths.

>>> paths = write_report(data, "/tmp/campaign")   # doctest: +SKIP
>>> paths.html.name, paths.json.name              # doctest: +SKIP
('report.html', 'report.json')
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Mapping, Sequence

from peat_jax.report import _charts as _svg
from peat_jax.report import _overview
from peat_jax.report import _sections
from peat_jax.report import _shapes
from peat_jax.report._charts import esc, fmt
from peat_jax.report._markup import chip as _chip
from peat_jax.report._markup import linked as _linked
from peat_jax.report import _glossary
from peat_jax.report._markup import note as _note
from peat_jax.report._markup import table as _table
from peat_jax import core as _core
from peat_jax.report._schema import (
    HTML_NAME, JSON_NAME, ReportPaths, _NUM, _plain, _validate)


# ---------------------------------------------------------------- rendering

_CSS = """
body{font-family:system-ui,Segoe UI,Helvetica,Arial,sans-serif;margin:0;
 background:#f4f5f7;color:#1d2329;font-size:14px;line-height:1.45}
main{max-width:1180px;margin:0 auto;padding:24px 28px 40px;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;
 border-bottom:1px solid #dde1e5;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:#4a545e;margin:0 0 16px}
.verdict{display:flex;align-items:center;gap:22px;margin:10px 0 6px}
.badge{font-size:40px;font-weight:800;letter-spacing:2px;padding:10px 30px;
 border-radius:12px;color:#fff;min-width:120px;text-align:center}
.v-pass{background:#1e8e3e}.v-warn{background:#f2a900;color:#1d1d1d}
.v-fail{background:#c5221f}
.badge.small{font-size:24px;padding:6px 18px;min-width:80px}
.summary{font-size:16px;margin:0}.note{color:#5f6b76;font-style:italic}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}
th,td{border:1px solid #dde1e5;padding:3px 7px;text-align:left;
 vertical-align:top}
th{background:#eef1f4}td.num{text-align:right;font-variant-numeric:
 tabular-nums}
tr.r-fail td{background:#fdecea}tr.r-warn td{background:#fff6db}
.chip{display:inline-block;padding:0 8px;border-radius:8px;color:#fff;
 font-weight:700;font-size:12px}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;
 word-break:break-all}
.plots{display:flex;flex-wrap:wrap;gap:10px}
.plots svg{border:1px solid #e5e8eb;border-radius:4px}
.scroll{overflow-x:auto}
.covers{font-size:13px;color:#3c4650;margin:4px 0 0;max-width:1000px}
.decided h3{margin:12px 0 4px}.decided ol{margin:0 0 8px;padding-left:22px}
.decided li{margin:0 0 6px}.why{color:#3c4650;font-size:13px}
details.site{border:1px solid #dde1e5;border-radius:4px;margin:3px 0}
details.site summary{cursor:pointer;padding:4px 8px;list-style-position:
 inside}details.site[open] summary{border-bottom:1px solid #dde1e5}
details.site p{margin:6px 10px}summary.r-fail{background:#fdecea}
summary.r-warn{background:#fff6db}.rank{display:inline-block;min-width:
 22px;color:#5f6b76}.meta{color:#3c4650;font-size:13px;margin-left:6px}
footer{margin-top:30px;color:#5f6b76;font-size:12px;border-top:1px solid
 #dde1e5;padding-top:8px}
"""
_BIT_COLORS = {"sign": "#c5221f", "exponent": "#d9730d",
               "mantissa": "#1f5fa8"}


def _section_verdict(d: Mapping) -> str:
  """The first screen: badge and summary, what decided it, the site map."""
  v = d["verdict"]
  return "".join([
      '<section id="verdict"><div class="verdict">',
      f'<div class="badge v-{esc(v["verdict"])}">'
      f'{esc(v["verdict"].upper())}</div>',
      f'<p class="summary">{esc(v["summary"])}</p></div>',
      _overview.decided(d),
      '<div class="scroll">'
      + _overview.site_map(d["sites"], v.get("deciding") or []) + "</div>",
      _sections.covers_line(d), _shapes.verdict_line(d), "</section>"])


def finding_cause(c: Mapping) -> str:
  """A crash/hang finding's cause in a few words: the signal, the time
  limit, out of memory, or an exit."""
  if c.get("signal"):
    return str(c["signal"])
  if c.get("timeout_s") is not None:
    return f"time limit {fmt(c['timeout_s'])} s"
  return ("out of memory" if "out of memory" in str(c.get("message"))
          else "exited")


def _section_crashes(d: Mapping) -> str:
  crashes = d.get("crashes") or []
  if not crashes:
    return ""
  out = ['<section id="crashes"><h2>Crashes and hangs</h2>',
         "<p>The kernel under test took its worker process down (a signal, "
         "out of memory) or ran past its time limit; each is a finding and "
         "fails the KUT. Playback crashes are attributed by replaying the "
         "step with one site at a time.</p>"]
  rows, classes = [], []
  for c in crashes:
    how = finding_cause(c)
    rows.append([f'<span class="chip v-fail">{esc(c["kind"])}</span>',
                 esc(c["phase"]), esc(fmt(c.get("step"))),
                 f"<code>{esc(c.get('site') or '')}</code>"
                 if c.get("site") else esc(c.get("frequency") or "\u2014"),
                 esc(how), esc(c["message"])])
    classes.append("r-fail")
  out.append(_table(["finding", "phase", "step", "site / frequency",
                     "signal or limit", "message"], rows, (2,), classes))
  out.append("</section>")
  return "".join(out)


def _section_localization(d: Mapping) -> str:
  out = ['<section id="localization"><h2>Localization</h2>']
  loc = d.get("localization")
  if loc is None:
    out.append(_note("No localization: no site's pseudo-error left the "
                     "noise floor, or localization was not run."))
  else:
    ratio = loc.get("noise_ratio")
    extra = (f" (noise ratio {esc(fmt(ratio, 3))})" if ratio is not None
             else "")
    out.append("<p>First site in execution order whose pseudo-error leaves "
               f"the noise floor: <code>{esc(loc['site'])}</code> at step "
               f"<b>{esc(fmt(loc['step']))}</b>{extra}.</p>")
  out.append("</section>")
  return "".join(out)


def _section_heat(sites: Sequence[Mapping]) -> str:
  out = ['<section id="heat"><h2>Noise ratio per site and step</h2>']
  rows = [s for s in sites if s.get("steps") and s.get("noise_ratio")]
  if not rows:
    out.append(_note("No per-step noise ratios in the data."))
  else:
    steps = sorted({int(t) for s in rows for t in s["steps"]})
    values = []
    for s in rows:
      by_step = dict(zip(s["steps"], s["noise_ratio"]))
      values.append([by_step.get(t) for t in steps])
    out.append("<p>Pseudo-error relative to the noise floor (1 = at the "
               "floor; blue below, red above). Sites in execution order; "
               "hover a cell for its value.</p>")
    out.append('<div class="scroll">' + _svg.heat_table(
        [f"{s['site']} ({s['direction']})" for s in rows],
        [str(t) for t in steps], values, value_name="noise ratio",
        log=True, center=1.0) + "</div>")
  out.append("</section>")
  return "".join(out)


def _ulp_labels(n: int) -> tuple[list[str], list[str]]:
  labels, ranges = [], []
  for k in range(n):
    if k == 0:
      labels.append("0")
      ranges.append("distance 0")
    elif k == 1:
      labels.append("1")
      ranges.append("distance 1")
    else:
      labels.append(f"2^{k - 1}")
      ranges.append(f"distance [{2**(k - 1)}, {2**k})")
  return labels, ranges


def _bits_plot(s: Mapping) -> str:
  counts = s["bits_xor"]
  m, n = s["mantissa_bits"], len(counts)
  kinds = ["mantissa" if i < m else "sign" if i == n - 1 else "exponent"
           for i in range(n)]
  order = list(range(n - 1, -1, -1))  # sign on the left, as bits are written
  labels = [str(i) for i in order]
  within = {"mantissa": 0, "exponent": m, "sign": n - 1}
  tips = [f"bit {i} ({kinds[i]} bit {i - within[kinds[i]]}): "
          f"{fmt(counts[i])}" for i in order]
  return _svg.bar_chart(
      [counts[i] for i in order], labels, title="Differing bit positions",
      x_label="bit (sign | exponent | mantissa)", y_label="count (log)",
      log_y=True, colors=[_BIT_COLORS[kinds[i]] for i in order],
      legend=list(_BIT_COLORS.items()), tooltips=tips, max_labels=16,
      empty="no differing bits")


def _section_top(sites: Sequence[Mapping], top: int) -> str:
  out = ['<section id="top-sites"><h2>Error distributions of the top '
         'sites</h2>']
  chosen = [s for s in _overview.sorted_sites(sites) if s["model"] != "exact" and (
      s.get("rel_hist") or s.get("ulp_hist") or s.get("bits_xor"))]
  if not chosen:
    out.append(_note("No error histograms in the data (sites diagnosed "
                     "exact are not shown)."))
  for s in chosen[:top]:
    out.append(f"<h3><code>{esc(s['site'])}</code> ({esc(s['direction'])}): "
               f"{_linked(s['model'])} {_chip(s['verdict'])}</h3>")
    plots = []
    h = s.get("rel_hist")
    if h:
      plots.append(_svg.histogram(h["edges"], h["counts"],
                                  title="Relative error",
                                  x_label="|KUT - golden| / |golden| (bin "
                                  "lower edge)", log_y=True))
    if s.get("ulp_hist"):
      labels, ranges = _ulp_labels(len(s["ulp_hist"]))
      plots.append(_svg.bar_chart(
          s["ulp_hist"], labels, title="ULP distance", x_label="ULPs "
          "(bucket lower bound)", y_label="count (log)", log_y=True,
          tooltips=[f"{r}: {fmt(c)}" for r, c in zip(ranges, s["ulp_hist"])],
          max_labels=8, empty="no elements"))
    if s.get("bits_xor"):
      plots.append(_bits_plot(s))
    missing = [k for k in ("rel_hist", "ulp_hist", "bits_xor")
               if not s.get(k)]
    out.append('<div class="plots">' + "".join(plots) + "</div>")
    if missing:
      out.append(_note(f"Not in the data: {', '.join(missing)}."))
  if len(chosen) > top:
    out.append(_note(f"{len(chosen) - top} more sites with histograms are in "
                     "the JSON file."))
  out.append("</section>")
  return "".join(out)


def _rel(a: Any, b: Any) -> float | None:
  if not (isinstance(a, _NUM) and isinstance(b, _NUM)):
    return None
  if b == 0 or not (math.isfinite(a) and math.isfinite(b)):
    return None
  return abs(a - b) / abs(b)


def _section_playback(d: Mapping) -> str:
  out = ['<section id="playback"><h2>Playback FI: effect on the training '
         'step</h2>']
  pb = d.get("playback")
  if pb is None:
    out.append(_note("No playback FI results in the data."))
    out.append("</section>")
    return "".join(out)
  steps = pb["steps"]
  grad = pb.get("grad_rel_diff") or [None] * len(steps)
  upd = pb.get("update_rel_diff") or [None] * len(steps)
  loss_rel = [_rel(k, g) for k, g in zip(pb["loss_kut"], pb["loss_golden"])]
  out.append("<p>Each checkpoint step re-run once with the KUT at the "
             "selected sites; errors do not accumulate.</p>")
  plots = [_svg.line_chart(
      [_svg.Series("golden", steps, pb["loss_golden"], "#222222"),
       _svg.Series("KUT", steps, pb["loss_kut"], _svg.PALETTE[1], True)],
      title="Loss per checkpoint step", x_label="step", y_label="loss",
      width=520, height=260)]
  rel_series = [_svg.Series("loss", steps,
                            [math.nan if v is None else v for v in loss_rel])]
  if pb.get("grad_rel_diff"):
    rel_series.append(_svg.Series("gradients", steps, grad))
  if pb.get("update_rel_diff"):
    rel_series.append(_svg.Series("parameter update", steps, upd))
  plots.append(_svg.line_chart(
      rel_series, title="Relative difference KUT vs golden", x_label="step",
      y_label="relative difference (log)", log_y=True, width=520,
      height=260))
  out.append('<div class="plots">' + "".join(plots) + "</div>")
  rows = [[esc(fmt(t)), esc(fmt(g, 6)), esc(fmt(k, 6)), esc(fmt(r, 3)),
           esc(fmt(a, 3)), esc(fmt(b, 3))]
          for t, g, k, r, a, b in zip(steps, pb["loss_golden"],
                                      pb["loss_kut"], loss_rel, grad, upd)]
  out.append(_table(["step", "loss golden", "loss KUT", "loss rel. diff",
                     "gradient rel. diff", "update rel. diff"], rows,
                    (0, 1, 2, 3, 4, 5)))
  out.append("</section>")
  return "".join(out)


def _section_runtime(d: Mapping) -> str:
  out = ['<section id="runtime"><h2>Runtime FI: loss divergence</h2>']
  runs = d.get("runtime")
  if not runs:
    out.append(_note("No runtime FI run in the data."))
    out.append("</section>")
    return "".join(out)
  series, vlines = [], []
  golden = next((r for r in runs if r.get("golden_loss")), None)
  if golden is not None:
    series.append(_svg.Series("golden", golden["steps"],
                              golden["golden_loss"], "#222222", True))
  for i, r in enumerate(runs):
    color = _svg.PALETTE[i % len(_svg.PALETTE)]
    if not r["steps"]:  # a crashed run: in the table only
      continue
    at = r.get("diverged_at")
    series.append(_svg.Series(str(r["frequency"]), r["steps"], r["loss"],
                              color, False, () if at is None else (at,)))
    if at is not None:
      vlines.append((at, f"{r['frequency']}: diverged at {at}", color))
  band = None
  sp = d.get("runtime_spread")
  if sp is not None and golden is not None:
    gl = dict(zip(golden["steps"], golden["golden_loss"]))
    pts = [(t, gl[t], s) for t, s in zip(sp["steps"], sp["loss_spread"])
           if t in gl and isinstance(gl[t], _NUM) and isinstance(s, _NUM)]
    if pts:
      band = ([p[0] for p in pts], [p[1] - p[2] for p in pts],
              [p[1] + p[2] for p in pts], "golden seed-to-seed spread")
  losses = [float(v) for s in series for v in s.y
            if isinstance(v, _NUM) and not math.isnan(v)]
  ref = [float(v) for v in (golden or {}).get("golden_loss") or losses
         if isinstance(v, _NUM) and math.isfinite(v)]
  y_max = None  # diverged runs must not flatten the golden curve
  if ref and max(ref) > 0 and any(v > 100 * max(ref) for v in losses):
    y_max = 100 * max(ref)
  shown = [min(v, y_max or math.inf) for v in losses]
  log_y = (bool(shown) and min(shown) > 0
           and max(shown) > 50 * min(shown))
  out.append("<p>Training continued with the KUT called at each frequency; "
             "rings and dashed lines mark the first divergent step.</p>")
  out.append(_svg.line_chart(series, title="Loss vs step", x_label="step",
                             y_label="loss" + (" (log)" if log_y else ""),
                             log_y=log_y, band=band, vlines=vlines,
                             y_max=y_max, width=900, height=340))
  if sp is not None and band is None:
    out.append(_note("The golden spread envelope could not be aligned with "
                     "the golden loss steps."))
  rows = []
  for r in runs:
    last = r["loss"][-1] if r["loss"] else None
    glast = (r.get("golden_loss") or [None])[-1]
    rows.append([esc(r["frequency"]), esc(fmt(len(r["steps"]))),
                 esc(fmt(last, 5)), esc(fmt(glast, 5)),
                 esc(fmt(r.get("diverged_at"))),
                 esc(r.get("reason") or "\u2014")])
  out.append(_table(["frequency", "steps", "final loss", "golden final "
                     "loss", "diverged at", "reason"], rows, (1, 2, 3, 4)))
  out.append("</section>")
  return "".join(out)


def _section_settings(d: Mapping) -> str:
  out = ['<section id="settings"><h2>Campaign settings</h2>']
  settings = d.get("settings")
  if not settings:
    out.append(_note("No campaign settings in the data."))
  else:
    rows = []
    for k, v in settings.items():
      text = (v if isinstance(v, str) else fmt(v, 6)
              if isinstance(v, _NUM) or v is None
              else json.dumps(_plain(v, f"settings.{k}", True)))
      rows.append([f"<code>{esc(k)}</code>", esc(text)])
    out.append(_table(["setting", "value"], rows))
  out.append("</section>")
  return "".join(out)


def _version(d: Mapping) -> str:
  if d.get("peat_version"):
    return d["peat_version"]
  return _core.VERSION


def render_html(data: Mapping, *, json_name: str = JSON_NAME,
                top_sites: int = 3) -> str:
  """Renders the report page (see the module docstring for the schema).

  Args:
    data: the campaign summary.
    json_name: the JSON file name named in the footer.
    top_sites: how many of the worst sites get histograms.

  Returns:
    The HTML text.

  Raises:
    PeatError: the data does not follow the schema.
  """
  d = _plain(data, "data", json_safe=False)
  _validate(d)
  sites = d["sites"]
  created = d.get("created")
  head = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
          f"<meta name=\"viewport\" content=\"width=device-width, "
          f"initial-scale=1\"><title>{esc(d['title'])}</title>"
          f"<style>{_CSS}</style></head><body><main>")
  parts = [head, f"<header><h1>{esc(d['title'])}</h1>",
           f'<p class="sub">Kernel under test: <b>{esc(d["kut"])}</b> '
           f'&middot; model scenario: <b>{esc(d["scenario"])}</b>'
           + (f" &middot; created {esc(created)}" if created else "")
           + "</p></header>",
           _section_verdict(d), _section_crashes(d),
           _overview.section_evidence(sites),
           _section_localization(d), _shapes.section_fuzz(d),
           _section_heat(sites),
           _sections.section_trends(sites),
           _section_top(sites, top_sites), _section_playback(d),
           _section_runtime(d), _sections.section_significance(d),
           _sections.section_provenance(d), _glossary.section_glossary(d),
           _section_settings(d),
           f"<footer>peat_jax {esc(_version(d))} &middot; the same data as "
           f'JSON: <a href="{esc(json_name)}">{esc(json_name)}</a></footer>',
           "</main></body></html>"]
  return "\n".join(parts)


def _write_atomic(path: pathlib.Path, text: str) -> None:
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text, encoding="utf-8")
  os.replace(tmp, path)


def write_report(data: Mapping, directory: str | os.PathLike, *,
                 top_sites: int = 3) -> ReportPaths:
  """Writes ``report.json`` and a self-contained ``report.html``.

  The data is checked first; nothing is written when it breaks the schema.

  Args:
    data: the campaign summary (schema in the module docstring and
      ``docs/report.md``).
    directory: where to write; created when missing.
    top_sites: how many of the worst sites get error histograms.

  Returns:
    :class:`ReportPaths` of the two files.

  Raises:
    PeatError: a required key is missing, a value has the wrong type, a
      verdict or direction is unknown, or lists that belong together differ
      in length.
  """
  page = render_html(data, json_name=JSON_NAME, top_sites=top_sites)
  text = json.dumps(_plain(data, "data", json_safe=True), indent=1,
                    allow_nan=False)
  out = pathlib.Path(directory)
  out.mkdir(parents=True, exist_ok=True)
  paths = ReportPaths(out / HTML_NAME, out / JSON_NAME)
  _write_atomic(paths.json, text + "\n")
  _write_atomic(paths.html, page)
  return paths
