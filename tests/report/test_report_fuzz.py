"""The report's "Shapes beyond training" section (peat_jax/report/_shapes.py).

Fuzz records (``fuzz.msgpack``, ``peat.fuzz``) get a verdict of their own,
kept apart from the training verdict; the data, the JSON file, the HTML
page, the plain-text summary and the schema check all carry it. Fast: the
records are made up in the stored format, no KUT runs.
"""

import copy
import json

import pytest

from peat_jax import report
from peat_jax.core import PeatError
from peat_jax.profiler.fuzz import _fuzz
from peat_jax.report import _shapes

SITE = "fwd/Gpt/Block/MultiHeadAttention/attention/softmax:0"
OTHER = "fwd/Gpt/Block/MultiHeadAttention/attention/softmax:1"
KUT = "py:escape_shapes:softmax_tail64@softmax"


def _record(variant, family, n, model="exact", verdict="pass", ratio=1.0,
            site=SITE, seed=0, conf=1.0):
  return {"kind": "site", "source": "fuzz", "site": site, "kut": KUT,
          "kernel": "softmax", "phase": "fwd", "step": 0, "seed": seed,
          "variant": variant, "family": family,
          "shapes": [[2, 4, 40, n]], "golden_from": "site",
          "signature": {"noise_ratio": ratio},
          "diagnosis": {"model": model, "confidence": conf,
                        "evidence": f"{model} at {variant}",
                        "verdict": verdict}}


def _finding(variant, family, site=SITE, seed=0):
  return {"kind": "fuzz_error", "site": site, "variant": variant,
          "family": family, "step": 0, "seed": seed, "kut": KUT,
          "error": "the KUT raised ValueError: bad length"}


PASSING = [_record("len=7", "length", 7, "reordering", ratio=0.99,
                   conf=0.95),
           _record("len=8", "length", 8),
           _record("batch=1", "batch", 40, site=OTHER)]
FAILING = PASSING + [
    _record("len=63", "length", 63, "reordering", "warn", 3.0, conf=0.5),
    _record("len=64", "length", 64, "scale", "fail", 8.4e6, conf=0.97),
    _record("len=65", "length", 65, "scale", "fail", 7e6, conf=0.9)]


def test_no_fuzz_record_is_no_section():
  assert _shapes.fuzz_data([]) is None
  assert _shapes.fuzz_data([{"kind": "effect", "step": 0}]) is None


def test_passing_variants():
  fz = _shapes.fuzz_data(PASSING)
  assert fz["verdict"] == "pass" and fz["first_failure"] is None
  assert fz["sites"] == [SITE, OTHER]
  assert fz["families"] == ["length", "batch"]
  assert fz["counts"] == {"pass": 3, "warn": 0, "fail": 0, "variants": 3,
                          "findings": 0}
  v = fz["variants"][0]
  assert (v["variant"], v["family"], v["shapes"], v["model"], v["verdict"],
          v["noise_ratio"]) == ("len=7", "length", [[2, 4, 40, 7]],
                                "reordering", "pass", 0.99)
  assert "training's shapes only" in fz["scope"]


def test_first_failing_variant_is_the_first_in_run_order():
  fz = _shapes.fuzz_data(FAILING)
  assert fz["verdict"] == "fail"
  assert fz["first_failure"]["variant"] == "len=64"
  assert fz["first_failure"]["model"] == "scale"
  assert {tuple(k) for k in fz["deciding"]} == {(SITE, "len=64"),
                                                (SITE, "len=65")}
  assert fz["counts"]["warn"] == 1 and fz["counts"]["fail"] == 2


def test_a_finding_fails_and_comes_first():
  entries = PASSING[:1] + [_finding("len=4097", "length")] + PASSING[1:]
  fz = _shapes.fuzz_data(entries)
  assert fz["verdict"] == "fail"
  assert fz["summary"].startswith("fail: the KUT failed on 1 variant (first:"
                                  f" {SITE} len=4097: the KUT raised")
  assert fz["first_failure"]["variant"] == "len=4097"
  assert fz["first_failure"]["error"].startswith("the KUT raised")
  assert fz["findings"] == [{"site": SITE, "variant": "len=4097",
                             "family": "length", "step": 0, "seed": 0,
                             "error": entries[1]["error"]}]
  assert len(fz["variants"]) == 3


@pytest.mark.parametrize("entries", [PASSING, FAILING,
                                     FAILING + [_finding("len=9", "length")],
                                     [_finding("len=9", "length")]])
def test_same_verdict_and_summary_as_peat_fuzz(entries):
  records = [e for e in entries if e["kind"] == "site"]
  errors = [e for e in entries if e["kind"] == "fuzz_error"]
  v, summary = _fuzz.verdict_of(records, errors)
  fz = _shapes.fuzz_data(entries)
  assert (fz["verdict"], fz["summary"]) == (v.verdict, summary)
  assert [tuple(k) for k in fz["deciding"]] == list(v.deciding)


def test_several_seeds_keep_every_record():
  entries = [_record("len=64", "length", 64, seed=0),
             _record("len=64", "length", 64, "scale", "fail", 8e6, seed=1)]
  fz = _shapes.fuzz_data(entries)
  assert fz["verdict"] == "fail"
  assert fz["deciding"] == [[SITE, "len=64 (seed 1)"]]
  assert "2 records" in fz["summary"]


