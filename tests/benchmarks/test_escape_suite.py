"""The escape suite (benchmarks/escape_suite.py) in its --quick form.

Slow: two CNN campaigns (golden run, playback with invariance checks,
runtime FI) and the three random-input protocols on each kernel.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                      "escape_suite.py")


@pytest.mark.slow
def test_quick_suite_prints_the_table_of_two_defects(tmp_path):
  out = subprocess.run(
      [sys.executable, SCRIPT, "--quick", f"--workdir={tmp_path}"],
      capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  lines = out.stdout.splitlines()
  head = next(i for i, l in enumerate(lines) if l.startswith("| case |"))
  rows = lines[head + 2:head + 4]
  assert lines[head + 1].count("---") == 8
  assert [r.split(" | ")[0] for r in rows] == [
      "| input_zeroing (defect)", "| batch_variant_split (defect)"]
  for r in rows:
    assert r.count(" | ") == 7
  # The zeroing kernel fails peat as input_mutation; the split-K warns.
  assert "**fail** | input_mutation (input_mutation) |" in rows[0]
  assert "**warn** | batch_variance (batch_variance) |" in rows[1]
  assert any(l.startswith("peat flags 2 of 2 defects") for l in lines)
  with open(os.path.join(tmp_path, "escape_suite.json")) as f:
    data = json.load(f)
  assert [r["name"] for r in data["rows"]] == ["input_zeroing",
                                               "batch_variant_split"]
  for r in data["rows"]:
    for p in ("KernelBench", "assert_close", "robust-kbench"):
      assert isinstance(r[p]["passed"], bool) and r[p]["detail"]
    assert r["peat"]["records"] > 0


def test_unknown_case_is_refused(tmp_path):
  out = subprocess.run(
      [sys.executable, SCRIPT, "--only=no_such_case", f"--workdir={tmp_path}"],
      capture_output=True, text=True, timeout=300)
  assert out.returncode == 2
  assert "error: unknown cases ['no_such_case']" in out.stderr
