"""Small inline-SVG plots for the campaign report (no plotting library).

Every function returns one ``<svg>`` element as a string, ready to be pasted
into an HTML page: bar charts and histograms (linear or log-scale counts),
line charts with several series, a legend, vertical markers and an optional
shaded band, and heat tables (rows x columns of colored cells whose values
are shown in tooltips through SVG ``<title>`` elements).

All text is escaped with :func:`html.escape`; non-finite values are skipped
(lines break at them, bars are not drawn, heat cells are grey), so a plot of
diverged training never raises.

>>> svg = bar_chart([3, 10, 1], ["a", "b", "c"], title="counts", log_y=True)
>>> svg.startswith("<svg")
True
"""

from __future__ import annotations

import html
import math
from typing import NamedTuple, Sequence

#: Series colors, in order of use (distinct under common color blindness).
PALETTE = ("#1f5fa8", "#d9730d", "#2e8b57", "#b8336a", "#6a4fb3",
           "#8c6d1f", "#0f8a99", "#7a7a7a")
_FONT = "font-family:system-ui,Segoe UI,Helvetica,Arial,sans-serif"
_MARGIN_L, _MARGIN_R, _MARGIN_T, _MARGIN_B = 64, 16, 30, 48


def esc(text: object) -> str:
  """Escapes any value's ``str`` for HTML or SVG text and attributes."""
  return html.escape(str(text), quote=True)


def fmt(x: object, digits: int = 4) -> str:
  """Formats a number compactly (``None`` as an em dash, NaN as ``NaN``)."""
  if x is None:
    return "\u2014"
  if isinstance(x, bool):
    return str(x)
  if isinstance(x, int):
    return str(x)
  try:
    v = float(x)  # type: ignore[arg-type]
  except (TypeError, ValueError):
    return str(x)
  if math.isnan(v):
    return "NaN"
  if math.isinf(v):
    return "Inf" if v > 0 else "-Inf"
  return f"{v:.{digits}g}"


def _finite(v: object) -> bool:
  try:
    return math.isfinite(float(v))  # type: ignore[arg-type]
  except (TypeError, ValueError):
    return False


class Series(NamedTuple):
  """One line of a line chart.

  Attributes:
    name: legend text.
    x: x values.
    y: y values (non-finite values break the line).
    color: stroke color; ``None`` takes the next palette color.
    dash: draw dashed.
    marks: x positions to mark with a ring on this series (e.g. the first
      divergent step).
  """

  name: str
  x: Sequence[float]
  y: Sequence[float]
  color: str | None = None
  dash: bool = False
  marks: Sequence[float] = ()


class _Axis:
  """A linear or log10 mapping from data values to pixels."""

  def __init__(self, lo: float, hi: float, p0: float, p1: float, log: bool):
    self.log = log
    if log:
      lo, hi = math.log10(lo), math.log10(hi)
    if hi <= lo:
      lo, hi = lo - 0.5, hi + 0.5
    self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1

  def __call__(self, v: float) -> float:
    t = math.log10(v) if self.log else v
    return self.p0 + (t - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

  def ticks(self, target: int = 5) -> list[tuple[float, str]]:
    """Tick positions (data values) with their labels."""
    if self.log:
      d0, d1 = math.ceil(self.lo - 1e-9), math.floor(self.hi + 1e-9)
      if d1 - d0 >= 1:
        step = max(1, math.ceil((d1 - d0 + 1) / (target + 2)))
        return [(10.0**d, _decade(d)) for d in range(d0, d1 + 1, step)]
      lo, hi = 10**self.lo * (1 - 1e-9), 10**self.hi * (1 + 1e-9)
      vals = [m * 10.0**d for d in range(d0 - 1, d1 + 2) for m in (1, 2, 5)
              if lo <= m * 10.0**d <= hi]
      if len(vals) < 2:
        vals = [10**self.lo, 10**self.hi]
      return [(v, fmt(v, 2)) for v in vals]
    span = self.hi - self.lo
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(self.lo / step - 1e-9) * step
    out = []
    v = first
    while v <= self.hi + 1e-9 * span:
      out.append((v, fmt(0.0 if abs(v) < step * 1e-9 else v, 4)))
      v += step
    return out


def _decade(d: int) -> str:
  return {0: "1", 1: "10", 2: "100", 3: "1000", -1: "0.1",
          -2: "0.01"}.get(d, f"1e{d}")


def _range(values: Sequence[float], log: bool) -> tuple[float, float] | None:
  vals = [float(v) for v in values if _finite(v) and (not log or float(v) > 0)]
  if not vals:
    return None
  return min(vals), max(vals)


def _open(width: int, height: int, title: str, aria: str) -> list[str]:
  parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{esc(aria or title)}" style="{_FONT}">',
           f'<rect x="0" y="0" width="{width}" height="{height}" '
           f'fill="#ffffff"></rect>']
  if title:
    parts.append(f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" '
                 f'font-size="13" font-weight="600">{esc(title)}</text>')
  return parts


