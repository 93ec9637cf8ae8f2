"""``peat.validate(..., fuzz=...)`` and ``peat-validate --fuzz``: the shapes
beyond training, with a verdict kept apart from the training verdict.

The campaigns are the smallest GPT (batch 2, context 40, two golden steps,
playback at step 0, no runtime FI). ``softmax_tail64``
(benchmarks/escape/escape_shapes.py) is golden to rounding noise on the
training's rows of 40 and wrong on rows of 64: its training verdict passes
and its fuzz verdict fails; the length family reaches ``len=64`` at its
11th variant (7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64).
"""

import contextlib
import io
import json
import os
import sys

from absl.testing import flagsaver
import pytest

import peat_jax as peat
from peat_jax import models
from peat_jax.profiler import files
from peat_jax.profiler.campaigns import _campaign
from peat_jax.tools import validate as validate_tool

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "benchmarks", "escape"))

SETTINGS = dict(steps=2, checkpoint_every=2, frequencies=(), progress=None)
SOFTMAX = "fwd/Gpt/Block/MultiHeadAttention/attention/softmax:0"
ESCAPE = "py:escape_shapes:softmax_tail64"
#: Length variants up to and with len=192 (the lattice's order: 1, 129,
#: 4097, 65537, 192): the first with len % 128 == 64.
TO_LEN192 = 5


@pytest.fixture(scope="module")
def task():
  return models.get_task("gpt", batch_size=2, context=40)


def _run_tool(argv):
  out, err = io.StringIO(), io.StringIO()
  with flagsaver.flagsaver(), contextlib.redirect_stdout(out), \
      contextlib.redirect_stderr(err):
    validate_tool.FLAGS.unparse_flags()
    validate_tool.FLAGS(["validate"] + argv)
    rc = validate_tool.main(["validate"])
  return rc, out.getvalue(), err.getvalue()


# ------------------------------------------------------------ settings


def test_fuzz_settings_defaults_and_overrides():
  assert _campaign.fuzz_settings(None, "x") is None
  assert _campaign.fuzz_settings(False, "x") is None
  d = _campaign.fuzz_settings(True, "fwd/*")
  assert d == {"budget_cases": _campaign.FUZZ_BUDGET_CASES,
               "budget_seconds": None, "seed": 0, "families": None,
               "select": "fwd/*",
               "capture_budget_bytes": _campaign.FUZZ_CAPTURE_BYTES}
  d = _campaign.fuzz_settings({"budget_seconds": 30, "seed": 3,
                               "families": ("length",), "select": [SOFTMAX],
                               "capture_budget_bytes": 1 << 20}, "fwd/*")
  assert d["budget_cases"] is None and d["budget_seconds"] == 30
  assert d["families"] == ["length"] and d["select"] == [SOFTMAX]
  assert d["seed"] == 3 and d["capture_budget_bytes"] == 1 << 20


@pytest.mark.parametrize("fuzz, words", [
    ("yes", "fuzz must be None, True, False or a dict"),
    ({"budget": 3}, r"unknown fuzz settings \['budget'\]"),
    ({"budget_cases": 0}, "'budget_cases' must be a positive integer"),
    ({"budget_cases": 2.5}, "'budget_cases' must be a positive integer"),
    ({"budget_seconds": -1}, "'budget_seconds' must be a positive number"),
    ({"seed": "0"}, "'seed' must be an integer"),
    ({"families": "length"}, "'families' must be a list"),
    ({"families": []}, "'families' must be a list"),
    ({"families": ["lengths"]}, r"unknown families \['lengths'\]"),
    ({"select": 3}, "'select' must be an fnmatch pattern"),
])
def test_bad_fuzz_settings_are_refused_before_any_work(task, tmp_path, fuzz,
                                                       words):
  with pytest.raises(peat.PeatError, match=words):
    peat.validate(task, "native:softmax:default", tmp_path / "c",
                  fuzz=fuzz, **SETTINGS)
  assert not (tmp_path / "c").exists()


def test_tool_refuses_a_bad_fuzz_budget_with_status_2(tmp_path):
  for argv, words in (
      (["--fuzz", "--fuzz_budget=abc"], "--fuzz_budget must be a positive "
       "number of variants (e.g. 40) or of seconds (e.g. 120s); got 'abc'"),
      (["--fuzz", "--fuzz_budget=0s"], "--fuzz_budget must be a positive"),
      (["--fuzz", "--fuzz_families=length,lanes"],
       "--fuzz_families: unknown families ['lanes']"),
      (["--fuzz_seed=3"], "--fuzz_seed set how the shapes beyond training "
       "are fuzzed; add --fuzz")):
    rc, out, err = _run_tool([f"--campaign_dir={tmp_path / 'c'}"] + argv)
    assert rc == 2, (argv, out, err)
    assert err.startswith("error: ") and words in err, (argv, err)
  assert not (tmp_path / "c").exists()


# ------------------------------------------------------------ campaigns


