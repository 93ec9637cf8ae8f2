"""The report's first screen: what decided the verdict and one picture.

:func:`decided` lists the sites behind the verdict (its ``deciding``
records grouped by site, worst first) with their error model, noise ratio
and evidence sentence. :func:`site_map` draws every site of the campaign
(columns, in execution order) at every checkpoint step (rows) as one dot,
colored by that record's verdict and sized by its noise ratio, so a reader
sees at a glance where and when the KUT leaves the golden kernel's noise.
:func:`section_evidence` is the per-site evidence that follows, one
collapsed ``<details>`` per site, worst first.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from peat_jax import detector as _detector
from peat_jax.report._charts import esc, fmt
from peat_jax.report._markup import chip as _chip
from peat_jax.report._markup import model as _model
from peat_jax.report._markup import note as _note
from peat_jax.report._schema import _NUM

#: Verdict colors, the badge's (``.v-pass`` ... in the page's CSS).
VERDICT_COLORS = {"pass": "#1e8e3e", "warn": "#f2a900", "fail": "#c5221f"}
#: How many deciding sites the first screen names (the rest: a count).
SHOWN_DECIDING = 3
#: Noise ratios at or below this draw the smallest dot (1 = at the floor).
RATIO_FLOOR = 1.0
#: Decades of noise ratio above the floor that reach the largest dot.
RATIO_DECADES = 4.0
_DOT_MIN, _DOT_MAX = 2.5, 11.0
_LEFT, _RIGHT, _TOP, _BOTTOM = 74, 16, 34, 66
_ROW_MIN, _ROW_MAX, _ROWS_HEIGHT = 22.0, 40.0, 220.0
_COL_MAX = 30.0


def _num(v: object) -> float | None:
  if isinstance(v, bool) or not isinstance(v, _NUM):
    return None
  return float(v)


def worst_ratio(site: Mapping) -> float:
  """The site's largest noise ratio over steps (+Inf kept; -1: none)."""
  vals = [_num(v) for v in site.get("noise_ratio") or []]
  vals = [v for v in vals if v is not None and not math.isnan(v)]
  return max(vals) if vals else -1.0


def _worst_text(site: Mapping) -> str:
  """The site's largest noise ratio, escaped (a dash when it has none)."""
  ratio = worst_ratio(site)
  return esc(fmt(ratio, 3) if ratio >= 0 else None)


def sorted_sites(sites: Sequence[Mapping]) -> list[Mapping]:
  """Worst first: verdict, then largest noise ratio, then confidence."""
  def confidence(s: Mapping) -> float:
    c = _num(s.get("confidence"))
    return c if c is not None and math.isfinite(c) else 0.0

  return sorted(sites, key=lambda s: (
      -_detector.severity(s["verdict"]), -worst_ratio(s), -confidence(s),
      s["site"]))


def dot_radius(ratio: float | None, scale: float = 1.0) -> float:
  """A record's dot radius: log-scaled noise ratio, floor to the largest.

  Args:
    ratio: the record's noise ratio (None or NaN: unknown).
    scale: a factor on every radius (narrow columns: below 1).

  Returns:
    ``_DOT_MIN`` at or below :data:`RATIO_FLOOR`, growing with
    ``log10(ratio)`` up to ``_DOT_MAX`` at :data:`RATIO_DECADES` decades
    above it (and for +Inf); ``_DOT_MIN`` for an unknown ratio.
  """
  if ratio is None or math.isnan(ratio) or ratio <= RATIO_FLOOR:
    return scale * _DOT_MIN
  t = min(1.0, math.log10(ratio / RATIO_FLOOR) / RATIO_DECADES)
  return scale * (_DOT_MIN + (_DOT_MAX - _DOT_MIN) * math.sqrt(t))


def _ranks(sites: Sequence[Mapping], deciding: Sequence) -> dict[str, int]:
  """The deciding sites named on the first screen, with their rank.

  Returns:
    ``{site: rank}`` of the :data:`SHOWN_DECIDING` worst deciding sites;
    a rank is the site's row number in the evidence per site (1: worst).
  """
  named = {str(rec[0]) for rec in deciding}
  ranked = [(i + 1, s["site"]) for i, s in enumerate(sorted_sites(sites))
            if s["site"] in named]
  return {name: rank for rank, name in ranked[:SHOWN_DECIDING]}


