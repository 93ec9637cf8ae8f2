"""Regenerates the example outputs of README.md (or any docs page).

Usage::

  python benchmarks/readme_examples.py [--write] [--pages=README.md]

Runs every runnable block of each page as the docs test does
(``tests/docs/blocks.py``: page order, one fresh directory per page with
``docs/examples`` in it, slow blocks included, blocks marked skip left
out). The output of each command of a ``text`` block (``$ `` lines) is
kept whole under ``benchmarks/out/readme/`` and, cut to what a reader
needs (short outputs whole; long ones from their ``KUT ...: VERDICT``
summary on, at most :data:`KEEP_LINES` lines), becomes the block's
documented output. The block's first line names the commit that printed
it. ``--write`` rewrites the pages; without it the script prints the
blocks it would write. It refuses ``--write`` when tracked files differ
from HEAD (the outputs would name a commit that did not print them),
unless ``--allow_dirty``.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "docs"))
import blocks as _blocks  # pylint: disable=wrong-import-position

#: Lines of a long output kept in the page (the rest: raw files).
KEEP_LINES = 12
#: Outputs this short are kept whole.
WHOLE_LINES = 14
_STAMP = re.compile(r"^# output at \S+")
_SUMMARY = re.compile(r"^KUT \S+ on \S+: (PASS|WARN|FAIL)$")
#: Where a verdict summary ends: provenance, then the files written.
_SUMMARY_END = ("provenance:", "report:", "data:", "verdict:")
_PROGRESS = re.compile(r"^(WARNING|I\d{4}|W\d{4}|\[peat\])")


def cut(output: str) -> list[str]:
  """The lines of a command's output a page shows.

  Args:
    output: stdout and stderr of the command.

  Returns:
    The whole output (log noise dropped) when it is short. A long one
    with a verdict: its last ``KUT ...: VERDICT`` summary up to the
    provenance and file lines, at most :data:`KEEP_LINES`, and the
    ``--fail_on`` line; without one, its first lines. ``...`` marks lines
    left out.
  """
  lines = [ln.rstrip() for ln in output.splitlines()
           if ln.strip() and not _PROGRESS.match(ln)]
  if len(lines) <= WHOLE_LINES:
    return lines
  starts = [i for i, ln in enumerate(lines) if _SUMMARY.match(ln.strip())]
  if not starts:
    return lines[:KEEP_LINES - 1] + ["..."]
  body = []
  for ln in lines[starts[-1]:]:
    if ln.strip().startswith(_SUMMARY_END):
      break
    body.append(ln)
  if len(body) > KEEP_LINES:
    body = body[:KEEP_LINES - 1] + ["  ..."]
  gate = [ln for ln in lines if "reaches --fail_on" in ln]
  return body + gate[-1:]


def commit(allow_dirty: bool) -> str:
  """HEAD's short hash; refuses a tree whose tracked files changed."""
  sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                       capture_output=True, text=True, check=True).stdout
  dirty = subprocess.run(["git", "status", "--porcelain",
                          "--untracked-files=no"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
  if dirty.strip() and not allow_dirty:
    raise SystemExit("error: tracked files differ from HEAD; commit first "
                     "(the outputs name the commit that printed them) or "
                     "pass --allow_dirty")
  return sha.strip() + ("+changes" if dirty.strip() else "")


def block_text(block: _blocks.Block, outputs: list[str], sha: str) -> str:
  """The block's new body: each command with its cut output."""
  out = [f"# output at {sha} (python benchmarks/readme_examples.py)"]
  for cmd, text in zip(block.commands(), outputs):
    lines = cmd.text.splitlines()
    out.append("$ " + lines[0])
    out += lines[1:]
    out += cut(text)
    out.append("")
  return "\n".join(out).rstrip("\n")


def regenerate(page: pathlib.Path, workdir: pathlib.Path, raw: pathlib.Path,
               sha: str) -> dict[int, str]:
  """Runs a page's blocks as the docs test does, the output of its text
  blocks recorded rather than checked; returns ``{block line: new body}``."""
  new = {}

  def run(b: _blocks.Block, wd: pathlib.Path, prefix: str) -> None:
    if b.kind != "text":
      _blocks.run_block(b, wd, prefix)
      return
    outputs = []
    for k, cmd in enumerate(b.commands()):
      print(f"[{b.where}] $ {cmd.text.splitlines()[0]}", flush=True)
      res = _blocks.run_command(b, cmd, wd, _blocks.SLOW_TIMEOUT_S)
      text = res.stdout + res.stderr
      if res.returncode and f"exit status {res.returncode}" not in text:
        text += f"\nexit status {res.returncode}\n"
      name = f"{page.stem}_{b.line}_{k}.txt"
      (raw / name).write_text(f"# {sha}: $ {cmd.text}\n{text}",
                              encoding="utf-8")
      outputs.append(text)
    new[b.line] = block_text(b, outputs, sha)

  for _ in _blocks.run_page(_blocks.page_blocks(page), workdir,
                            include_slow=True, run=run):
    pass
  return new


def rewrite(page: pathlib.Path, new: dict[int, str]) -> None:
  """Puts the new bodies into the page, fences and markers kept."""
  lines = page.read_text(encoding="utf-8").splitlines()
  for start in sorted(new, reverse=True):  # 1-based line of the fence
    end = start
    while not lines[end].strip().startswith("```"):
      end += 1
    lines[start:end] = new[start].splitlines()
  page.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--pages", default="README.md",
                  help="comma-separated pages, relative to the repository")
  ap.add_argument("--write", action="store_true", help="rewrite the pages")
  ap.add_argument("--allow_dirty", action="store_true")
  ap.add_argument("--raw", default=str(ROOT / "benchmarks/out/readme"))
  args = ap.parse_args(argv)
  sha = commit(args.allow_dirty or not args.write)
  raw = pathlib.Path(args.raw)
  raw.mkdir(parents=True, exist_ok=True)
  for rel in args.pages.split(","):
    page = ROOT / rel
    if not page.exists():
      raise SystemExit(f"error: no page {rel}; give pages relative to {ROOT}")
    with tempfile.TemporaryDirectory(prefix="peat_readme_") as d:
      new = regenerate(page, pathlib.Path(d), raw, sha)
    if args.write:
      rewrite(page, new)
      print(f"{rel}: {len(new)} blocks rewritten at {sha}")
    else:
      for line, body in new.items():
        print(f"--- {rel}:{line}\n{body}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