@pytest.mark.slow
def test_correct_kut_passes_both_verdicts(task, tmp_path):
  paths = peat.validate(task, "native:softmax:default", tmp_path,
                        fuzz={"budget_cases": 6}, **SETTINGS)
  assert paths.verdict == "pass" and paths.fuzz_verdict == "pass"
  fuzz = [r for r in files.read_records(tmp_path / files.FUZZ_FILE)
          if r["kind"] == "site"]
  assert len(fuzz) == 6
  assert {r["source"] for r in fuzz} == {"fuzz"}
  assert {r["kut"] for r in fuzz} == {"native:softmax:default"}
  # The two softmax sites (no select) make the same call: the second's
  # variants come after every one of the first's, which covers every
  # family first.
  assert {r["site"] for r in fuzz} == {SOFTMAX}
  assert [r["variant"] for r in fuzz][:3] == ["batch=1", "rows1=1", "len=1"]
  assert {r["family"] for r in fuzz} == {"batch", "rows", "length", "joint",
                                         "tail", "mask"}
  res = peat.read_campaign(tmp_path)
  assert res.verdict.verdict == "pass"
  assert res.fuzz_verdict.verdict == "pass"
  assert res.fuzz_verdict.first_failure is None
  assert len(res.fuzz) == 6 and res.fuzz_findings == ()
  assert res.fuzz[0].shapes == ((1, 4, 40, 40),)
  data = json.loads(open(paths.json).read())
  assert data["fuzz"]["verdict"] == "pass"
  assert len(data["fuzz"]["variants"]) == 6
  assert '<section id="fuzz"><h2>Shapes beyond training</h2>' in open(
      paths.html).read()


@pytest.fixture(scope="module")
def escape_campaign(task, tmp_path_factory):
  d = tmp_path_factory.mktemp("fuzz") / "escape"
  spec = peat.kernels.parse_kut(ESCAPE, "softmax")
  lines = []
  paths = peat.validate(
      task, spec, d, select="fwd/*/softmax:0",
      fuzz={"budget_cases": TO_LEN192, "families": ["length"]},
      **dict(SETTINGS, progress=lines.append))
  return d, paths, lines


@pytest.mark.slow
def test_escape_fails_beyond_training_only(escape_campaign):
  d, paths, lines = escape_campaign
  assert paths.verdict == "pass"  # the training's rows of 40
  assert paths.fuzz_verdict == "fail"  # rows of 192, shrunk to one of 64
  assert any(line.startswith("[4/5] shapes beyond training: capture the "
                             "forward softmax sites at step 0")
             for line in lines)
  assert "[5/5] verdict and report" in lines
  records = [r for r in files.read_records(d / files.FUZZ_FILE)
             if r["kind"] == "site"]
  small = "min:len=192:len=64,rows2=1,rows1=1,batch=1"
  assert [r["variant"] for r in records] == [
      f"len={n}" for n in (1, 129, 4097, 65537, 192)] + [small]
  assert {r["site"] for r in records} == {SOFTMAX}
  by = {r["variant"]: r["diagnosis"] for r in records}
  assert by["len=192"]["verdict"] == by[small]["verdict"] == "fail"
  assert all(v["verdict"] == "pass" for k, v in by.items()
             if k not in ("len=192", small))
  assert records[-1]["shrunk_from"] == "len=192"
  assert records[-1]["shapes"] == [[1, 1, 1, 64]]
  assert records[-1]["original_shapes"] == [[2, 4, 40, 192]]
  # The training verdict is the one of the playback records alone.
  res = peat.read_campaign(d)
  assert res.verdict.verdict == "pass"
  assert {r.verdict for r in res.playback} == {"pass"}
  assert res.fuzz_verdict.verdict == "fail"
  assert set(res.fuzz_verdict.deciding) == {(SOFTMAX, "len=192"),
                                            (SOFTMAX, small)}
  first = res.fuzz_verdict.first_failure
  assert first["variant"] in ("len=192", small)
  assert first["family"] == "length"
  assert by[small]["model"] == "scale"  # one row: its sum counted twice


@pytest.mark.slow
def test_report_and_rebuild_carry_the_section(escape_campaign):
  d, paths, _ = escape_campaign
  data = json.loads(open(paths.json).read())
  assert data["verdict"]["verdict"] == "pass"
  assert data["fuzz"]["verdict"] == "fail"
  assert data["fuzz"]["first_failure"]["variant"].endswith("len=192") or (
      "len=192" in data["fuzz"]["first_failure"]["variant"])
  page = open(paths.html).read()
  section = page[page.index('<section id="fuzz">'):]
  section = section[:section.index("</section>")]
  assert "covers the training&#x27;s shapes only" in section
  assert "len=192</code>" in section
  assert '<div class="badge v-pass">PASS</div>' in page
  rebuilt = peat.rebuild_report(d)
  assert (rebuilt.verdict, rebuilt.fuzz_verdict) == ("pass", "fail")
  assert rebuilt.data["fuzz"]["variants"] == data["fuzz"]["variants"]


@pytest.mark.slow
def test_tool_prints_the_fuzz_verdict_and_exits_on_it(escape_campaign):
  d, _, _ = escape_campaign
  argv = [f"--campaign_dir={d}", f"--kut={ESCAPE}", "--kernel=softmax",
          "--scenario=gpt", "--batch_size=2", '--overrides={"context": 40}',
          "--steps=2", "--checkpoint_every=2", "--frequencies=",
          "--select=fwd/*/softmax:0", "--fuzz", "--fuzz_budget=1",
          "--fuzz_families=length"]
  rc, out, err = _run_tool(argv)
  assert rc == 1, err
  lines = out.splitlines()
  i = lines.index("verdict: pass")
  assert lines[i + 1] == "fuzz verdict: fail"
  assert "fuzz verdict fail reaches --fail_on=fail: exit status 1" in err
  assert "playback step 0: done before, skipped" in out
  # One more variant (the budget counts this call's), the next length;
  # the site's failure is shrunk already.
  records = [r for r in files.read_records(d / files.FUZZ_FILE)
             if r["kind"] == "site"]
  assert [r["variant"] for r in records][-1] == "len=1025"
  rc, out, err = _run_tool(argv[:-3] + ["--fail_on=never"])
  assert rc == 0 and "fuzz verdict: fail" in out, err