def _records(site: Mapping) -> list[tuple[int, float | None, str]]:
  """``(step, noise ratio, verdict)`` of each of the site's records."""
  steps = site.get("steps") or []
  ratios = site.get("noise_ratio") or [None] * len(steps)
  verdicts = site.get("verdicts") or [site["verdict"]] * len(steps)
  return [(int(t), _num(r), str(v))
          for t, r, v in zip(steps, ratios, verdicts)]


def site_map(sites: Sequence[Mapping], deciding: Sequence = (),
             *, width: int = 1100) -> str:
  """Sites by checkpoint step: one dot per record (an inline SVG).

  Args:
    sites: the report's ``sites``, in execution order.
    deciding: the verdict's ``[site, step]`` records; their sites are
      numbered as in :func:`decided` and their dots ringed.
    width: the picture's width in pixels.

  Returns:
    One ``<svg id="site-map">`` element; a note when no site has per-step
    records.
  """
  cols = [s for s in sites if s.get("steps")]
  if not cols:
    return _note("No per-step records to draw: the sites carry no steps.")
  steps = sorted({t for s in cols for t, _, _ in _records(s)})
  row_h = max(_ROW_MIN, min(_ROW_MAX, _ROWS_HEIGHT / len(steps)))
  plot_w = width - _LEFT - _RIGHT
  col_w = min(_COL_MAX, plot_w / len(cols))
  scale = min(1.0, (col_w / 2 - 0.5) / _DOT_MAX, (row_h / 2 - 1) / _DOT_MAX)
  height = int(_TOP + row_h * len(steps) + _BOTTOM)
  ranks = _ranks(sites, deciding)
  decided_at = {(str(r[0]), int(r[1])) for r in deciding
                if len(r) == 2 and isinstance(r[1], int)}
  x_of = {s["site"]: _LEFT + col_w * (i + 0.5) for i, s in enumerate(cols)}
  y_of = {t: _TOP + row_h * (j + 0.5) for j, t in enumerate(steps)}
  right = _LEFT + col_w * len(cols)
  out = [f'<svg id="site-map" xmlns="http://www.w3.org/2000/svg" '
         f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
         f'role="img" aria-label="sites by checkpoint step, colored by '
         f'verdict, sized by noise ratio" style="font-family:system-ui,'
         f'Segoe UI,Helvetica,Arial,sans-serif">',
         f'<rect x="0" y="0" width="{width}" height="{height}" '
         f'fill="#ffffff"></rect>',
         f'<text x="{_LEFT}" y="16" font-size="13" font-weight="600">'
         f'Every site at every checkpoint: color = verdict, size = noise '
         f'ratio</text>']
  for t, y in y_of.items():
    out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{right:.1f}" '
               f'y2="{y:.1f}" stroke="#eceef1"></line>'
               f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" '
               f'font-size="11" fill="#444">step {esc(t)}</text>')
  out += _direction_bands(cols, x_of, col_w, _TOP + row_h * len(steps))
  for s in cols:
    x = x_of[s["site"]]
    for t, ratio, verdict in _records(s):
      out.append(_dot(s, x, y_of[t], t, ratio, verdict,
                      (s["site"], t) in decided_at, scale))
    if s["site"] in ranks:
      out.append(f'<text x="{x:.1f}" y="{_TOP - 4}" text-anchor="middle" '
                 f'font-size="11" font-weight="700" fill="#1d2329">'
                 f'{ranks[s["site"]]}</text>')
  out += _legend(height, scale)
  out.append("</svg>")
  return "".join(out)


def _dot(site: Mapping, x: float, y: float, step: int, ratio: float | None,
         verdict: str, decided: bool, scale: float) -> str:
  color = VERDICT_COLORS.get(verdict, "#7a7a7a")
  r = dot_radius(ratio, scale)
  tip = (f"{site['site']} ({site['direction']}), step {step}: noise ratio "
         f"{fmt(ratio, 3)}, {verdict}; site diagnosis {site['model']}")
  ring = (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r + 2.5 * scale:.1f}" '
          f'fill="none" stroke="#1d2329" stroke-width="1.2"></circle>'
          if decided else "")
  fill = ' fill-opacity="0.85"' if ratio is not None else (
      ' fill="none" stroke-width="1.5"')
  return (f'<g>{ring}<circle class="rec" cx="{x:.1f}" cy="{y:.1f}" '
          f'r="{r:.1f}" fill="{color}" stroke="{color}"{fill}></circle>'
          f'<title>{esc(tip)}</title></g>')


