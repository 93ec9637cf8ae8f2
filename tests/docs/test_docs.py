"""Every command and code block of README.md and docs/ runs as documented.

The blocks, their markers and how each runs: ``tests/docs/blocks.py``
(``python tests/docs/blocks.py`` lists them). Each page runs in a fresh
directory of its own, its blocks in page order: the not-slow test runs a
page's blocks up to its first slow one, the slow test the whole page.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import blocks as _blocks  # pylint: disable=wrong-import-position

PAGES = {str(p.relative_to(_blocks.ROOT)): _blocks.page_blocks(p)
         for p in _blocks.pages()}
_MODULE = re.compile(r"python -m peat_jax\.tools\.([a-z_]+)")
_SCRIPT = re.compile(r"(?<![\w/.-])(peat-[a-z]+)")


def _runnable(page: str) -> list[_blocks.Block]:
  return [b for b in PAGES[page] if b.runnable and b.skip is None]


FAST_PAGES = [p for p in PAGES if _runnable(p) and not _runnable(p)[0].slow]
ALL_PAGES = [p for p in PAGES if _runnable(p)]


def test_every_page_parses_and_has_no_unrun_command():
  """Commands live only in blocks that run (or skip with a reason)."""
  assert len(PAGES) >= 20
  hidden = []
  for page, bs in PAGES.items():
    for b in bs:
      if b.kind == "none" and any(
          ln.lstrip().startswith(("$ python", "$ peat-", "$ ./"))
          for ln in b.body.splitlines()):
        hidden.append(f"{b.where} ({b.tag or 'no tag'})")
  assert not hidden, ("commands in blocks that never run; tag them bash, "
                      f"console or text: {hidden}")


def test_documented_tools_exist():
  """Every peat_jax tool a block names exists: ``python -m
  peat_jax.tools.X`` a module of peat_jax.tools, ``peat-X`` a console
  script of pyproject.toml."""
  import peat_jax.tools as tools  # pylint: disable=import-outside-toplevel
  modules = {p.stem for p in pathlib.Path(tools.__file__).parent.glob("*.py")}
  scripts = set(re.findall(r"(?m)^(peat-[a-z]+) = ",
                           (_blocks.ROOT / "pyproject.toml").read_text()))
  assert scripts, "pyproject.toml lists no peat-* console script"
  missing = []
  for bs in PAGES.values():
    for b in bs:
      if b.runnable:
        missing += [f"{b.where}: peat_jax.tools.{m}"
                    for m in _MODULE.findall(b.body) if m not in modules]
        missing += [f"{b.where}: {n}" for n in _SCRIPT.findall(b.body)
                    if n not in scripts]
  assert not missing, f"blocks name tools that do not exist: {missing}"


@pytest.mark.parametrize("page", FAST_PAGES)
def test_page_blocks_run(page, tmp_path):
  ran = list(_blocks.run_page(PAGES[page], tmp_path, include_slow=False))
  assert ran, f"{page}: no block ran"


@pytest.mark.slow
@pytest.mark.parametrize("page", ALL_PAGES)
def test_page_blocks_run_with_slow_ones(page, tmp_path):
  ran = list(_blocks.run_page(PAGES[page], tmp_path, include_slow=True))
  want = [b for b in _runnable(page)
          if not (b.kind == "python" and _joined_next(page, b))]
  assert [b.line for b in ran] == [b.line for b in want]


def _joined_next(page: str, block: _blocks.Block) -> bool:
  rs = _runnable(page)
  k = rs.index(block)
  return k + 1 < len(rs) and rs[k + 1].joined


def test_listing_counts_the_blocks():
  res = subprocess.run([sys.executable, str(pathlib.Path(_blocks.__file__))],
                       capture_output=True, text=True, check=True)
  n = sum(len(bs) for bs in PAGES.values())
  assert f"{n} blocks in {len(PAGES)} pages" in res.stdout


def _anchors(path: pathlib.Path) -> set[str]:
  """GitHub's anchors of a page's headings."""
  out = set()
  for line in path.read_text(encoding="utf-8").splitlines():
    m = re.match(r"#+ (.*)", line)
    if m:
      out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
              .replace(" ", "-"))
  return out


def test_relative_links_resolve():
  """Every relative link of README.md, BUILD.md, CHANGELOG.md and docs/
  names a file that exists, and a heading of it where it names one."""
  pages = [_blocks.ROOT / n for n in ("BUILD.md", "CHANGELOG.md")]
  bad = []
  for page in _blocks.pages() + pages:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"),
                  flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
      if link.startswith(("http:", "https:", "mailto:")):
        continue
      path, _, anchor = link.partition("#")
      target = (page.parent / path).resolve() if path else page
      if not target.exists():
        bad.append(f"{page.name}: {link}")
      elif anchor and target.suffix == ".md" and (
          anchor not in _anchors(target)):
        bad.append(f"{page.name}: {link} (no such heading)")
  assert not bad, f"links that lead nowhere: {bad}"
