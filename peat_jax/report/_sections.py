"""The report page's training-level sections (docs/report.md).

* "Noise ratio over training": each site's noise ratio against the
  checkpoint step, and which sites' ratios rise
  (:func:`peat_jax.detector.noise_trend`);
* "Runtime FI: training-level significance": each run's weight distance to
  the golden trajectory in units of the bf16 proxy and of the seed-to-seed
  distance, over the saved steps, in total and per layer;
* "What this verdict covers": the campaign's provenance.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from peat_jax import detector as _detector
from peat_jax.report import _charts as _svg
from peat_jax.report import _training
from peat_jax.report._charts import esc, fmt
from peat_jax.report._markup import empty_section, note, table

#: Most sites drawn in the noise-ratio-over-training chart.
TREND_SITES = 10
#: Most layers listed in a run's per-layer table (all are in the JSON).
LAYER_ROWS = 24


def _nan(v: Any) -> float:
  return math.nan if v is None else float(v)


def _worst(site: Mapping) -> float:
  vals = [float(v) for v in site.get("noise_ratio") or []
          if v is not None and math.isfinite(float(v))]
  return max(vals) if vals else -1.0


def section_trends(sites: Sequence[Mapping]) -> str:
  """Each site's noise ratio against the checkpoint step."""
  rows = [s for s in sites if len(s.get("steps") or []) >= 2]
  if not rows:
    return empty_section("trends", "Noise ratio over training",
                         "Fewer than two checkpoint steps per site: no "
                         "trend over training.")
  out = ['<section id="trends"><h2>Noise ratio over training</h2>']
  rising = [s for s in rows if (s.get("noise_trend") or {}).get("rises")]
  out.append(
      f"<p>Errors that depend on the training state (FP8 with growing "
      f"outliers, an error growing with the weights) show as a noise ratio "
      f"rising from checkpoint to checkpoint. A site's ratio <i>rises</i> "
      f"when, over at least {_detector.TREND_MIN_STEPS} checkpoint steps, "
      f"the Theil-Sen line of log(noise ratio) against the step grows by at "
      f"least {fmt(_detector.TREND_FACTOR)}x from the first to the last "
      f"checkpoint, and still does with any one step left out.</p>")
  if rising:
    out.append("<p><b>Rising over training:</b></p><ul>" + "".join(
        f"<li><code>{esc(_training.trend_sentence(s))}</code></li>"
        for s in rising) + "</ul>")
  else:
    out.append(note("No site's noise ratio rises over training."))
  shown = rising + sorted((s for s in rows if s not in rising),
                          key=lambda s: -_worst(s))
  shown = shown[:TREND_SITES]
  series = [_svg.Series(f"{s['site']}", s["steps"],
                        [_nan(v) for v in s["noise_ratio"]],
                        _svg.PALETTE[i % len(_svg.PALETTE)],
                        s not in rising)
            for i, s in enumerate(shown)]
  steps = sorted({t for s in shown for t in s["steps"]})
  series.append(_svg.Series("noise floor (1)", [steps[0], steps[-1]],
                            [1.0, 1.0], "#999999", True))
  out.append(_svg.line_chart(series, title="Noise ratio per checkpoint step",
                             x_label="checkpoint step",
                             y_label="noise ratio (log)", log_y=True,
                             width=900, height=320))
  if len(rows) > len(shown):
    out.append(note(f"{len(rows) - len(shown)} more sites are in the heat "
                    "table above and the JSON file."))
  out.append("</section>")
  return "".join(out)


def _ratio_series(runs: Sequence[Mapping], key: str) -> list:
  out = []
  for i, r in enumerate(runs):
    t = r["significance"]["total"]
    if t.get(key) is None:
      continue
    out.append(_svg.Series(str(r["frequency"]), r["significance"]["steps"],
                           [_nan(v) for v in t[key]["w1"]],
                           _svg.PALETTE[i % len(_svg.PALETTE)]))
  return out


def _ratio_chart(runs: Sequence[Mapping], key: str, what: str) -> str:
  series = _ratio_series(runs, key)
  if not series:
    return note(f"No {what} distance was measured.")
  steps = sorted({t for s in series for t in s.x})
  series.append(_svg.Series(f"1 = {what}", [steps[0], steps[-1]],
                            [1.0, 1.0], "#999999", True))
  return _svg.line_chart(
      series, title=f"Weight distance / {what} distance",
      x_label="saved step", y_label="ratio of Wasserstein-1 (log)",
      log_y=True, width=440, height=280)


