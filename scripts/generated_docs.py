"""Regenerates the sections of the docs that the code knows.

Each section sits between ``<!-- generated: NAME -->`` and
``<!-- end generated -->`` markers in its page; this rewrites what lies
between them from the code, so page, ``--help`` and error messages cannot
disagree:

| page | sections |
| --- | --- |
| docs/detector.md | the hypothesis table, the threshold table, the slip grammar |
| docs/kernels.md | the KUT signature of each site kernel and its arguments' forms |
| docs/error_models.md | the error models' glossary, the verdict rule |
| docs/howto/validate_your_port.md | the site kernels' signatures, the verdict rule, `nnx_task`'s arguments |
| docs/howto/read_a_report.md | the error models' glossary |

tests/docs/test_generated.py fails when a page and the code disagree.

  .venv/bin/python scripts/generated_docs.py          # rewrite the pages
  .venv/bin/python scripts/generated_docs.py --check  # exit 1 if stale
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import re
import sys
from typing import Callable

import peat_jax as peat
from peat_jax import analyzer
from peat_jax import detector

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _docstring_args(fn: Callable) -> str:
  """The ``Args:`` section of a Google docstring as a markdown list."""
  doc = inspect.getdoc(fn) or ""
  m = re.search(r"^Args:\n(.*?)(?:\n\n|\Z)", doc, re.S | re.M)
  if m is None:
    raise ValueError(f"{fn.__qualname__} has no Args: section")
  items, cur = [], None
  for line in m.group(1).splitlines():
    head = re.match(r"^  (\w+): (.*)$", line)
    if head:
      cur = [head.group(1), head.group(2)]
      items.append(cur)
    elif cur is not None:
      cur[1] += " " + line.strip()
  return "\n".join(f"* `{n}`: {text}" for n, text in items)


def nnx_task_args() -> str:
  """``peat.nnx_task``'s signature and arguments, from its docstring."""
  sig = inspect.signature(peat.nnx_task)
  bare = sig.replace(
      parameters=[p.replace(annotation=inspect.Parameter.empty)
                  for p in sig.parameters.values()],
      return_annotation=inspect.Signature.empty)
  return (f"`peat.nnx_task{bare}`\n\n"
          + _docstring_args(peat.nnx_task).replace("``", "`"))


PAGES: dict[str, dict[str, Callable[[], str]]] = {
    "docs/detector.md": {"hypotheses": detector.hypotheses_table,
                         "thresholds": detector.config_table,
                         "grammar": analyzer.grammar_table},
    "docs/kernels.md": {"kut_signatures": peat.kernels.signature_table,
                        "kut_arguments": peat.kernels.arguments_section},
    "docs/error_models.md": {"glossary": detector.glossary_table,
                             "verdict_rule": detector.verdict_rule},
    "docs/howto/validate_your_port.md": {
        "kut_signatures": peat.kernels.signature_table,
        "verdict_rule": detector.verdict_rule,
        "nnx_task": nnx_task_args},
    "docs/howto/read_a_report.md": {"glossary": detector.glossary_table},
}


def render(page: str, text: str) -> str:
  """``text`` of ``page`` with every generated section rewritten.

  Raises:
    ValueError: a section's markers are missing.
  """
  for name, make in PAGES[page].items():
    pattern = re.compile(
        rf"(<!-- generated: {name} -->\n)(?:(?!<!-- ).)*?"
        r"(<!-- end generated -->)", re.S)
    if not pattern.search(text):
      raise ValueError(f"{page} has no '<!-- generated: {name} -->' ... "
                       "'<!-- end generated -->' section")
    text = pattern.sub(
        lambda m, t=make(): m.group(1) + t + "\n" + m.group(2), text)
  return text


def stale() -> list[str]:
  """The pages whose generated sections disagree with the code."""
  return [page for page in PAGES
          if render(page, (ROOT / page).read_text(encoding="utf-8"))
          != (ROOT / page).read_text(encoding="utf-8")]


def main(argv=None) -> int:
  """Rewrites (or, with --check, checks) every page's generated sections."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--check", action="store_true",
                 help="exit 1 when a page is stale, writing nothing")
  args = p.parse_args(argv)
  if args.check:
    bad = stale()
    for page in bad:
      print(f"{page} is stale: run scripts/generated_docs.py", file=sys.stderr)
    return 1 if bad else 0
  for page in PAGES:
    path = ROOT / page
    old = path.read_text(encoding="utf-8")
    new = render(page, old)
    if new != old:
      path.write_text(new, encoding="utf-8")
      print(f"rewrote {page}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
