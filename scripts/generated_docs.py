"""Regenerates the Detector's tables in docs/detector.md from the code.

The hypothesis table (``peat.detector.hypotheses_table()``), the
threshold table (``peat.detector.config_table()``) and the slip grammar's
table (``peat.analyzer.grammar_table()``) sit between
``<!-- generated: NAME -->`` and ``<!-- end generated -->`` markers; this
rewrites what lies between them. tests/detector/test_config.py fails when
the page and the code disagree.

  .venv/bin/python scripts/detector_docs.py          # rewrite the page
  .venv/bin/python scripts/detector_docs.py --check  # exit 1 if stale
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from peat_jax import analyzer
from peat_jax import detector

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "detector.md"
TABLES = {"hypotheses": detector.hypotheses_table,
          "thresholds": detector.config_table,
          "grammar": analyzer.grammar_table}


def render(text: str) -> str:
  """``text`` with every generated section replaced by its table.

  Raises:
    ValueError: a section's markers are missing.
  """
  for name, table in TABLES.items():
    pattern = re.compile(
        rf"(<!-- generated: {name} -->\n)(?:(?!<!-- ).)*?"
        r"(<!-- end generated -->)", re.S)
    if not pattern.search(text):
      raise ValueError(f"docs/detector.md has no '<!-- generated: {name} "
                       "-->' ... '<!-- end generated -->' section")
    text = pattern.sub(
        lambda m, t=table: m.group(1) + t() + "\n" + m.group(2), text)
  return text


def main(argv=None) -> int:
  """Rewrites (or, with --check, checks) docs/detector.md."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--check", action="store_true",
                 help="exit 1 when the page is stale, writing nothing")
  args = p.parse_args(argv)
  old = PAGE.read_text(encoding="utf-8")
  new = render(old)
  if args.check:
    if new != old:
      print("docs/detector.md is stale: run scripts/detector_docs.py",
            file=sys.stderr)
      return 1
    return 0
  if new != old:
    PAGE.write_text(new, encoding="utf-8")
    print("rewrote docs/detector.md")
  return 0


if __name__ == "__main__":
  sys.exit(main())
