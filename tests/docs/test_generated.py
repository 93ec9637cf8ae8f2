"""The docs' generated sections agree with the code they come from.

scripts/generated_docs.py rewrites every ``<!-- generated: NAME -->``
section (the Detector's tables, the KUT signatures and their arguments,
the error models' glossary and verdict rule, ``nnx_task``'s arguments);
a page edited by hand or code changed without rerunning it fails here.
"""

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _script():
  spec = importlib.util.spec_from_file_location(
      "generated_docs", ROOT / "scripts" / "generated_docs.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_every_generated_section_matches_the_code():
  gen = _script()
  assert not gen.stale(), (
      f"stale generated sections in {gen.stale()}: run "
      "scripts/generated_docs.py")


def test_every_section_is_filled():
  gen = _script()
  for page, sections in gen.PAGES.items():
    text = (ROOT / page).read_text(encoding="utf-8")
    for name in sections:
      m = re.search(rf"<!-- generated: {name} -->\n(.*?)<!-- end generated "
                    "-->", text, re.S)
      assert m is not None and m.group(1).strip(), (page, name)
