"""The report's first screen: what decided it, the site map, the evidence.

On the realistic campaign data of tests/report/test_report.py (real
float32 matmuls, a bf16-input KUT, a bit flip) and on small hand-made site
lists where one property is at stake.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

import pytest

from peat_jax.core import PeatError
from peat_jax.report import _overview
from peat_jax.report import render_html, write_report

_DOT = re.compile(r'<circle class="rec" cx="([\d.]+)" cy="([\d.]+)" '
                  r'r="([\d.]+)" fill="(#[0-9a-f]{6})"')


def _site(name, verdict, ratios, *, direction="fwd", verdicts=None,
          model="reordering"):
  s = {"site": name, "kernel": "dot_general", "direction": direction,
       "model": model, "verdict": verdict, "confidence": 0.9,
       "evidence": f"evidence of {name}", "steps": [0, 10][:len(ratios)],
       "noise_ratio": ratios}
  if verdicts is not None:
    s["verdicts"] = verdicts
  return s


def _dots(svg: str) -> list[tuple[float, float, float, str]]:
  return [(float(x), float(y), float(r), c)
          for x, y, r, c in _DOT.findall(svg)]


def test_site_map_has_one_dot_per_record_colored_by_its_verdict():
  sites = [_site("fwd/a:0", "fail", [0.8, 300.0],
                 verdicts=["pass", "fail"], model="indexing"),
           _site("fwd/b:0", "pass", [1.2, 0.9]),
           _site("bwd/a:0", "warn", [40.0, 50.0], direction="bwd")]
  svg = _overview.site_map(sites, [["fwd/a:0", 10]])
  ET.fromstring(svg)  # well-formed SVG
  records = _dots(svg)
  assert len(records) == 6 and svg.count("<circle") > 6  # and the legend
  colors = [c for _, _, _, c in records]
  vc = _overview.VERDICT_COLORS
  assert colors == [vc["pass"], vc["fail"], vc["pass"], vc["pass"],
                    vc["warn"], vc["warn"]]
  xs = sorted({x for x, _, _, _ in records})
  ys = sorted({y for _, y, _, _ in records})
  assert len(xs) == 3 and len(ys) == 2  # sites x checkpoints
  assert "step 0</text>" in svg and "step 10</text>" in svg
  assert "<title>fwd: 2 sites</title>" in svg and ">fwd</text>" in svg
  assert "<title>bwd: 1 site</title>" in svg


def test_dot_size_grows_with_noise_ratio_in_decades():
  r = [_overview.dot_radius(v) for v in (0.5, 1.0, 10.0, 1e3, 1e4, 1e9,
                                         float("inf"))]
  assert r[0] == r[1] < r[2] < r[3] < r[4] == r[5] == r[6]
  assert _overview.dot_radius(None) == _overview.dot_radius(float("nan"))
  assert _overview.dot_radius(1e4, 0.5) == pytest.approx(r[4] / 2)


def test_many_sites_shrink_the_dots_to_their_columns():
  sites = [_site(f"fwd/s{i}:0", "fail", [1e6, 1e6]) for i in range(300)]
  svg = _overview.site_map(sites, [])
  records = _dots(svg)
  assert len(records) == 600
  xs = sorted({x for x, _, _, _ in records})
  gap = min(b - a for a, b in zip(xs, xs[1:]))
  assert max(r for _, _, r, _ in records) <= gap / 2


def test_deciding_sites_are_numbered_worst_first_and_ringed():
  sites = [_site("fwd/a:0", "warn", [30.0, 20.0], model="precision:bf16"),
           _site("fwd/b:0", "fail", [500.0, 900.0], model="indexing"),
           _site("fwd/c:0", "pass", [1.0, 1.0])]
  deciding = [["fwd/a:0", 0], ["fwd/b:0", 10], ["fwd/b:0", 0]]
  svg = _overview.site_map(sites, deciding)
  assert svg.count('stroke="#1d2329" stroke-width="1.2"') == 3
  d = {"verdict": {"verdict": "fail", "summary": "s", "deciding": deciding},
       "sites": sites}
  block = _overview.decided(d)
  assert block.index("fwd/b:0") < block.index("fwd/a:0")
  assert '<li value="1">' in block and '<li value="2">' in block
  assert ("at step 0, 10: <a href=\"#model-indexing\"><b>indexing</b></a>"
          in block)
  assert "evidence of fwd/b:0" in block and "fwd/c:0" not in block


def test_decided_counts_the_rest_and_names_records_that_are_not_sites():
  sites = [_site(f"fwd/s{i}:0", "fail", [10.0 * (i + 1)]) for i in range(5)]
  deciding = [[s["site"], 0] for s in sites] + [["runtime every call", 4]]
  d = {"verdict": {"verdict": "fail", "summary": "s", "deciding": deciding},
       "sites": sites}
  block = _overview.decided(d)
  assert block.count("<li ") == _overview.SHOWN_DECIDING
  assert "and 2 more deciding sites" in block
  assert "<code>runtime every call</code> at step 4" in block
  none = _overview.decided({"verdict": {"verdict": "pass", "summary": "s"},
                            "sites": sites})
  assert "names no deciding record" in none


def test_evidence_is_one_collapsed_row_per_site_worst_first():
  sites = [_site("fwd/a:0", "pass", [2.0, 3.0]),
           _site("fwd/b:0", "fail", [5.0, 1.0], model="bitflip"),
           _site("fwd/c:0", "pass", [9.0, 1.0])]
  sec = _overview.section_evidence(sites)
  assert sec.count("<details") == 3 and "<details open" not in sec
  assert sec.count('<details class="site">') == 3
  order = [sec.index(f"<code>{n}</code>") for n in
           ("fwd/b:0", "fwd/c:0", "fwd/a:0")]
  assert order == sorted(order)
  assert "step 0: 5 (fail); step 10: 1 (fail)" in sec
  assert "No sites were profiled" in _overview.section_evidence([])


def test_first_screen_of_the_campaign_page(report_campaign_data, tmp_path):
  data = report_campaign_data
  page = write_report(data, tmp_path).html.read_text(encoding="utf-8")
  first = page[page.index('<section id="verdict">'):
               page.index('<section id="detector">')]
  assert "What decided it" in first and '<svg id="site-map"' in first
  n = sum(len(s["steps"]) for s in data["sites"]
          if s.get("steps") is not None)
  svg = first[first.index('<svg id="site-map"'):]
  svg = svg[:svg.index("</svg>") + 6]
  assert len(_dots(svg)) == n > 0
  for s in data["sites"]:
    assert html.escape(s["site"], quote=False) in page


def test_per_step_verdicts_are_checked(report_campaign_data):
  data = dict(report_campaign_data)
  s0 = dict(data["sites"][0])
  s0["verdicts"] = ["maybe"] * len(s0["steps"])
  data["sites"] = [s0] + list(data["sites"][1:])
  with pytest.raises(PeatError, match=r"'verdicts'\[0\] is 'maybe'"):
    render_html(data)
  s0["verdicts"] = ["pass"]
  with pytest.raises(PeatError, match="'verdicts' has 1 values"):
    render_html(data)