def _frame(parts: list[str], xa: _Axis | None, ya: _Axis, width: int,
           height: int, x_label: str, y_label: str) -> None:
  """Draws gridlines, tick labels and axis titles."""
  left, right = _MARGIN_L, width - _MARGIN_R
  top, bottom = _MARGIN_T, height - _MARGIN_B
  for v, label in ya.ticks():
    y = ya(v)
    parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" '
                 f'stroke="#e3e3e3" stroke-width="1"></line>')
    parts.append(f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end" '
                 f'font-size="10" fill="#444">{esc(label)}</text>')
  if xa is not None:
    for v, label in xa.ticks(6):
      x = xa(v)
      parts.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" '
                   f'y2="{bottom + 4}" stroke="#666"></line>')
      parts.append(f'<text x="{x:.1f}" y="{bottom + 15}" text-anchor="middle"'
                   f' font-size="10" fill="#444">{esc(label)}</text>')
  parts.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" '
               f'stroke="#666"></line>')
  parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" '
               f'stroke="#666"></line>')
  if x_label:
    parts.append(f'<text x="{(left + right) / 2:.1f}" y="{height - 8}" '
                 f'text-anchor="middle" font-size="11">{esc(x_label)}</text>')
  if y_label:
    cy = (top + bottom) / 2
    parts.append(f'<text x="13" y="{cy:.1f}" text-anchor="middle" '
                 f'font-size="11" transform="rotate(-90 13 {cy:.1f})">'
                 f'{esc(y_label)}</text>')


def _empty(parts: list[str], width: int, height: int, note: str) -> str:
  parts.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" '
               f'text-anchor="middle" font-size="12" fill="#777">'
               f'{esc(note)}</text></svg>')
  return "".join(parts)


def _legend_rows(names: Sequence[str], avail: float) -> int:
  """How many rows :func:`_legend` needs for these names."""
  rows, cx = (1 if names else 0), 0.0
  for name in names:
    w = 26 + 6.2 * len(name)
    if cx + w > avail and cx > 0:
      rows, cx = rows + 1, 0.0
    cx += w + 10
  return rows


def _legend(parts: list[str], items: Sequence[tuple[str, str, bool]],
            x: float, y: float, max_x: float) -> None:
  """Legend entries (name, color, dashed) laid out left to right, wrapping."""
  cx, cy = x, y
  for name, color, dash in items:
    w = 26 + 6.2 * len(name)
    if cx + w > max_x and cx > x:
      cx, cy = x, cy + 15
    d = ' stroke-dasharray="5 3"' if dash else ""
    parts.append(f'<line x1="{cx:.1f}" y1="{cy:.1f}" x2="{cx + 18:.1f}" '
                 f'y2="{cy:.1f}" stroke="{color}" stroke-width="2.5"{d}>'
                 f'</line>')
    parts.append(f'<text x="{cx + 22:.1f}" y="{cy + 4:.1f}" font-size="10">'
                 f'{esc(name)}</text>')
    cx += w + 10


