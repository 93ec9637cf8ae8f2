"""The campaign report rendered by a real browser (headless Chromium).

Skipped only when ``/usr/bin/chromium`` is missing (Debian/Ubuntu:
``apt-get install -y chromium``). The page is loaded from a ``file://`` URL
with networking features off; the test checks that the rendered DOM holds
the verdict badge and that the screenshot is a real picture (decoded with
the small PNG reader below, not just a file that exists).
"""

from __future__ import annotations

import html
import pathlib
import struct
import subprocess
import zlib

import pytest

from peat_jax.report import write_report

CHROMIUM = pathlib.Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars")
WIDTH, HEIGHT = 1280, 2000
FAIL_RED = (0xC5, 0x22, 0x1F)  # .v-fail in peat_jax/_report.py


@pytest.fixture(scope="module")
def report(tmp_path_factory, report_campaign_data):
  if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing; install it with "
                "'apt-get install -y chromium' to run the browser test")
  data = report_campaign_data
  return data, write_report(data, tmp_path_factory.mktemp("report"))


def _chromium(tmp_path: pathlib.Path,
             *args: str) -> subprocess.CompletedProcess:
  cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         *args]
  try:
    return subprocess.run(cmd, capture_output=True, timeout=90, check=True)
  except subprocess.TimeoutExpired as e:
    raise AssertionError(f"chromium did not finish in 90 s: {cmd}") from e


def _paeth(a: int, b: int, c: int) -> int:
  p = a + b - c
  pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
  if pa <= pb and pa <= pc:
    return a
  return b if pb <= pc else c


def read_png_rows(path: pathlib.Path, max_rows: int) -> tuple[int, int, list]:
  """Decodes the first ``max_rows`` rows of an 8-bit RGB or RGBA PNG.

  Returns:
    ``(width, height, rows)``, each row a ``bytes`` of ``width * channels``.
  """
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
  pos, idat, header = 8, [], None
  while pos < len(data):
    (n,) = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b"IHDR":
      header = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
      idat.append(body)
  width, height, depth, color, _, _, interlace = header
  assert depth == 8 and color in (2, 6) and interlace == 0, header
  bpp = 3 if color == 2 else 4
  stride = width * bpp
  raw = zlib.decompressobj().decompress(b"".join(idat),
                                        (stride + 1) * max_rows)
  prev = bytearray(stride)
  rows = []
  for r in range(min(max_rows, height)):
    kind = raw[r * (stride + 1)]
    line = bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
    if kind == 1:
      for i in range(bpp, stride):
        line[i] = (line[i] + line[i - bpp]) & 255
    elif kind == 2:
      line = bytearray((x + y) & 255 for x, y in zip(line, prev))
    elif kind == 3:
      for i in range(stride):
        left = line[i - bpp] if i >= bpp else 0
        line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
    elif kind == 4:
      for i in range(stride):
        left = line[i - bpp] if i >= bpp else 0
        upleft = prev[i - bpp] if i >= bpp else 0
        line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 255
    rows.append(bytes(line))
    prev = line
  return width, height, rows


def test_screenshot_is_not_blank(report, tmp_path):
  _, paths = report
  png = tmp_path / "report.png"
  _chromium(tmp_path, f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}",
            paths.html.as_uri())
  assert png.exists(), "chromium wrote no screenshot"
  assert png.stat().st_size > 30_000  # a blank page compresses to ~10 KB
  width, height, rows = read_png_rows(png, 320)  # title, badge, table top
  assert (width, height) == (WIDTH, HEIGHT)
  bpp = len(rows[0]) // width
  pixels = [tuple(row[i:i + 3]) for row in rows
            for i in range(0, len(row), bpp)]
  uniform = sum(len(set(row[i:i + 3] for i in range(0, len(row), bpp))) == 1
                for row in rows)
  assert uniform < len(rows) * 0.8, f"{uniform} of {len(rows)} rows uniform"
  assert len(set(pixels)) > 50
  red = sum(p == FAIL_RED for p in pixels)
  assert red > 5_000, f"the FAIL badge is not drawn ({red} red pixels)"


def test_rendered_dom_has_verdict_and_sites(report, tmp_path):
  data, paths = report
  dom = _chromium(tmp_path, "--dump-dom", paths.html.as_uri()).stdout.decode()
  assert '<div class="badge v-fail">FAIL</div>' in dom
  assert html.escape(data["verdict"]["summary"], quote=False) in dom
  for site in data["sites"]:
    assert html.escape(site["site"], quote=False) in dom
  assert dom.count("<svg") >= 10


_MEASURE = """<script>
addEventListener('load', () => {
  const box = (el) => el ? el.getBoundingClientRect() : null;
  const b = (sel) => { const r = box(document.querySelector(sel));
                       return r ? [Math.round(r.top), Math.round(r.bottom),
                                   Math.round(r.width)] : null; };
  const out = {badge: b('.badge'), decided: b('.decided'),
               map: b('#site-map'), evidence: b('#detector details'),
               open: document.querySelectorAll('details[open]').length,
               dots: document.querySelectorAll('#site-map circle.rec').length,
               rows: document.querySelectorAll('#detector details').length};
  const p = document.createElement('pre');
  p.id = 'measured'; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
});
</script>"""


def test_first_screen_holds_verdict_decision_and_site_map(report, tmp_path):
  """Laid out by Chromium at 1280x900: the badge, what decided it and the
  whole site map lie on the first screen; the per-site evidence follows,
  one collapsed row per site."""
  import json  # pylint: disable=import-outside-toplevel
  data, paths = report
  page = tmp_path / "measured.html"
  page.write_text(paths.html.read_text(encoding="utf-8").replace(
      "</body>", _MEASURE + "</body>"), encoding="utf-8")
  dom = _chromium(tmp_path, "--window-size=1280,900", "--dump-dom",
                  "--virtual-time-budget=5000", page.as_uri()).stdout.decode()
  got = json.loads(html.unescape(dom.split('<pre id="measured">')[1]
                                 .split("</pre>")[0]))
  screen = 900
  assert got["badge"][1] < got["decided"][0] < got["map"][0]
  assert got["map"][1] <= screen, f"site map ends at {got['map'][1]} px"
  assert got["evidence"][0] > got["map"][1]
  assert got["open"] == 0 and got["rows"] == len(data["sites"])
  n = sum(len(s["steps"]) for s in data["sites"]
          if s.get("steps") is not None)
  assert got["dots"] == n > 0
