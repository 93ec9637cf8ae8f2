"""The report's training-level parts: noise ratio over training,
significance of runtime FI, provenance (report/_training.py, _sections.py).

The data is tests/report/test_report.py's (real computations: a numpy SGD
run, its seed run and its bf16 proxy give the significance)."""

import json
import re

import numpy as np
import pytest

from peat_jax import detector
from peat_jax import report
from peat_jax.report import write_report


@pytest.fixture(scope="module")
def data(report_campaign_data):
  return report_campaign_data


def _section(page: str, name: str) -> str:
  start = page.index(f'<section id="{name}">')
  return page[start:page.index("</section>", start)]


def test_significance_is_measured_not_made_up(data):
  every, fourth = (r["significance"] for r in data["runtime"][:2])
  # The KUT at every step moves the weights more than at every 4th step,
  # and both less than a seed change (another initialisation).
  assert every["vs_bf16"] > fourth["vs_bf16"] > 0
  assert 0 < every["vs_seed"] < 1
  t = every["total"]
  assert t["vs_bf16"]["w1"][-1] == pytest.approx(
      t["distance"]["w1"][-1] / t["bf16"]["w1"][-1])
  assert "significance" not in data["runtime"][2]  # the diverged run


def test_significance_section(data, tmp_path):
  page = write_report(data, tmp_path).html.read_text(encoding="utf-8")
  sec = _section(page, "significance")
  for r in data["runtime"][:2]:
    assert (f"{r['frequency']}: the KUT "
            + report.significance_sentence(r["significance"])) in sec
  assert "Weight distance / bf16 proxy distance" in sec
  assert "Weight distance / seed-to-seed distance" in sec
  assert "Per layer: W1 / bf16 proxy W1" in sec
  assert len(re.findall(r"<svg", sec)) == 5
  assert "<h3>Per layer, every call, step 60</h3>" in sec


def test_a_rising_site_is_named(data, tmp_path):
  d = dict(data)
  rising = dict(d["sites"][0])
  rising["noise_ratio"] = np.array([0.5 * 3 ** (s / 10)
                                    for s in rising["steps"]])
  rising["noise_trend"] = detector.noise_trend(rising["steps"],
                                               rising["noise_ratio"])
  d["sites"] = [rising] + list(d["sites"][1:])
  paths = write_report(d, tmp_path)
  page = paths.html.read_text(encoding="utf-8")
  sec = _section(page, "trends")
  assert "Rising over training" in sec
  assert ("fwd/Dense_0/dot_general:0: noise ratio rises 2.4e+02x from step "
          "0 to step 50") in sec
  text = report.summary_table(dict(json.loads(paths.json.read_text()),
                                   runtime=None))
  assert "rising: fwd/Dense_0/dot_general:0: noise ratio rises" in text
  flat = write_report(data, tmp_path / "flat").html.read_text()
  assert "No site&#x27;s noise ratio rises over training." in flat


def test_provenance_section_and_covers_line(data, tmp_path):
  page = write_report(data, tmp_path).html.read_text(encoding="utf-8")
  sec = _section(page, "provenance")
  assert "A pass covers exactly this and nothing else" in sec
  assert "float32[64,96] float32[96,48]" in sec
  assert "--xla_cpu_enable_fast_math=false" in sec
  verdict = _section(page, "verdict")
  assert 'class="covers"' in verdict and 'href="#provenance"' in verdict
  lines = report.provenance_lines(data["provenance"])
  assert lines[0].startswith("KUT native:matmul:in_bf16 (source native; "
                             "_peat_kernels_cpu.so sha256 abab")
  assert lines[-1] == report.covers_sentence(data["provenance"])


@pytest.mark.parametrize("key,note", [
    ("provenance", "No provenance in the data."),
    ("runtime", "No weight distance in the data")])
def test_missing_training_sections_have_notes(data, tmp_path, key, note):
  d = dict(data, **{key: None})
  page = write_report(d, tmp_path).html.read_text(encoding="utf-8")
  assert note in page
