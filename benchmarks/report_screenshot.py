"""Screenshots of a campaign's report.html in headless Chromium.

Usage::

  .venv/bin/python benchmarks/report_screenshot.py runs/sig_gpt_in_bf16 \
      --out=benchmarks/out/report_gpt_in_bf16 \
      [--sections=verdict,trends,significance,provenance] [--height=2600] \
      [--top_height=900]

Writes ``<out>_top.png`` (the page as it opens, 1280 px wide and
``--top_height`` tall: 900, a laptop's first screen) and
``<out>_sections.png``: the same page with every section but ``--sections``
hidden by one added CSS rule (the report's own HTML and SVG, nothing
redrawn). Needs ``/usr/bin/chromium`` (scripts/ensure_chromium.sh); exits
2 without it.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import significance_figures  # pylint: disable=wrong-import-position

WIDTH = 1280


def main(argv: list[str]) -> int:
  out, sections, height, dirs = None, "verdict,trends,significance,provenance", 2600, []
  top_height = 900
  for a in argv[1:]:
    if a.startswith("--out="):
      out = a.split("=", 1)[1]
    elif a.startswith("--sections="):
      sections = a.split("=", 1)[1]
    elif a.startswith("--height="):
      height = int(a.split("=", 1)[1])
    elif a.startswith("--top_height="):
      top_height = int(a.split("=", 1)[1])
    else:
      dirs.append(a)
  if len(dirs) != 1 or not out:
    print("error: give one campaign directory and --out=<path prefix>",
          file=sys.stderr)
    return 2
  page = os.path.join(dirs[0], "report.html")
  if not os.path.exists(page):
    print(f"error: no report.html in {dirs[0]}; run python -m "
          "peat_jax.tools.validate there first", file=sys.stderr)
    return 2
  if significance_figures.chromium() is None:
    print("error: no headless Chromium; install it with "
          "scripts/ensure_chromium.sh (Debian: apt-get install chromium)",
          file=sys.stderr)
    return 2
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  ok = significance_figures.screenshot(page, out + "_top.png", WIDTH,
                                       top_height)
  with open(page, encoding="utf-8") as f:
    text = f.read()
  keep = "".join(f":not(#{s})" for s in sections.split(",") if s)
  rule = f"<style>section{keep}{{display:none}}</style>"
  text = text.replace("</head>", rule + "</head>", 1)
  with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False,
                                   dir=dirs[0], encoding="utf-8") as f:
    f.write(text)
    tmp = f.name
  try:
    ok = significance_figures.screenshot(tmp, out + "_sections.png", WIDTH,
                                         height) and ok
  finally:
    os.unlink(tmp)
  print(f"{out}_top.png, {out}_sections.png" if ok else "screenshot failed")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv))