@pytest.fixture()
def fuzzed(report_campaign_data):
  data = copy.deepcopy(report_campaign_data)
  data["fuzz"] = _shapes.fuzz_data(FAILING + [_finding("len=9", "length")])
  return data


def test_json_and_html_carry_the_section(fuzzed, tmp_path):
  paths = report.write_report(fuzzed, tmp_path)
  got = json.loads(paths.json.read_text())
  assert got["verdict"] == json.loads(json.dumps(fuzzed["verdict"]))
  assert got["fuzz"]["verdict"] == "fail"
  assert got["fuzz"]["first_failure"]["variant"] == "len=64"
  assert [v["variant"] for v in got["fuzz"]["variants"]] == [
      "len=7", "len=8", "batch=1", "len=63", "len=64", "len=65"]
  page = paths.html.read_text()
  assert '<section id="fuzz"><h2>Shapes beyond training</h2>' in page
  section = page[page.index('<section id="fuzz">'):]
  section = section[:section.index("</section>")]
  assert "covers the training&#x27;s shapes only" in section
  assert "First failing variant" in section
  assert f"{SITE} len=64 (length), shapes [2, 4, 40, 64]: scale" in section
  assert "Findings" in section and "the KUT raised ValueError" in section
  for v in ("len=63", "len=64", "batch=1"):
    assert f"<code>{v}</code>" in section
  assert f"<code>{SITE}</code> (5 variants)" in section
  assert f"<code>{OTHER}</code> (1 variant)" in section
  # The training verdict's badge is the training verdict's, with a
  # pointer to the separate one.
  badge = fuzzed["verdict"]["verdict"]
  assert f'<div class="badge v-{badge}">{badge.upper()}</div>' in page
  assert 'Shapes beyond training (fuzz): <span class="chip v-fail">' in page


def test_without_fuzz_records_a_note(report_campaign_data, tmp_path):
  data = copy.deepcopy(report_campaign_data)
  data.pop("fuzz", None)
  page = report.write_report(data, tmp_path).html.read_text()
  assert '<section id="fuzz"><h2>Shapes beyond training</h2>' in page
  assert "No fuzz records" in page
  assert 'href="#fuzz"' not in page


def test_summary_table_keeps_the_verdicts_apart(fuzzed):
  fuzzed["runtime"] = None  # numpy arrays there; the summary reads JSON data
  text = report.summary_table(fuzzed)
  first = text.splitlines()[0]
  assert first.endswith(fuzzed["verdict"]["verdict"].upper())
  assert ("shapes beyond training (fuzz, kept apart from the verdict "
          "above): FAIL, 6 variants, 1 finding") in text
  assert (f"first failing variant: {SITE} len=64 (length), shapes "
          "[2, 4, 40, 64]: scale (noise ratio 8.4e+06): scale at len=64"
          ) in text


def test_report_data_keeps_the_training_verdict():
  records = [dict(r, kind="site", step=0, reduction=40) for r in PASSING[:1]]
  for r in records:
    r.pop("source")
    r["signature"] = dict(_signature(), noise_ratio=0.99)
  plain = report.report_data(kut=KUT, scenario="gpt", records=records,
                             sites=[SITE])
  with_fuzz = report.report_data(kut=KUT, scenario="gpt", records=records,
                                 sites=[SITE], fuzz=FAILING)
  assert plain["fuzz"] is None
  assert with_fuzz["verdict"] == plain["verdict"]
  assert with_fuzz["verdict"]["verdict"] == "pass"
  assert with_fuzz["fuzz"]["verdict"] == "fail"


def _signature() -> dict:
  """The stored signature fields the site table reads."""
  return {"dtype_code": 0, "bits_xor": [0] * 32, "ulp_hist": [1] + [0] * 40,
          "share_differ": 0.0, "rel_rms": 0.0, "abs_max": 0.0,
          "abs_rms": 0.0, "golden_rms": 1.0, "golden_absmax": 1.0,
          "rel_mean": 0.0, "rel_max": 0.0, "n": 10}


@pytest.mark.parametrize("path, value, words", [
    (("verdict",), "great", "fuzz['verdict']"),
    (("summary",), 3, "fuzz.'summary'"),
    (("variants",), None, "fuzz.'variants' is missing"),
    (("variants", 0, "verdict"), "maybe", "fuzz.variants[0].'verdict'"),
    (("variants", 0, "variant"), None, "fuzz.variants[0].'variant'"),
    (("findings", 0, "error"), None, "fuzz.findings[0].'error'"),
    (("deciding",), [["only one"]], "fuzz.deciding[0]"),
    (("first_failure",), {"site": SITE}, "fuzz.first_failure.'variant'"),
])
def test_schema_names_the_bad_key(fuzzed, tmp_path, path, value, words):
  fz = fuzzed["fuzz"]
  *head, last = path
  for k in head:
    fz = fz[k]
  fz[last] = value
  with pytest.raises(PeatError, match=words.replace("[", r"\[").replace(
      "]", r"\]").replace("(", r"\(")):
    report.write_report(fuzzed, tmp_path)
  assert not (tmp_path / "report.json").exists()
