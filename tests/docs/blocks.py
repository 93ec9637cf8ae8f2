"""The runnable blocks of README.md and docs/, and how each one runs.

The docs test (``tests/docs/test_docs.py``) runs every block a user would
run; ``python tests/docs/blocks.py`` lists them (page, line, kind, how it
runs) and counts them. A fenced block runs by its language tag:

* ``bash`` / ``sh`` / ``console``: commands, run with ``bash -e -o
  pipefail``; in a ``console`` block only ``$ `` lines (and the lines they
  continue with a trailing backslash) are commands.
* ``python``: a script of its own.
* ``text``: its ``$ `` lines are commands, run one by one; the other lines
  are their documented output, checked where it can drift: a documented
  verdict line (``KUT <spec>@<kernel> on <model>: PASS|WARN|FAIL``) must
  be printed as it is, and a documented ``exit status N`` is the status
  the command must end with (otherwise 0). A ``text`` block without a
  ``$ `` line is output only.
* Any other tag, or none: never run (schemas, layouts, source excerpts).

An HTML comment on the line before the opening fence changes that:
``<!-- docs-test: slow -->`` (only in the slow set), ``<!-- docs-test:
skip: <reason> -->`` (not run; for what a 2-core CPU machine cannot run),
``<!-- docs-test: continue -->`` (a python block joined to the page's
previous python block), ``<!-- docs-test: exit=N -->`` (the block's status
by design), ``<!-- docs-test: cwd=repo -->`` (run at the repository root,
for ``./run.sh``). Several go in one comment, separated by ``;``.

A page's blocks run in page order in one fresh directory: a copy of
``docs/examples/*`` (also on ``PYTHONPATH``) with ``benchmarks``,
``scripts`` and ``docs`` linked to the repository's, the project's Python
first on ``PATH``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Callable, Iterator, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Block languages whose content is commands or code that runs.
SHELL_TAGS = ("bash", "sh", "console")
#: Seconds a block may take: in the not-slow set, and marked slow.
TIMEOUT_S, SLOW_TIMEOUT_S = 240, 1500
_FENCE = re.compile(r"^(\s*)```\s*([A-Za-z0-9_+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_VERDICT = re.compile(r"^KUT \S+ on \S+: (PASS|WARN|FAIL)$")
_EXIT = re.compile(r"exit status (\d+)")


@dataclasses.dataclass
class Command:
  """One command of a block, with what its documented output promises."""
  text: str
  exit_status: int = 0
  verdict_lines: tuple[str, ...] = ()


@dataclasses.dataclass
class Block:
  """One fenced block of a page."""
  page: str
  line: int
  tag: str
  body: str
  slow: bool = False
  skip: str | None = None
  joined: bool = False
  exit_status: int | None = None
  cwd_repo: bool = False

  @property
  def kind(self) -> str:
    """``python``, ``shell``, ``text`` (commands with output) or ``none``."""
    if self.tag == "python":
      return "python"
    if self.tag in SHELL_TAGS:
      return "shell"
    if self.tag == "text" and any(
        ln.startswith("$ ") for ln in self.body.splitlines()):
      return "text"
    return "none"

  @property
  def runnable(self) -> bool:
    return self.kind != "none"

  @property
  def where(self) -> str:
    return f"{self.page}:{self.line}"

  def commands(self) -> list[Command]:
    """The block's commands (python blocks: none; see :func:`run_block`)."""
    if self.kind == "shell" and self.tag != "console":
      return [Command(self.body, self.exit_status or 0)]
    out: list[Command] = []
    lines = self.body.splitlines()
    i = 0
    while i < len(lines):
      if not lines[i].startswith("$ "):
        i += 1
        continue
      cmd = [lines[i][2:]]
      while cmd[-1].rstrip().endswith("\\") and i + 1 < len(lines):
        i += 1
        cmd.append(lines[i])
      i += 1
      doc = []
      while i < len(lines) and not lines[i].startswith("$ "):
        doc.append(lines[i])
        i += 1
      status = next((int(m.group(1)) for ln in doc
                     for m in [_EXIT.search(ln)] if m), 0)
      if self.exit_status is not None:
        status = self.exit_status
      out.append(Command("\n".join(cmd), status, tuple(
          ln.strip() for ln in doc if _VERDICT.match(ln.strip()))))
    return out


