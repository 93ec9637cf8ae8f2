"""Per-layer weight-distance ratios of finished campaigns, as figures.

Usage::

  .venv/bin/python benchmarks/significance_figures.py runs/sig_gpt_in_bf16 \
      runs/sig_gpt_tiled [...] --out=benchmarks/out [--run=every call]

Reads each campaign's ``report.json`` (``python -m peat_jax.tools.validate``)
and draws, per scenario, one figure of its KUTs' training-level
significance (docs/profiler.md): for the runtime FI run ``--run`` (default:
the every-call run),

* top: the total Wasserstein-1 distance of the weights to the golden
  trajectory over the saved steps, in units of the bf16 proxy's and of the
  seed-to-seed distance;
* below: the same two ratios per layer (parameter leaf) at the last saved
  step, one marker per KUT, on a log scale with the line at 1.

Each figure is written as ``significance_<scenario>.svg`` (no dependency)
and, when headless Chromium is installed (``/usr/bin/chromium``, see
scripts/ensure_chromium.sh), rendered to ``significance_<scenario>.png``;
``significance_<scenario>.json`` holds the plotted numbers. Nothing is
recomputed: the numbers are the report's.
"""

from __future__ import annotations

import html
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import significance_table  # pylint: disable=wrong-import-position

CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser",
            "google-chrome")
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
MARKERS = ("circle", "triangle", "square", "diamond")
W = 1100          # figure width (px)
ROW = 11          # px per layer row
LEFT = 300        # px for the layer names
PANEL = (W - LEFT - 70) // 2


def _load(d: str) -> dict:
  with open(os.path.join(d, "report.json"), encoding="utf-8") as f:
    return json.load(f)


def _run(data: dict, name: str | None) -> dict | None:
  runs = [r for r in data.get("runtime") or [] if r.get("significance")]
  if name:
    runs = [r for r in runs if r["frequency"] == name]
  return runs[0] if runs else None


def _last(block: dict | None, ratio: str) -> float | None:
  vals = ((block or {}).get(ratio) or {}).get("w1") or [None]
  v = vals[-1]
  return v if v is not None and math.isfinite(v) and v > 0 else None


def extract(dirs: list[str], run: str | None) -> dict[str, list[dict]]:
  """``{scenario: [{kut, frequency, step, steps, total, layers}]}``."""
  out: dict[str, list[dict]] = {}
  for d in dirs:
    data = _load(d)
    r = _run(data, run)
    if r is None:
      print(f"note: {d} has no runtime run with significance"
            + (f" named {run!r}" if run else ""), file=sys.stderr)
      continue
    sig = r["significance"]
    t = sig["total"]
    out.setdefault(data["scenario"], []).append({
        "campaign": d, "kut": data["kut"], "frequency": r["frequency"],
        "verdict": data["verdict"]["verdict"],
        "summary": data["verdict"]["summary"], "step": sig["step"],
        "steps": sig["steps"],
        "total": {k: (t.get(k) or {}).get("w1") for k in
                  ("distance", "seed", "bf16", "vs_seed", "vs_bf16")},
        "layers": [{"layer": l["layer"], "vs_bf16": _last(l, "vs_bf16"),
                    "vs_seed": _last(l, "vs_seed")}
                   for l in sig["layers"]]})
  return out


def _marker(kind: str, x: float, y: float, color: str, r: float = 3.6
            ) -> str:
  if kind == "circle":
    return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="none" '
            f'stroke="{color}" stroke-width="1.4"/>')
  if kind == "triangle":
    pts = f"{x:.1f},{y - r:.1f} {x - r:.1f},{y + r:.1f} {x + r:.1f},{y + r:.1f}"
  elif kind == "square":
    pts = (f"{x - r:.1f},{y - r:.1f} {x + r:.1f},{y - r:.1f} "
           f"{x + r:.1f},{y + r:.1f} {x - r:.1f},{y + r:.1f}")
  else:
    pts = f"{x:.1f},{y - r:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r:.1f} {x - r:.1f},{y:.1f}"
  return (f'<polygon points="{pts}" fill="none" stroke="{color}" '
          'stroke-width="1.4"/>')


def _log_axis(values: list[float]) -> tuple[float, float]:
  vals = [v for v in values if v]
  lo = math.floor(math.log10(min(vals + [1.0])))
  hi = math.ceil(math.log10(max(vals + [1.0])))
  return float(lo), float(hi if hi > lo else lo + 1)


def _ticks(x0: float, width: float, lo: float, hi: float, y0: float,
           y1: float) -> list[str]:
  out = []
  for e in range(int(lo), int(hi) + 1):
    x = x0 + (e - lo) / (hi - lo) * width
    color = "#444" if e == 0 else "#ddd"
    out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" '
               f'stroke="{color}" stroke-width="{1.2 if e == 0 else 0.6}"/>')
    out.append(f'<text x="{x:.1f}" y="{y1 + 12}" font-size="10" '
               f'text-anchor="middle">1e{e}</text>')
  return out