def bar_chart(values: Sequence[float], labels: Sequence[str], *,
              title: str = "", x_label: str = "", y_label: str = "",
              log_y: bool = False, colors: Sequence[str] | None = None,
              legend: Sequence[tuple[str, str]] = (),
              tooltips: Sequence[str] | None = None, width: int = 360,
              height: int = 240, max_labels: int = 12,
              empty: str = "no data") -> str:
  """A bar chart of categorical bins (a histogram when bins are buckets).

  Args:
    values: bar heights (non-finite or, with ``log_y``, non-positive values
      draw no bar).
    labels: one label per bar; at most ``max_labels`` are printed, evenly
      thinned, all appear in the tooltips.
    title: chart title.
    x_label: x axis title.
    y_label: y axis title.
    log_y: log10 scale for the heights.
    colors: one fill color per bar (default: the first palette color).
    legend: ``(name, color)`` entries drawn under the title.
    tooltips: one tooltip text per bar (default ``label: value``).
    width: pixel width.
    height: pixel height.
    max_labels: most x tick labels to print.
    empty: the text drawn when no bar can be drawn.

  Returns:
    The ``<svg>`` element.
  """
  n = len(values)
  parts = _open(width, height, title, title or y_label)
  rng = _range(values, log_y)
  if n == 0 or rng is None:
    return _empty(parts, width, height, empty)
  lo, hi = rng
  if log_y:  # the smallest bar keeps some height; ticks on 1-2-5 values
    lo, hi = 10.0**math.floor(math.log10(lo / 2.0)), hi * 2.0
  else:
    lo, hi = min(0.0, lo), max(hi * 1.08, 0.0)
    if hi == lo:
      hi = lo + 1.0
  top = _MARGIN_T + (14 if legend else 0)
  bottom = height - _MARGIN_B
  ya = _Axis(lo, hi, bottom, top, log_y)
  _frame(parts, None, ya, width, height, x_label, y_label)
  left, right = _MARGIN_L, width - _MARGIN_R
  slot = (right - left) / n
  gap = min(2.0, slot * 0.15)
  base = bottom if log_y else ya(0.0)
  every = max(1, math.ceil(n / max_labels))
  for i, v in enumerate(values):
    x = left + i * slot
    color = colors[i] if colors else PALETTE[0]
    tip = tooltips[i] if tooltips else f"{labels[i]}: {fmt(v)}"
    if _finite(v) and (not log_y or float(v) > 0):
      y = ya(float(v))
      y0, y1 = min(y, base), max(y, base)
      parts.append(f'<rect x="{x + gap / 2:.2f}" y="{y0:.2f}" '
                   f'width="{max(slot - gap, 0.5):.2f}" '
                   f'height="{max(y1 - y0, 0.5):.2f}" fill="{color}">'
                   f'<title>{esc(tip)}</title></rect>')
    if i % every == 0:
      cx = x + slot / 2
      parts.append(f'<text x="{cx:.1f}" y="{bottom + 13}" font-size="9" '
                   f'text-anchor="middle" fill="#444">{esc(labels[i])}</text>')
  if legend:
    _legend(parts, [(name, c, False) for name, c in legend], left + 4,
            _MARGIN_T + 4, right)
  parts.append("</svg>")
  return "".join(parts)


def histogram(edges: Sequence[float], counts: Sequence[float], *,
              title: str = "", x_label: str = "", log_y: bool = True,
              width: int = 360, height: int = 240) -> str:
  """A histogram over explicit bin edges (``len(edges) == len(counts)+1``).

  Bars are equally wide; each is labelled with its lower edge and its
  tooltip gives ``[lower, upper): count``. Log-spaced edges therefore read
  as a log-scale x axis.

  Args:
    edges: bin edges, ascending.
    counts: count per bin.
    title: chart title.
    x_label: x axis title.
    log_y: log10 scale for the counts.
    width: pixel width.
    height: pixel height.

  Returns:
    The ``<svg>`` element.
  """
  labels = [fmt(e, 2) for e in edges[:-1]]
  tips = [f"[{fmt(a)}, {fmt(b)}): {fmt(c)}"
          for a, b, c in zip(edges[:-1], edges[1:], counts)]
  return bar_chart(counts, labels, title=title, x_label=x_label,
                   y_label="count (log)" if log_y else "count", log_y=log_y,
                   tooltips=tips, width=width, height=height, max_labels=7)


