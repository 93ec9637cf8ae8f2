"""benchmarks/bench_fuzz.py on a small budget: it runs and writes its table.

Slow: a GPT profile with captures, a golden step timed, op-level playback
and a fuzz of three variants of each site of one correct KUT.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                      "bench_fuzz.py")


@pytest.mark.slow
def test_bench_fuzz_writes_the_table(tmp_path):
  out = subprocess.run(
      [sys.executable, SCRIPT, f"--workdir={tmp_path / 'w'}",
       f"--out={tmp_path / 'out'}", "--kuts=native:softmax:default",
       "--budget=3"], capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  with open(tmp_path / "out" / "bench_fuzz_gpt.json") as f:
    data = json.load(f)
  (row,) = data["rows"]
  assert row["kut"] == "native:softmax:default" and row["sites"] >= 1
  assert row["variants"] == 3 and row["verdict"] == "pass"
  assert row["fuzz_s"] > 0 and data["step_s"] > 0
  assert len(data["detail"]["native:softmax:default"]) == 3
  text = (tmp_path / "out" / "bench_fuzz_gpt.txt").read_text()
  assert "| `native:softmax:default` |" in text and "golden train step" in text