def figure(scenario: str, kuts: list[dict]) -> str:
  """The SVG of one scenario's KUTs."""
  layers = [l["layer"] for l in kuts[0]["layers"]]
  n = len(layers)
  legend_h = 18 * len(kuts)
  top_h = 190 + legend_h
  y_layers = top_h + 70
  h = y_layers + n * ROW + 40
  s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" '
       f'viewBox="0 0 {W} {h}" font-family="DejaVu Sans, sans-serif">',
       f'<rect width="{W}" height="{h}" fill="white"/>',
       f'<text x="10" y="20" font-size="15" font-weight="bold">'
       f'{html.escape(scenario)}: runtime FI\'s weight distance to the '
       'golden trajectory (Wasserstein-1) ÷ the bf16 proxy\'s and ÷ the '
       'seed-to-seed distance</text>']
  # Legend, one KUT a line.
  for i, k in enumerate(kuts):
    y = 38 + 18 * i
    s.append(_marker(MARKERS[i], 15, y - 4, COLORS[i]))
    label = (f"{k['kut']} ({k['frequency']}; campaign verdict "
             f"{k['verdict']}): at step {k['step']} "
             f"{k['total']['vs_bf16'][-1]:.3g}x the bf16 proxy's distance, "
             f"{k['total']['vs_seed'][-1]:.3g}x the seed-to-seed distance")
    s.append(f'<text x="26" y="{y}" font-size="11">'
             f'{html.escape(label)}</text>')
  # Top: total ratios over the saved steps.
  x0s = (LEFT, LEFT + PANEL + 40)
  titles = (("vs_bf16", "total ÷ bf16 proxy, per saved step"),
            ("vs_seed", "total ÷ seed-to-seed, per saved step"))
  for (key, title), x0 in zip(titles, x0s):
    vals = [v for k in kuts for v in k["total"][key] or [] if v]
    lo, hi = _log_axis(vals)
    y0, y1 = 70 + legend_h, top_h
    s.append(f'<text x="{x0}" y="{y0 - 8}" font-size="12">{title}</text>')
    s += _ticks(x0, PANEL, lo, hi, y0, y1)
    steps = kuts[0]["steps"]
    for j, st in enumerate(steps):
      y = y0 + (j + 0.5) / len(steps) * (y1 - y0)
      if x0 == LEFT:
        s.append(f'<text x="{LEFT - 8}" y="{y + 3:.1f}" font-size="10" '
                 f'text-anchor="end">step {st}</text>')
      for i, k in enumerate(kuts):
        v = (k["total"][key] or [None] * len(steps))[j]
        if v:
          x = x0 + (math.log10(v) - lo) / (hi - lo) * PANEL
          s.append(_marker(MARKERS[i], x, y, COLORS[i], 4.2))
  # Below: per layer at the last saved step.
  step = kuts[0]["step"]
  titles = (("vs_bf16", f"per layer ÷ bf16 proxy, step {step}"),
            ("vs_seed", f"per layer ÷ seed-to-seed, step {step}"))
  y0, y1 = y_layers, y_layers + n * ROW
  for (key, title), x0 in zip(titles, x0s):
    vals = [l[key] for k in kuts for l in k["layers"] if l[key]]
    lo, hi = _log_axis(vals)
    s.append(f'<text x="{x0}" y="{y0 - 8}" font-size="12">{title}</text>')
    s += _ticks(x0, PANEL, lo, hi, y0, y1)
    for j, name in enumerate(layers):
      y = y0 + (j + 0.5) * ROW
      if j % 2 == 0:
        s.append(f'<rect x="{x0}" y="{y - ROW / 2:.1f}" width="{PANEL}" '
                 f'height="{ROW}" fill="#f4f4f4" opacity="0.6"/>')
      for i, k in enumerate(kuts):
        byname = {l["layer"]: l for l in k["layers"]}
        v = (byname.get(name) or {}).get(key)
        if v:
          x = x0 + (math.log10(v) - lo) / (hi - lo) * PANEL
          s.append(_marker(MARKERS[i], x, y, COLORS[i], 3.2))
  for j, name in enumerate(layers):
    y = y0 + (j + 0.5) * ROW
    s.append(f'<text x="{LEFT - 8}" y="{y + 3:.1f}" font-size="8.5" '
             f'text-anchor="end">{html.escape(name)}</text>')
  s.append("</svg>")
  return "\n".join(s)


def chromium() -> str | None:
  for c in CHROMIUM:
    path = shutil.which(c) if not os.path.isabs(c) else (
        c if os.access(c, os.X_OK) else None)
    if path:
      return path
  return None


def screenshot(page: str, png: str, width: int, height: int) -> bool:
  """Renders an HTML or SVG file to PNG with headless Chromium."""
  exe = chromium()
  if exe is None:
    return False
  with tempfile.TemporaryDirectory() as profile:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu",
           "--hide-scrollbars", f"--user-data-dir={profile}",
           f"--window-size={width},{height}", f"--screenshot={png}",
           "file://" + os.path.abspath(page)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         check=False)
  return res.returncode == 0 and os.path.exists(png)


def main(argv: list[str]) -> int:
  parsed = significance_table.parse_args(
      argv, {"out": "benchmarks/out", "run": None})
  if parsed is None:
    return 2
  opts, dirs = parsed
  out, run = opts["out"], opts["run"]
  os.makedirs(out, exist_ok=True)
  for scenario, kuts in extract(dirs, run).items():
    base = os.path.join(out, f"significance_{scenario}")
    with open(base + ".json", "w", encoding="utf-8") as f:
      json.dump(kuts, f, indent=1)
    svg = figure(scenario, kuts)
    with open(base + ".svg", "w", encoding="utf-8") as f:
      f.write(svg)
    height = int(svg.split('height="', 1)[1].split('"', 1)[0])
    done = screenshot(base + ".svg", base + ".png", W, height)
    print(f"{scenario}: {base}.svg" + (f", {base}.png" if done else
                                       " (no Chromium: no PNG)"))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