def _markers(line: str) -> dict[str, str]:
  m = _MARKER.match(line)
  if not m:
    return {}
  out = {}
  for part in m.group(1).split(";"):
    key, _, value = part.strip().partition(":" if part.strip().startswith(
        "skip") else "=")
    out[key.strip()] = value.strip()
  return out


def page_blocks(path: pathlib.Path) -> list[Block]:
  """The fenced blocks of one markdown page, with their markers.

  Raises:
    ValueError: an unclosed fence, an unknown marker, or a skip without a
      reason.
  """
  rel = str(path.relative_to(ROOT))
  lines = path.read_text(encoding="utf-8").splitlines()
  out, i = [], 0
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    indent, tag, start = m.group(1), m.group(2).lower(), i
    j = i + 1
    while j < len(lines) and not lines[j].strip().startswith("```"):
      j += 1
    if j == len(lines):
      raise ValueError(f"{rel}:{start + 1}: a fence that is never closed")
    body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln
                     for ln in lines[start + 1:j])
    marks = _markers(lines[start - 1]) if start else {}
    unknown = set(marks) - {"slow", "skip", "continue", "exit", "cwd"}
    if unknown:
      raise ValueError(f"{rel}:{start}: unknown docs-test marker "
                       f"{sorted(unknown)}; known: slow, skip: <reason>, "
                       "continue, exit=N, cwd=repo")
    if "skip" in marks and not marks["skip"]:
      raise ValueError(f"{rel}:{start}: 'docs-test: skip' needs a reason "
                       "('skip: needs an NVIDIA GPU')")
    out.append(Block(rel, start + 1, tag, body, slow="slow" in marks,
                     skip=marks.get("skip"), joined="continue" in marks,
                     exit_status=int(marks["exit"]) if "exit" in marks
                     else None, cwd_repo=marks.get("cwd") == "repo"))
    i = j + 1
  return out


def pages() -> list[pathlib.Path]:
  """README.md and every markdown page under docs/, in a fixed order."""
  return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def all_blocks() -> list[Block]:
  return [b for p in pages() for b in page_blocks(p)]


def environment(workdir: pathlib.Path) -> dict[str, str]:
  """The environment a block runs in: the project's Python first."""
  env = dict(os.environ)
  venv_bin = str(pathlib.Path(sys.executable).parent)
  env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (str(workdir), env.get("PYTHONPATH", "")) if p)
  env.setdefault("JAX_PLATFORMS", "cpu")
  env["PYTHONDONTWRITEBYTECODE"] = "1"
  return env


def prepare(workdir: pathlib.Path) -> pathlib.Path:
  """Fills a page's fresh directory: the examples, links to the repo."""
  workdir.mkdir(parents=True, exist_ok=True)
  for f in (ROOT / "docs" / "examples").iterdir():
    if f.is_file():
      shutil.copy2(f, workdir / f.name)
  for name in ("benchmarks", "scripts", "docs"):
    link = workdir / name
    if not link.exists():
      link.symlink_to(ROOT / name, target_is_directory=True)
  return workdir


class BlockFailed(AssertionError):
  """A documented block did not run as the page says."""


def _run(argv: Sequence[str], block: Block, cwd: pathlib.Path,
         env: dict[str, str], what: str,
         limit: float | None = None) -> subprocess.CompletedProcess:
  limit = limit or (SLOW_TIMEOUT_S if block.slow else TIMEOUT_S)
  try:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=limit)
  except subprocess.TimeoutExpired as e:
    raise BlockFailed(f"{block.where}: {what} ran past {limit} s; mark the "
                      "block '<!-- docs-test: slow -->' or make it smaller"
                      ) from e


def _tail(text: str, n: int = 3000) -> str:
  return text if len(text) <= n else "..." + text[-n:]


