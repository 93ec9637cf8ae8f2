"""tests/ci_slow.txt names tests that exist, and the hook marks them: a
renamed or removed test must leave the list, or the list grows stale while
the CI job runs what it meant to leave out."""

import ast
import importlib.util
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
_spec = importlib.util.spec_from_file_location(
    "peat_tests_conftest", os.path.join(HERE, "conftest.py"))
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)


def _functions(path: str) -> set[str]:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  return {n.name for n in ast.walk(tree)
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_listed_test_exists():
  entries = _conftest.ci_slow_entries()
  assert len(entries) >= 10
  missing = []
  for entry in entries:
    path, _, name = entry.partition("::")
    if not os.path.isfile(os.path.join(ROOT, path)):
      missing.append(entry)
      continue
    if name and re.sub(r"\[.*\]$", "", name) not in _functions(path):
      missing.append(entry)
  assert not missing, f"tests/ci_slow.txt names no such test: {missing}"


class _Item:
  def __init__(self, nodeid):
    self.nodeid, self.marks = nodeid, []

  def add_marker(self, mark):
    self.marks.append(mark.name)


def test_listed_tests_and_modules_are_marked_slow():
  entries = _conftest.ci_slow_entries()
  one = next(e for e in entries if "::" in e)
  module = next(e for e in entries if "::" not in e)
  items = [_Item(one), _Item(module + "::test_anything[x]"),
           _Item("tests/test_ci_slow_list.py::test_every_listed_test_exists")]
  _conftest.pytest_collection_modifyitems(None, items)
  assert [i.marks for i in items] == [["slow"], ["slow"], []]
