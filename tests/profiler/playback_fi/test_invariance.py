"""Invariance checks in playback (``invariance=True``).

Fast tests play a tiny dense task (tests/profiler/old_campaign/tiny.py)
with the escape suite's C++ matmuls (benchmarks/escape/escape_kernels.cc,
``escape_lib`` fixture) through ``ffi:``; slow ones play the GPT with the
escape attention kernels (backward sites) and the late fp16 softmax.
"""

import importlib.util
import json
import os

import pytest

import peat_jax as peat
from peat_jax import models

HERE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "old_campaign")
_spec = importlib.util.spec_from_file_location(
    "peat_old_campaign_tiny_inv", os.path.join(HERE, "tiny.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

DENSE = tiny.get_task()  # fwd/dot_general:0 is x [16, 32] @ w [32, 10]
SITE = "fwd/dot_general:0"


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
  d = tmp_path_factory.mktemp("inv")
  return peat.golden_train(DENSE, str(d / "golden"), steps=4,
                           checkpoint_every=2, seed=0).workdir


def _ffi(lib, fwd, bwd="EscMatmulBwd"):
  return peat.kernels.parse_kut(f"ffi:{lib}:{fwd}:{bwd}",
                                kernel="dot_general")


def _forward(records):
  return [r for r in records if r["site"] == SITE]


ESCAPES = [  # (forward symbol, backward symbol, model, verdict)
    ("EscMatmulCached", "EscMatmulBwd", "stale", "fail"),
    ("EscMatmulZeroInput", "EscMatmulBwd", "input_mutation", "fail"),
    ("EscMatmulSubsample", "EscMatmulSubsampleBwd", "input_insensitive",
     "fail"),
    ("EscMatmulBatchSplit", "EscMatmulBwd", "batch_variance", "warn"),
]


@pytest.fixture(scope="module")
def played(escape_lib, golden, tmp_path_factory):
  """The escape matmuls played back with invariance checks: together, but
  for the one that writes into its inputs (inside one jitted call it would
  zero the others' inputs too)."""
  specs = {f: _ffi(escape_lib, f, b) for f, b, _, _ in ESCAPES}
  apart = "EscMatmulZeroInput"
  out = peat.playback_many(
      DENSE, golden, [s for f, s in specs.items() if f != apart],
      campaign_dir=tmp_path_factory.mktemp("many"), invariance=True)
  out[specs[apart].spec] = peat.playback(
      DENSE, golden, specs[apart], invariance=True,
      campaign_dir=tmp_path_factory.mktemp("apart"))
  return {f: out[s.spec] for f, s in specs.items()}


@pytest.mark.parametrize("fwd,bwd,model,verdict", ESCAPES)
def test_playback_names_the_invariance_model(played, fwd, bwd, model,
                                             verdict):
  del bwd
  pb = played[fwd]
  recs = _forward(pb.records)
  assert [r["step"] for r in recs] == [0, 2]
  for r in recs:
    assert r["diagnosis"]["model"] == model, r["diagnosis"]["evidence"]
    assert r["diagnosis"]["verdict"] == verdict
    assert r["invariance"]["outputs"]  # the facts are kept with the record
  if verdict == "fail":  # localization follows failing records
    assert pb.localization["site"] == SITE


def test_checks_leave_a_correct_kernels_records_alone(escape_lib, golden,
                                                      tmp_path):
  spec = _ffi(escape_lib, "EscMatmul")
  plain = peat.playback(DENSE, golden, spec, campaign_dir=tmp_path / "a")
  checked = peat.playback(DENSE, golden, spec, campaign_dir=tmp_path / "b",
                          invariance=True)
  assert len(plain.records) == len(checked.records)
  for a, b in zip(plain.records, checked.records):
    inv = b.pop("invariance")
    assert a == b  # same signature, same diagnosis
    out = inv["outputs"][0]
    assert inv["mutation"] == [] and out["repeat"]["changed"] == 0
    assert out["batch"]["alone"]["differ"] == 0


def test_without_invariance_records_have_no_facts(escape_lib, golden,
                                                  tmp_path):
  pb = peat.playback(DENSE, golden, _ffi(escape_lib, "EscMatmulCached"),
                     campaign_dir=tmp_path)
  assert all("invariance" not in r for r in pb.records)


def test_validate_keeps_the_setting(escape_lib, golden, tmp_path):
  spec = _ffi(escape_lib, "EscMatmulZeroInput")
  paths = peat.validate(DENSE, spec, tmp_path, steps=4, checkpoint_every=2,
                        frequencies=(), invariance=True, progress=None)
  assert paths.verdict == "fail"
  with open(os.path.join(tmp_path, peat.profiler.SETTINGS_FILE)) as f:
    assert json.load(f)["invariance"] is True
  res = peat.read_campaign(tmp_path)
  assert {r.model for r in res.playback if r.site == SITE} == {
      "input_mutation"}
  with pytest.raises(peat.PeatError, match="invariance"):
    peat.validate(DENSE, spec, tmp_path, steps=4, checkpoint_every=2,
                  frequencies=(), progress=None)


@pytest.fixture(scope="module")
def gpt_golden(tmp_path_factory):
  task = models.get_task("gpt", batch_size=2, context=40)
  d = tmp_path_factory.mktemp("gpt_inv")
  return task, peat.golden_train(task, str(d / "golden"), steps=10,
                                 checkpoint_every=10).workdir


@pytest.mark.slow
def test_unwritten_dq_tail_is_stale_with_the_forward_output(
    escape_lib, gpt_golden, tmp_path):
  task, golden = gpt_golden
  spec = peat.kernels.parse_kut(
      f"ffi:{escape_lib}:EscAttentionWs:EscAttentionBwdTail",
      kernel="attention")
  pb = peat.playback(task, golden, spec, campaign_dir=tmp_path,
                     backward="kut", invariance=True)
  by = {r["site"]: r["diagnosis"] for r in pb.records}
  for layer in (0, 1):
    site = f"bwd/Gpt/Block/MultiHeadAttention/attention:{layer}"
    dq = by[f"{site}/d0"]
    assert dq["model"] == "stale" and dq["verdict"] == "fail"
    # T = 40: the tail tile holds rows 32-39 of every (batch, head).
    assert "64 of 320 output rows" in dq["evidence"]
    assert "fwd/Gpt/Block/MultiHeadAttention/attention:" in dq["evidence"]
    for k in (1, 2):  # dK and dV are exact
      assert by[f"{site}/d{k}"]["verdict"] == "pass"
  for layer in (0, 1):  # so is the forward
    assert by[f"fwd/Gpt/Block/MultiHeadAttention/attention:{layer}"][
        "verdict"] == "pass"


@pytest.mark.slow
def test_late_fp16_overflow_fails_only_once_scores_grow(escape_lib, tmp_path):
  task = models.get_task("gpt", batch_size=2, context=40)
  golden = peat.golden_train(task, str(tmp_path / "golden"), steps=150,
                             checkpoint_every=50).workdir
  spec = peat.kernels.parse_kut(f"ffi:{escape_lib}:EscSoftmaxF16:EscSoftmaxBwd",
                                kernel="softmax")
  pb = peat.playback(task, golden, spec, campaign_dir=tmp_path,
                     invariance=True)
  worst = {}
  for r in pb.records:
    worst.setdefault(r["step"], set()).add(r["diagnosis"]["verdict"])
  assert "fail" not in worst[0] | worst[50]
  assert "fail" in worst[100]
  assert {r["diagnosis"]["model"] for r in pb.records
          if r["step"] == 100 and r["diagnosis"]["verdict"] == "fail"} == {
              "nan"}