def line_chart(series: Sequence[Series], *, title: str = "",
               x_label: str = "", y_label: str = "", log_y: bool = False,
               band: tuple[Sequence[float], Sequence[float],
                           Sequence[float], str] | None = None,
               vlines: Sequence[tuple[float, str, str]] = (),
               y_max: float | None = None, width: int = 640,
               height: int = 300) -> str:
  """A line chart of several series with a legend.

  Args:
    series: the lines; points with non-finite x or y (or y <= 0 with
      ``log_y``) break the line.
    title: chart title.
    x_label: x axis title.
    y_label: y axis title.
    log_y: log10 scale for y.
    band: optional shaded envelope ``(x, low, high, name)``.
    vlines: vertical markers ``(x, label, color)``.
    y_max: clip the y axis here: larger values (and +Inf) are drawn on the
      top edge, with a note in the chart.
    width: pixel width.
    height: pixel height.

  Returns:
    The ``<svg>`` element.
  """
  parts = _open(width, height, title, title or y_label)
  xs: list[float] = [float(v) for s in series for v in s.x]
  ys: list[float] = [float(v) for s in series for v in s.y]
  if band is not None:
    xs += [float(v) for v in band[0]]
    ys += [float(v) for v in band[1]] + [float(v) for v in band[2]]
  xs += [float(v) for v, _, _ in vlines]
  clipped = y_max is not None and any(
      v > y_max for v in ys if not math.isnan(v))
  if y_max is not None:
    ys = [min(v, y_max) for v in ys if not math.isnan(v)]
  xr, yr = _range(xs, False), _range(ys, log_y)
  if xr is None or yr is None:
    return _empty(parts, width, height, "no finite data")
  names = [s.name for s in series] + ([band[3]] if band is not None else [])
  top = _MARGIN_T + 15 * _legend_rows(names, width - _MARGIN_L - _MARGIN_R)
  left, right, bottom = _MARGIN_L, width - _MARGIN_R, height - _MARGIN_B
  ylo, yhi = yr
  if clipped:
    yhi = float(y_max)
  if log_y:
    ylo, yhi = ylo / 1.5, yhi * (1.0 if clipped else 1.5)
  else:
    pad = (yhi - ylo) * 0.05 or abs(yhi) * 0.05 or 1.0
    ylo, yhi = ylo - pad, yhi + pad
  xa = _Axis(xr[0], xr[1], left + 4, right - 4, False)
  ya = _Axis(ylo, yhi, bottom, top, log_y)
  _frame(parts, xa, ya, width, height, x_label, y_label)
  cap = math.inf if y_max is None else float(y_max)

  def ok(x: object, y: object) -> bool:
    return (_finite(x) and not math.isnan(float(y))  # type: ignore[arg-type]
            and (not log_y or float(y) > 0)  # type: ignore[arg-type]
            and (_finite(y) or (cap < math.inf and float(y) > 0)))

  def py(y: object) -> float:
    return ya(min(float(y), cap))  # type: ignore[arg-type]

  legend: list[tuple[str, str, bool]] = []
  if band is not None:
    bx, blo, bhi, bname = band
    pts = [(float(x), float(a), float(b)) for x, a, b in zip(bx, blo, bhi)
           if ok(x, a) and ok(x, b)]
    if pts:
      poly = [f"{xa(x):.1f},{py(b):.1f}" for x, _, b in pts]
      poly += [f"{xa(x):.1f},{py(a):.1f}" for x, a, _ in reversed(pts)]
      parts.append(f'<polygon points="{" ".join(poly)}" fill="#9aa5b1" '
                   f'fill-opacity="0.35" stroke="none">'
                   f'<title>{esc(bname)}</title></polygon>')
      legend.append((bname, "#b7c0c9", False))
  for x, label, color in vlines:
    if _finite(x):
      px = xa(float(x))
      parts.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" '
                   f'y2="{bottom}" stroke="{color}" stroke-width="1.2" '
                   f'stroke-dasharray="3 3"><title>{esc(label)}</title>'
                   f'</line>')
      parts.append(f'<text x="{px + 3:.1f}" y="{top + 10}" font-size="9" '
                   f'fill="{color}">{esc(label)}</text>')
  for i, s in enumerate(series):
    color = s.color or PALETTE[i % len(PALETTE)]
    dash = ' stroke-dasharray="6 3"' if s.dash else ""
    segs: list[list[str]] = [[]]
    for x, y in zip(s.x, s.y):
      if ok(x, y):
        segs[-1].append(f"{xa(float(x)):.1f},{py(y):.1f}")
      elif segs[-1]:
        segs.append([])
    for seg in segs:
      if len(seg) == 1:
        cx, cy = seg[0].split(",")
        parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}">'
                     f'</circle>')
      elif seg:
        parts.append(f'<polyline points="{" ".join(seg)}" fill="none" '
                     f'stroke="{color}" stroke-width="1.8"{dash}>'
                     f'<title>{esc(s.name)}</title></polyline>')
    pts = dict((float(x), y) for x, y in zip(s.x, s.y) if _finite(x))
    for m in s.marks:
      if not _finite(m):
        continue
      y = pts.get(float(m))
      my = py(y) if y is not None and ok(m, y) else bottom - 6
      parts.append(f'<circle cx="{xa(float(m)):.1f}" cy="{my:.1f}" r="5" '
                   f'fill="none" stroke="{color}" stroke-width="2">'
                   f'<title>{esc(s.name)}: step {fmt(m)}</title></circle>')
    legend.append((s.name, color, s.dash))
  _legend(parts, legend, left + 4, _MARGIN_T + 4, right)
  if clipped:
    parts.append(f'<text x="{right}" y="{height - 8}" font-size="9" '
                 f'text-anchor="end" fill="#555">values above '
                 f'{esc(fmt(y_max, 3))} drawn at the top edge</text>')
  parts.append("</svg>")
  return "".join(parts)