def _direction_bands(cols: Sequence[Mapping], x_of: Mapping, col_w: float,
                     bottom: float) -> list[str]:
  """Labels under the columns: the forward and backward runs of sites."""
  out, start = [], 0
  for i in range(1, len(cols) + 1):
    if i < len(cols) and cols[i]["direction"] == cols[start]["direction"]:
      continue
    x0 = x_of[cols[start]["site"]] - col_w / 2
    x1 = x_of[cols[i - 1]["site"]] + col_w / 2
    n = i - start
    label = (f"{cols[start]['direction']}: {n} site" + ("s" if n > 1 else ""))
    out.append(f'<line x1="{x0 + 1:.1f}" y1="{bottom + 6:.1f}" '
               f'x2="{x1 - 1:.1f}" y2="{bottom + 6:.1f}" stroke="#7a838c" '
               f'stroke-width="2"><title>{esc(label)}</title></line>')
    shown = next((t for t in (label, cols[start]["direction"])
                  if x1 - x0 >= 6.5 * len(t) or n == len(cols)), None)
    if shown:
      out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{bottom + 20:.1f}" '
                 f'text-anchor="middle" font-size="11" fill="#444">'
                 f'{esc(shown)}</text>')
    start = i
  return out


def _legend(height: int, scale: float) -> list[str]:
  y = height - 14
  out, x = [], _LEFT
  for verdict, color in VERDICT_COLORS.items():
    out.append(f'<circle cx="{x + 5}" cy="{y - 4}" r="5" fill="{color}">'
               f'</circle><text x="{x + 14}" y="{y}" font-size="11">'
               f'{verdict}</text>')
    x += 60
  x += 20
  out.append(f'<text x="{x}" y="{y}" font-size="11" fill="#444">noise '
             f'ratio:</text>')
  x += 74
  for label, ratio in (("\u2264 1", 1.0), ("10", 10.0), ("100", 100.0),
                       (f"\u2265 1e{int(RATIO_DECADES)}",
                        10.0 ** RATIO_DECADES)):
    r = dot_radius(ratio, scale)
    out.append(f'<circle cx="{x + r:.1f}" cy="{y - 4}" r="{r:.1f}" '
               f'fill="#7a838c"></circle><text x="{x + 2 * r + 5:.1f}" '
               f'y="{y}" font-size="11">{esc(label)}</text>')
    x += 2 * r + 14 + 7 * len(label)
  out.append(f'<text x="{x + 10:.1f}" y="{y}" font-size="11" fill="#444">'
             f'ringed: a deciding record; numbered: the sites named '
             f'above</text>')
  return out


def decided(d: Mapping) -> str:
  """"What decided it": the deciding records, grouped by site, worst first.

  Args:
    d: the report data (validated).

  Returns:
    An HTML block: up to :data:`SHOWN_DECIDING` numbered sites with their
    steps, error model, verdict, largest noise ratio and evidence, then a
    count of the rest; records that are not sites (runtime FI, crashes)
    are named as they are.
  """
  deciding = d["verdict"].get("deciding") or []
  by_name = {s["site"]: s for s in d["sites"]}
  steps: dict[str, list] = {}
  others = []
  for rec in deciding:
    name, step = str(rec[0]), rec[1]
    if name in by_name:
      steps.setdefault(name, []).append(step)
    elif [name, step] not in others:
      others.append([name, step])
  if not steps and not others:
    return ('<div class="decided"><h3>What decided it</h3>'
            + _note("The verdict names no deciding record.") + "</div>")
  rank = {s["site"]: i + 1 for i, s in enumerate(sorted_sites(d["sites"]))}
  ordered = sorted(steps, key=rank.get)
  out = ['<div class="decided"><h3>What decided it</h3><ol>']
  for name in ordered[:SHOWN_DECIDING]:
    s = by_name[name]
    at = ", ".join(fmt(t) for t in sorted(steps[name]))
    out.append(
        f'<li value="{rank[name]}">{_chip(s["verdict"])} '
        f'<code>{esc(name)}</code> ({esc(s.get("kernel") or "")}'
        f'{", " if s.get("kernel") else ""}{esc(s["direction"])}) at step '
        f'{esc(at)}: {_model(s)}, noise ratio up to {_worst_text(s)}.'
        f'<div class="why">{esc(s.get("evidence") or "")}</div></li>')
  out.append("</ol>")
  rest = len(ordered) - SHOWN_DECIDING
  if rest > 0:
    out.append(f'<p>and {rest} more deciding site{"s" if rest > 1 else ""}:'
               f' <a href="#detector">evidence per site</a>.</p>')
  for name, step in others:
    out.append(f"<p>Also deciding: <code>{esc(name)}</code> at step "
               f"{esc(fmt(step))}.</p>")
  out.append("</div>")
  return "".join(out)


