"""The escape suite (benchmarks/escape_suite.py) in its --quick form.

Slow: two CNN campaigns (golden run, playback with invariance checks,
runtime FI), one GPT campaign of a shape-gated defect with its fuzz
(``peat.profile``, ``peat.fuzz``) and its exported repro run by pytest
before and after the fix, and the three random-input protocols on each
kernel.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                      "escape_suite.py")
COLUMNS = 12


@pytest.mark.slow
def test_quick_suite_prints_the_table_of_two_defects(tmp_path):
  out = subprocess.run(
      [sys.executable, SCRIPT, "--quick", f"--workdir={tmp_path}"],
      capture_output=True, text=True, timeout=1500)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  lines = out.stdout.splitlines()
  head = next(i for i, l in enumerate(lines) if l.startswith("| case |"))
  assert "| training verdict |" in lines[head]
  assert lines[head].endswith("| fuzz verdict | fuzz family (expected) | "
                              "exposing variant | repro: bug / fix |")
  rows = lines[head + 2:head + 5]
  assert lines[head + 1].count("---") == COLUMNS
  assert [r.split(" | ")[0] for r in rows] == [
      "| input_zeroing (defect)", "| batch_variant_split (defect)",
      "| attention_gqa_modulo (defect)"]
  for r in rows:
    assert r.count(" | ") == COLUMNS - 1
  # The zeroing kernel fails peat as input_mutation; the split-K warns;
  # neither is fuzzed by default.
  assert "**fail** | input_mutation (input_mutation) |" in rows[0]
  assert "**warn** | batch_variance (batch_variance) |" in rows[1]
  assert rows[0].endswith("| - | - | - | - |")
  # The GQA bug: gpt trains with H == Hk, so training-shape playback
  # passes it; the fuzz's fewer-kv-heads variant fails it as indexing;
  # its repro, shrunk from the training's [2, 40, 4, 32] queries to the
  # smallest that fails, fails on the bug and passes on the fixed twin.
  assert ("| **pass** | - (pass) |" in rows[2]
          and "| **fail** | indexing (indexing) | `kv_heads=2` | fails / "
          "passes at `[1, " in rows[2]
          and rows[2].endswith("(found at `[2, 40, 4, 32]`) |")), rows[2]
  assert any(l.startswith("peat flags 2 of 2 defects") for l in lines)
  assert any(l.startswith(
      "shape-gated defects: training-shape playback passes 1 of 1; the "
      "fuzz catches 1 of 1 and names the expected family for 1; their "
      "repros fail before the fix and pass after it for 1 of 1")
             for l in lines), out.stdout[-2000:]
  with open(os.path.join(tmp_path, "escape_suite.json")) as f:
    data = json.load(f)
  assert [r["name"] for r in data["rows"]] == [
      "input_zeroing", "batch_variant_split", "attention_gqa_modulo"]
  for r in data["rows"]:
    for p in ("KernelBench", "assert_close", "robust-kbench"):
      assert isinstance(r[p]["passed"], bool) and r[p]["detail"]
    assert r["peat"]["records"] > 0
  gqa = data["rows"][2]
  assert gqa["fixed"] == "py:escape_shapes:attention_gqa_modulo_fixed"
  fz = gqa["fuzz"]
  # The default budget (150 s) runs part of the lattice: what it skipped
  # is over the budget or not applicable, every family the site has ran.
  assert fz["records"] > 10
  assert {s["reason"].split(":")[0] for s in fz["skipped"]} <= {
      "over the budget", "not applicable"}
  assert {"batch", "length", "heads", "head_dim", "mask",
          "attention"} <= set(fz["families"])
  assert fz["records"] + fz["errors"] + len(fz["skipped"]) >= fz["planned"]
  repro = gqa["repro"]
  for key in ("case.json", "case.npz", "test_repro.py", "pytest_bug.txt",
              "pytest_fix.txt"):
    assert os.path.exists(os.path.join(repro["folder"], key)), key
  with open(os.path.join(repro["folder"], "pytest_bug.txt")) as f:
    assert "GoldenMismatchError" in f.read()


def test_unknown_case_is_refused(tmp_path):
  out = subprocess.run(
      [sys.executable, SCRIPT, "--only=no_such_case", f"--workdir={tmp_path}"],
      capture_output=True, text=True, timeout=300)
  assert out.returncode == 2
  assert "error: unknown cases ['no_such_case']" in out.stderr
