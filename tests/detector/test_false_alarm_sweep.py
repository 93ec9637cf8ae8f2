"""The in-training false-alarm sweep (benchmarks/false_alarm_sweep.py).

Slow: a short golden run and one playback per reordering-only native
variant of the scenario's kernels.
"""

import os
import re
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                      "false_alarm_sweep.py")


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["cnn", "gpt"])
def test_reordering_variants_raise_no_alarm_in_playback(scenario, tmp_path):
  out = subprocess.run(
      [sys.executable, SCRIPT, f"--scenarios={scenario}",
       f"--workdir={tmp_path}", "--steps=40", "--checkpoint_every=20"],
      capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = out.stdout.strip().splitlines()[-1]
  m = re.match(r"(\d+) records: (.*); false alarms 0; \d+ s$", summary)
  assert m, summary
  assert int(m.group(1)) > 0
  # Every record is exact or reordering.
  models = re.findall(r"(\w[\w:]*) (?:pass|warn|fail) x\d+", m.group(2))
  assert set(models) <= {"exact", "reordering"}, summary
  # The triage screen decides these KUTs' records (issue 34).
  paths = out.stdout.strip().splitlines()[-2]
  screened = re.search(r"screen x(\d+)", paths)
  assert screened and int(screened.group(1)) > 0, paths