def diverging_color(t: float) -> str:
  """Color for ``t`` in [-1, 1]: blue (below), white (0), red (above)."""
  t = max(-1.0, min(1.0, t))
  lo, mid, hi = (49, 104, 171), (247, 247, 247), (190, 40, 35)
  end = hi if t > 0 else lo
  a = abs(t) ** 0.8
  rgb = [round(m + (e - m) * a) for m, e in zip(mid, end)]
  return "#{:02x}{:02x}{:02x}".format(*rgb)


def _shorten(text: str, n: int) -> str:
  if len(text) <= n:
    return text
  head = max(4, n // 4)
  return text[:head] + "\u2026" + text[-(n - head - 1):]


def heat_table(row_labels: Sequence[str], col_labels: Sequence[str],
               values: Sequence[Sequence[float | None]], *, title: str = "",
               value_name: str = "value", log: bool = True,
               center: float = 1.0, max_decades: float = 3.0,
               max_label: int = 48) -> str:
  """Rows x columns of colored cells; each value is in the cell's tooltip.

  Colors diverge around ``center``: white at ``center``, blue below, red
  above, on a log10 scale (``log=True``) symmetric to the largest finite
  distance from ``center``, at least one and at most ``max_decades`` decades
  (further values take the deepest color). Missing or NaN cells are grey,
  +Inf is dark red, values <= 0 on a log scale take the deepest blue.

  Args:
    row_labels: one label per row (shortened in the middle when longer than
      ``max_label``; the full label is in the tooltip).
    col_labels: one label per column.
    values: ``values[row][col]``; ``None`` for a missing cell.
    title: chart title.
    value_name: what the values are, for tooltips and the color key.
    log: log10 color scale.
    center: the value drawn white.
    max_decades: with ``log``, the color scale saturates this many decades
      from ``center``.
    max_label: longest row label printed.

  Returns:
    The ``<svg>`` element.
  """
  nr, nc = len(row_labels), len(col_labels)
  shown = [_shorten(str(r), max_label) for r in row_labels]
  label_w = 12 + 5.8 * max([len(s) for s in shown] + [4])
  cell_w = max(6.0, min(60.0, 760.0 / max(nc, 1)))
  cell_h = 16.0
  x0, y0 = label_w, 52.0 if title else 24.0
  width = int(x0 + nc * cell_w + 20)
  key_w = min(240.0, max(nc * cell_w, 120.0))
  width = max(width, int(x0 + key_w + 10 + 6 * (len(value_name) + 40)))
  height = int(y0 + nr * cell_h + 56)
  parts = _open(width, height, title, title or value_name)
  if nr == 0 or nc == 0:
    return _empty(parts, width, height, "no data")

  def dist(v: float) -> float:
    return math.log10(v / center) if log else v - center

  finite = [float(v) for row in values for v in row
            if v is not None and _finite(v) and (not log or float(v) > 0)]
  span = max([abs(dist(v)) for v in finite] + [1e-12])
  if log:
    span = min(max(span, 1.0), max_decades)
  every = max(1, math.ceil(nc * 26 / max(nc * cell_w, 1)))
  for j, c in enumerate(col_labels):
    if j % every == 0:
      cx = x0 + (j + 0.5) * cell_w
      parts.append(f'<text x="{cx:.1f}" y="{y0 - 6}" font-size="9" '
                   f'text-anchor="middle" fill="#444">{esc(c)}</text>')
  for i, r in enumerate(row_labels):
    y = y0 + i * cell_h
    parts.append(f'<text x="{x0 - 6:.1f}" y="{y + 11.5:.1f}" font-size="10.5"'
                 f' text-anchor="end"><title>{esc(r)}</title>'
                 f'{esc(shown[i])}</text>')
    row = values[i]
    for j in range(nc):
      v = row[j] if j < len(row) else None
      if v is None or not _finite(v):
        is_inf = v is not None and not _finite(v) and _is_pos_inf(v)
        color = "#7f0000" if is_inf else "#cfcfcf"
      elif log and float(v) <= 0:
        color = diverging_color(-1.0)
      else:
        color = diverging_color(dist(float(v)) / span)
      tip = f"{r} | {col_labels[j]} | {value_name} = {fmt(v)}"
      parts.append(f'<rect x="{x0 + j * cell_w:.1f}" y="{y:.1f}" '
                   f'width="{cell_w - 1:.1f}" height="{cell_h - 1:.1f}" '
                   f'fill="{color}"><title>{esc(tip)}</title></rect>')
  # Color key.
  ky = y0 + nr * cell_h + 16
  kx, kw = x0, key_w
  steps = 24
  for k in range(steps):
    t = -1 + 2 * (k + 0.5) / steps
    parts.append(f'<rect x="{kx + k * kw / steps:.1f}" y="{ky:.1f}" '
                 f'width="{kw / steps + 0.5:.1f}" height="10" '
                 f'fill="{diverging_color(t)}"></rect>')
  if log:
    lo_v, hi_v = center * 10**-span, center * 10**span
  else:
    lo_v, hi_v = center - span, center + span
  lo_t, hi_t = fmt(lo_v, 2), fmt(hi_v, 2)
  if log and max(abs(dist(v)) for v in finite + [center]) > span:
    lo_t, hi_t = "\u2264" + lo_t, "\u2265" + hi_t
  for x, label, anchor in ((kx, lo_t, "start"),
                           (kx + kw / 2, fmt(center, 3), "middle"),
                           (kx + kw, hi_t, "end")):
    parts.append(f'<text x="{x:.1f}" y="{ky + 22:.1f}" font-size="9" '
                 f'text-anchor="{anchor}">{esc(label)}</text>')
  parts.append(f'<text x="{kx + kw + 10:.1f}" y="{ky + 9:.1f}" '
               f'font-size="10">{esc(value_name)}'
               f'{" (log scale)" if log else ""}; grey: missing or NaN'
               f'</text>')
  parts.append("</svg>")
  return "".join(parts)


def _is_pos_inf(v: object) -> bool:
  try:
    return float(v) == math.inf  # type: ignore[arg-type]
  except (TypeError, ValueError):
    return False