def run_command(block: Block, cmd: Command, workdir: pathlib.Path,
                limit: float | None = None) -> subprocess.CompletedProcess:
  """Runs one command of a block where the block runs, unchecked.

  Args:
    block: the block the command belongs to.
    cmd: the command.
    workdir: the page's directory (:func:`prepare`).
    limit: seconds it may take (None: the block's limit).

  Returns:
    The finished process (stdout and stderr as text).

  Raises:
    BlockFailed: it ran past the limit.
  """
  return _run(["bash", "-e", "-o", "pipefail", "-c", cmd.text], block,
              ROOT if block.cwd_repo else workdir, environment(workdir),
              f"'{cmd.text.splitlines()[0]}'", limit)


def run_block(block: Block, workdir: pathlib.Path,
              python_prefix: str = "") -> str:
  """Runs one block in ``workdir`` and checks it against the page.

  Args:
    block: a runnable block.
    workdir: the page's directory (:func:`prepare`).
    python_prefix: earlier python blocks this one continues.

  Returns:
    The combined output.

  Raises:
    BlockFailed: a command's status, or a documented verdict line, differs
      from the page.
  """
  if block.kind == "python":
    script = workdir / f"_block_{block.line}.py"
    script.write_text(python_prefix + block.body + "\n", encoding="utf-8")
    want = block.exit_status or 0
    res = _run([sys.executable, str(script)], block,
               ROOT if block.cwd_repo else workdir, environment(workdir),
               "the script")
    if res.returncode != want:
      raise BlockFailed(f"{block.where}: the python block exited "
                        f"{res.returncode} (expected {want}):\n"
                        f"{_tail(res.stdout + res.stderr)}")
    return res.stdout + res.stderr
  out = []
  for cmd in block.commands():
    res = run_command(block, cmd, workdir)
    text = res.stdout + res.stderr
    if res.returncode != cmd.exit_status:
      raise BlockFailed(f"{block.where}: '{cmd.text}' exited "
                        f"{res.returncode} (the page says "
                        f"{cmd.exit_status}):\n{_tail(text)}")
    printed = {ln.strip() for ln in text.splitlines()}
    for line in cmd.verdict_lines:
      if line not in printed:
        got = [ln for ln in printed if _VERDICT.match(ln)]
        raise BlockFailed(f"{block.where}: '{cmd.text.splitlines()[0]}' "
                          f"printed {got or 'no verdict line'}; the page "
                          f"says '{line}'")
    out.append(text)
  return "\n".join(out)


def run_page(blocks: Sequence[Block], workdir: pathlib.Path,
             include_slow: bool,
             run: Callable[[Block, pathlib.Path, str], object] | None = None
             ) -> Iterator[Block]:
  """Runs a page's runnable blocks in order, yielding each one run.

  Without ``include_slow`` it stops at the first slow block: later blocks
  may read what that one wrote. ``run(block, workdir, python_prefix)``
  runs one block (default :func:`run_block`); a python block that the
  next one continues runs as that one's prefix.
  """
  run = run or run_block
  prepare(workdir)
  prefix = ""
  runnable = [b for b in blocks if b.runnable and b.skip is None]
  for k, b in enumerate(runnable):
    if b.slow and not include_slow:
      return
    following = runnable[k + 1] if k + 1 < len(runnable) else None
    if b.kind == "python" and following is not None and following.joined:
      prefix += b.body + "\n"  # runs with the block that continues it
      continue
    run(b, workdir, prefix if b.joined else "")
    if b.kind == "python":
      prefix = ""
    yield b


def _table() -> int:
  blocks = all_blocks()
  print(f"{'page:line':<44} {'tag':<8} {'kind':<7} how")
  for b in blocks:
    how = ("not run (output or excerpt)" if not b.runnable else
           f"skip: {b.skip}" if b.skip else "slow" if b.slow else "run")
    print(f"{b.where:<44} {b.tag or '-':<8} {b.kind:<7} {how}")
  run = [b for b in blocks if b.runnable and not b.skip]
  print(f"\n{len(blocks)} blocks in {len(pages())} pages: {len(run)} run "
        f"({sum(not b.slow for b in run)} in the not-slow set, "
        f"{sum(b.slow for b in run)} slow), "
        f"{sum(bool(b.skip) for b in blocks if b.runnable)} skipped with a "
        f"reason, {sum(not b.runnable for b in blocks)} not runnable "
        "(outputs, schemas, excerpts)")
  return 0


if __name__ == "__main__":
  sys.exit(_table())
