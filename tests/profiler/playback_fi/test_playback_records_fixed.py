"""Playback records stay what they were before playback was made faster
(issue 22).

The fixture (tests/profiler/playback_fi/records_fixture: ``make.py`` run with peat_jax
at main 3ff0694;
``gpt_backward_kut`` at ea885b3, whose attention backward pairing fix,
1883063, changed those records; it and ``cnn_conv2d`` again at d94508b:
eb10a7c gives rows that cancel whole a scale, which made the envelope of
some records finite where it was NaN; all four again for issue 34's
triage: every record says which path decided it (``decided_by``),
records the screen clears keep the Signature without its decomposition
(``decomposed`` false) and a ``screen`` field, and a site's port probe is
carried to its later records (``port.carried_from``, ``port.tried`` the
carried hypothesis), which are not decomposed where it explains them by
rounded inputs (their decomposition fields neutral but the screen's); the
diagnoses, verdicts, ports' magnitudes and every other field are those of
before, docs/playback_cost.md; all four again when a primitive site's probe
moved to the device: a first checkpoint's records that rounded inputs
explain are not decomposed either, the rest as before; all four again
for the Detector as hypotheses: new Signature and port fields, every
diagnosis and verdict as before) holds the ``playback.msgpack`` of small campaigns on the
real CNN and a small GPT (``cases.py``): forward sites of a native conv2d
and matmul KUT, composite sites (host references) and three KUTs played
together, and the KUT's VJP at the backward sites. Each test makes the same
golden run and playback with today's peat_jax and compares the records as
two machines' records can be compared (``peat.testing.assert_records_close``:
exact on structure, names, models, verdicts and element counts, within
stated tolerances on the float statistics that another processor's
rounding of golden moves). On one machine the records are bitwise
reproducible: ``make.py --out=DIR`` at two commits and ``cmp`` compares
them byte for byte (how refactors are checked, docs/playback_cost.md).
"""

import importlib.util
import os

import pytest

import peat_jax as peat
from peat_jax import models

HERE = os.path.join(os.path.dirname(__file__), "records_fixture")
_spec = importlib.util.spec_from_file_location(
    "peat_records_fixture_cases", os.path.join(HERE, "cases.py"))
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)


def _check(name, tmp_path):
  expected = peat.profiler.read_records(os.path.join(HERE, f"{name}.msgpack"))
  path = cases.run(peat, models, name, str(tmp_path))
  peat.testing.assert_records_close(expected, peat.profiler.read_records(path))


@pytest.mark.slow
def test_cnn_conv2d_records_are_those_of_before(tmp_path):
  _check("cnn_conv2d", tmp_path)


@pytest.mark.slow
def test_gpt_matmul_records_are_those_of_before(tmp_path):
  _check("gpt_matmul", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_many", "gpt_backward_kut"])
def test_more_gpt_records_are_those_of_before(name, tmp_path):
  _check(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_matmul", "cnn_conv2d", "gpt_many"])
def test_a_stored_golden_step_keeps_every_diagnosis(name, tmp_path):
  """Playing the KUT's step alone against the golden run's stored step
  (the default) keeps the records' meaning: the same records, sites and
  diagnoses as replaying the golden step; the first site's inputs are
  the checkpoint's own, so its signature is bitwise the same; the effect
  record's golden loss is the golden run's own (its log)."""
  expected = peat.profiler.read_records(os.path.join(HERE, f"{name}.msgpack"))
  path = cases.run(peat, models, name, str(tmp_path), replay_golden_step=False)
  got = peat.profiler.read_records(path)
  key = lambda r: (r["kind"], r["kut"], r["step"], r.get("site"))
  assert [key(r) for r in got] == [key(r) for r in expected]
  log = peat.profiler.read_log(tmp_path / "golden")
  first = {}
  for g, e in zip(got, expected):
    if g["kind"] == "effect":
      assert g["golden_step"] == "stored"
      assert g["loss_golden"] == float(
          log["loss"][list(log["step"]).index(g["step"] + 1)])
      assert g["loss_golden"] == e["loss_golden"]
      continue
    assert g["diagnosis"]["model"] == e["diagnosis"]["model"], key(g)
    assert g["diagnosis"]["verdict"] == e["diagnosis"]["verdict"], key(g)
    first.setdefault((g["kut"], g["step"]), (g, e))
  for g, e in first.values():
    assert g["signature"] == e["signature"], key(g)