def _distance_chart(runs: Sequence[Mapping]) -> str:
  series = [_svg.Series(str(r["frequency"]), r["significance"]["steps"],
                        [_nan(v) for v in
                         r["significance"]["total"]["distance"]["w1"]],
                        _svg.PALETTE[i % len(_svg.PALETTE)])
            for i, r in enumerate(runs)]
  t = runs[0]["significance"]
  for key, name, color in (("seed", "seed-to-seed", "#222222"),
                           ("bf16", "bf16 proxy", "#c5221f")):
    if t["total"].get(key) is not None:
      series.append(_svg.Series(name, t["steps"],
                                [_nan(v) for v in t["total"][key]["w1"]],
                                color, True))
  return _svg.line_chart(series, title="Wasserstein-1 to the golden weights",
                         x_label="saved step", y_label="distance (log)",
                         log_y=True, width=440, height=280)


def _cell(block: Mapping, key: str, metric: str, i: int = -1) -> str:
  vals = (block.get(key) or {}).get(metric)
  return esc(fmt(vals[i], 3)) if vals else "\u2014"


def _last(layer: Mapping, key: str) -> float | None:
  return ((layer.get(key) or {}).get("w1") or [None])[-1]


def _layer_bars(sig: Mapping, key: str, what: str) -> str:
  """Each layer's Wasserstein-1 ratio at the last saved step (param order)."""
  layers = sig["layers"]
  vals = [_nan(_last(l, key)) for l in layers]
  return _svg.bar_chart(
      vals, ["/".join(l["layer"].split("/")[-2:]) for l in layers],
      title=f"Per layer: W1 / {what} W1", x_label="layer (parameter order)",
      y_label="ratio (log)", log_y=True,
      tooltips=[f"{l['layer']}: {fmt(v, 3)}" for l, v in zip(layers, vals)],
      width=440, height=260, max_labels=8,
      empty=f"no {what} distance per layer")


def _layer_table(run: Mapping) -> str:
  sig = run["significance"]
  def moved(layer: Mapping) -> tuple:
    v = _last(layer, "vs_bf16")
    return (v is None, -v if v is not None else 0.0, layer["layer"])

  layers = sorted(sig["layers"], key=moved)
  rows = [[f"<code>{esc(l['layer'])}</code>",
           _cell(l, "distance", "w1"), _cell(l, "vs_bf16", "w1"),
           _cell(l, "vs_seed", "w1"), _cell(l, "distance", "rel_l2"),
           _cell(l, "vs_bf16", "rel_l2"), _cell(l, "vs_seed", "rel_l2")]
          for l in layers[:LAYER_ROWS]]
  out = [f"<h3>Per layer, {esc(run['frequency'])}, step "
         f"{esc(fmt(sig['step']))}</h3>",
         '<div class="plots">' + _layer_bars(sig, "vs_bf16", "bf16 proxy")
         + _layer_bars(sig, "vs_seed", "seed-to-seed") + "</div>",
         table(["layer", "W1", "W1 / bf16", "W1 / seed", "rel. L2",
                "rel. L2 / bf16", "rel. L2 / seed"], rows,
               (1, 2, 3, 4, 5, 6))]
  if len(layers) > LAYER_ROWS:
    out.append(note(f"{LAYER_ROWS} of {len(layers)} layers, most moved "
                    "(against the bf16 proxy) first; every layer is in the "
                    "JSON file."))
  return "".join(out)