def ratios_cell(r: Mapping | None) -> str:
  """The ratio view of one site in a few numbers."""
  if not r:
    return "\u2014"
  parts = [f"{name} {fmt(r.get(key), 3)}x" for key, name in (
      ("rmse", "RMSE"), ("mean_rel", "mean rel"), ("max_rel", "max rel"),
      ("small_err", "small")) if _num(r.get(key)) is not None]
  if _num(r.get("bias")) is not None:
    parts.append(f"bias {fmt(r['bias'], 2)}")
  if _num(r.get("beyond_ulps")) is not None:
    parts.append(f"beyond ulps {fmt(100 * r['beyond_ulps'], 3)}%")
  text = ", ".join(esc(p) for p in parts)
  if r.get("nonfinite_mismatch"):
    text += f", <b>NaN/Inf mismatch {int(r['nonfinite_mismatch'])}</b>"
  return text


def _site_details(i: int, s: Mapping) -> str:
  head = (f'<summary class="r-{esc(s["verdict"])}"><span class="rank">'
          f'{i}</span>{_chip(s["verdict"])} <code>{esc(s["site"])}</code> '
          f'<span class="meta">{esc(s.get("kernel") or "")} '
          f'{esc(s["direction"])} &middot; {_model(s)} &middot; noise ratio '
          f'{_worst_text(s)}</span></summary>')
  body = [f"<p>{esc(s.get('evidence') or 'No evidence sentence.')}</p>",
          f"<p>Confidence {esc(fmt(s.get('confidence'), 3))}. Ratios vs "
          f"golden: {ratios_cell(s.get('ratios'))}.</p>"]
  sec = s.get("secondary")
  if sec:
    body.append(f"<p>Second cause: <b>{esc(sec['model'])}</b> (confidence "
                f"{esc(fmt(sec.get('confidence'), 3))}): "
                f"{esc(sec.get('evidence') or '')}</p>")
  per_step = _records(s)
  if per_step:
    body.append("<p>Per checkpoint: " + "; ".join(
        f"step {t}: {esc(fmt(r, 3))} ({esc(v)})" for t, r, v in per_step)
        + ".</p>")
  return f'<details class="site">{head}{"".join(body)}</details>'


def section_evidence(sites: Sequence[Mapping]) -> str:
  """Per-site evidence, one collapsed ``<details>`` per site, worst first."""
  out = ['<section id="detector"><h2>Evidence per site</h2>']
  if not sites:
    out.append(_note("No sites were profiled."))
  else:
    out.append("<p>One row per site, worst first (verdict, then largest "
               "noise ratio over steps, then confidence); open a row for "
               "the Detector's evidence, its confidence, the KUT's error "
               "against the float64 reference over the golden kernel's per "
               "metric (RMSE, mean and max relative error, small-value "
               "error rate, bias, share beyond 32 ulps for float32 or 1 ulp "
               "for 16-bit formats, NaN/Inf mismatches: not 0 is a hard "
               "fail) and the noise ratio at each checkpoint.</p>")
    out += [_site_details(i + 1, s) for i, s in
            enumerate(sorted_sites(sites))]
  out.append("</section>")
  return "".join(out)
