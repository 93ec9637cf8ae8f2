"""A campaign written before the component packages still reads and resumes.

tests/profiler/old_campaign/campaign_7e3e18d/ was written by peat_jax at
commit 7e3e18d (the flat layout) with ``old_campaign/make.py``: a whole
validate campaign of ``native:matmul:in_bf16`` on a tiny task (Orbax
checkpoints, playback and runtime records, settings, report).
"""

import importlib.util
import json
import os
import shutil

import peat_jax as peat

HERE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "old_campaign")
FIXTURE = os.path.join(HERE, "campaign_7e3e18d")
_spec = importlib.util.spec_from_file_location(
    "peat_old_campaign_tiny", os.path.join(HERE, "tiny.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


def _copy(tmp_path):
  d = tmp_path / "campaign"
  shutil.copytree(FIXTURE, d)
  return d


def test_old_records_checkpoints_and_report_read(tmp_path):
  d = _copy(tmp_path)
  old = json.loads((d / "report.json").read_text())
  recs = peat.profiler.read_records(d / peat.profiler.PLAYBACK_FILE)
  sites = [r for r in recs if r["kind"] == "site"]
  assert {r["step"] for r in sites} == {0, 2, 4}
  assert len([r for r in recs if r["kind"] == "effect"]) == 3
  assert {r["name"] for r in peat.profiler.read_records(
      d / peat.profiler.RUNTIME_FILE)} == {"golden", "spread", "every"}
  task = tiny.get_task()
  ckpt = d / "golden" / "checkpoints"
  assert peat.saved_steps(ckpt) == [0, 2, 4, 6]
  for step in (0, 2, 4, 6):  # the SHA-256 fingerprint is checked
    assert int(peat.restore_state(ckpt, task, step).step) == step
  rebuilt = peat.rebuild_report(d)
  assert rebuilt.verdict == old["verdict"]["verdict"] == "warn"
  keep = ("site", "model", "verdict", "steps", "noise_ratio", "ulp_hist")
  assert ([{k: s[k] for k in keep} for s in rebuilt.data["sites"]]
          == [{k: s[k] for k in keep} for s in old["sites"]])
  assert rebuilt.data["playback"] == old["playback"]


def test_old_campaign_resumes_with_nothing_left_to_do(tmp_path):
  d = _copy(tmp_path)
  before = {f: (d / f).read_bytes() for f in (peat.profiler.PLAYBACK_FILE,
                                              peat.profiler.RUNTIME_FILE)}
  lines = []
  paths = peat.validate(tiny.get_task(), tiny.KUT, d,
                        **{**tiny.SETTINGS, "progress": lines.append})
  assert paths.verdict == "warn"
  assert sum("done before, skipped" in line for line in lines) == 3
  assert not any(line.startswith("runtime every call:") for line in lines)
  for f, data in before.items():  # nothing was recomputed or appended
    assert (d / f).read_bytes() == data, f