def section_significance(d: Mapping) -> str:
  """The runtime runs' weight distances in units of the two yardsticks."""
  title = "Runtime FI: training-level significance"
  runs = [r for r in d.get("runtime") or [] if r.get("significance")]
  if not runs:
    return empty_section("significance", title,
                         "No weight distance in the data (no saved golden "
                         "step inside the runtime FI window, or no runtime "
                         "FI).")
  out = [f'<section id="significance"><h2>{esc(title)}</h2>']
  out.append(
      "<p>At every saved golden step inside the runtime FI window each run's "
      "weights are compared with the golden trajectory's: the Wasserstein-1 "
      "distance of the weight values (as in <i>Is Flash Attention "
      "Stable?</i>, arXiv 2405.02803) and the relative L2 distance, per "
      "layer and in total. The distance is read in units of two "
      "yardsticks measured the same way: two golden runs that differ only "
      "in their seed, and a bf16 proxy (the same training with every matmul "
      "and convolution at bfloat16 inputs). Information beside the "
      "verdict; a KUT that moves the weights beyond the bf16 proxy "
      f"(ratio above {fmt(_detector.BF16_PROXY_LIMIT)}) warns.</p>")
  out.append("<ul>" + "".join(
      f"<li>{esc(r['frequency'])}: the KUT "
      f"{esc(_training.significance_sentence(r['significance']))}</li>"
      for r in runs) + "</ul>")
  out.append('<div class="plots">' + _ratio_chart(runs, "vs_bf16", "bf16 "
             "proxy") + _ratio_chart(runs, "vs_seed", "seed-to-seed")
             + _distance_chart(runs) + "</div>")
  rows = []
  for r in runs:
    t = r["significance"]["total"]
    rows.append([esc(r["frequency"]), esc(fmt(r["significance"]["step"])),
                 _cell(t, "distance", "w1"), _cell(t, "vs_bf16", "w1"),
                 _cell(t, "vs_seed", "w1"), _cell(t, "distance", "rel_l2"),
                 _cell(t, "vs_bf16", "rel_l2"), _cell(t, "vs_seed",
                                                      "rel_l2")])
  out.append(table(["frequency", "step", "W1", "W1 / bf16", "W1 / seed",
                    "rel. L2", "rel. L2 / bf16", "rel. L2 / seed"], rows,
                   (1, 2, 3, 4, 5, 6, 7)))
  strongest = max(runs, key=lambda r: _nan(r["significance"].get("vs_bf16"))
                  if r["significance"].get("vs_bf16") is not None
                  else -1.0)
  out.append(_layer_table(strongest))
  out.append("</section>")
  return "".join(out)


def covers_line(d: Mapping) -> str:
  """The one-line statement of what the verdict covers (verdict section)."""
  prov = d.get("provenance")
  if not prov:
    return ""
  return (f'<p class="covers">{esc(_training.covers_sentence(prov))} '
          '<a href="#provenance">Details</a>.</p>')


def _kv(rows: Mapping) -> list[list[str]]:
  return [[f"<code>{esc(k)}</code>", esc(" ".join(v) if isinstance(v, list)
                                         else fmt(v, 8))]
          for k, v in rows.items() if not isinstance(v, Mapping)]


def section_provenance(d: Mapping) -> str:
  """The campaign's provenance: the KUT, platform, versions, sites."""
  prov = d.get("provenance")
  if not prov:
    return empty_section("provenance", "What this verdict covers",
                         "No provenance in the data.")
  out = ['<section id="provenance"><h2>What this verdict covers</h2>']
  out.append(f"<p><b>{esc(_training.covers_sentence(prov))}</b></p>")
  kut = dict(prov["kut"])
  content = kut.pop("content", None) or {}
  rows = _kv(kut)
  if content.get("sha256"):
    rows.append(["<code>content sha256</code>", esc(content["sha256"])])
    rows += [[f"<code>file</code>", esc(f"{f['path']} (sha256 "
                                        f"{f['sha256'][:16]}...)")]
             for f in content.get("files") or []]
  out.append("<h3>Kernel under test</h3>" + table(["key", "value"], rows))
  for key, title in (("platform", "Platform"), ("versions", "Versions")):
    vals = prov.get(key) or {}
    out.append(f"<h3>{title}</h3>" + (table(["key", "value"], _kv(vals))
                                      if vals else note("Not recorded.")))
  sites = prov.get("sites") or []
  out.append(f"<h3>Sites ({len(sites)})</h3>" + table(
      ["site", "kernel", "phase", "inputs (dtype[shape])"],
      [[f"<code>{esc(s['site'])}</code>", esc(s.get("kernel") or "\u2014"),
        esc(s.get("phase") or "\u2014"),
        f"<code>{esc(_training.site_inputs(s))}</code>"] for s in sites]))
  out.append(table(["covered", "value"], [
      ["phases", esc((", ".join(prov.get("phases") or []) or "none")
                     + _training.backward_words(prov))],
      ["checkpoint steps", esc(", ".join(str(s) for s in
                                        prov.get("checkpoint_steps") or [])
                               or "none")],
      ["runtime FI frequencies",
       esc(", ".join(prov.get("frequencies") or []) or "none")],
      ["runtime FI steps", esc(fmt(prov.get("runtime_steps")))]]))
  out.append("</section>")
  return "".join(out)
