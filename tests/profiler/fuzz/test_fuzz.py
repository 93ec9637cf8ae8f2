"""peat.fuzz and peat.export_repro on real captured site inputs.

Two small golden profiles with captures at step 0: GPT in float32 (batch
2, context 40: softmax rows of 40) and ViT in bf16 mixed precision. A
correct native softmax passes every variant run, in float32 and bf16; a
softmax whose bug lives on rows with L % 128 == 64 passes the training
shapes (op-level playback of the captured call) and fails the fuzz on
``len=64``, named; its exported regression test fails with the bug and
passes with the fix, in a pytest subprocess. A KUT that refuses long rows
is a finding; budgets, reruns and bad input behave as documented.
"""

import math
import os
import subprocess
import sys

import pytest

import peat_jax as peat
from peat_jax import models

ESCAPE = os.path.join(os.path.dirname(__file__), "..", "..", "..",
                      "benchmarks", "escape")
SOFTMAX = "*attention/softmax:0"


def _profile(tmp, name, scenario, **cfg):
  task = models.get_task(scenario, **cfg)
  d = str(tmp / name)
  peat.profile(task, d, steps=2, checkpoint_every=1,
               capture_kernel=["softmax", "dot_general"],
               capture_phase="fwd", capture_steps=[0],
               budget_bytes=128 << 20)
  return task, d


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
  return _profile(tmp_path_factory.mktemp("fuzz"), "gpt", "gpt",
                  batch_size=2, context=40)


@pytest.fixture(scope="module")
def vit_bf16(tmp_path_factory):
  return _profile(tmp_path_factory.mktemp("fuzz"), "vit", "vit_bf16",
                  batch_size=8, model_kwargs=dict(dim=32, depth=1, heads=2))


@pytest.fixture()
def escape_path(monkeypatch):
  monkeypatch.syspath_prepend(os.path.abspath(ESCAPE))


def _spec(text, kernel="softmax"):
  return peat.kernels.parse_kut(text, kernel=kernel)


@pytest.mark.parametrize("which", ["gpt", "vit_bf16"])
def test_a_correct_softmax_passes_every_variant(which, request):
  task, d = request.getfixturevalue(which)
  names = ["batch=1", "len=64", "len=16385", "scale=edge"]
  r = peat.fuzz(d, "native:softmax:default", task=task, select=SOFTMAX,
                variants=names, campaign_dir=os.path.join(d, which))
  assert r.ran == len(r.records) == len(names) and not r.errors
  assert {x["variant"] for x in r.records} == set(names)
  assert r.verdict.verdict == "pass", r.summary
  for x in r.records:
    assert x["source"] == "fuzz" and x["diagnosis"]["verdict"] == "pass"
    assert x["golden_from"] == "site" and x["shapes"]
    assert x["diagnosis"]["model"] in ("exact", "reordering")
  long = next(x for x in r.records if x["variant"] == "len=16385")
  assert long["shapes"][0][-1] == 16385


def test_a_shape_gated_bug_passes_training_and_fails_the_fuzz(
    gpt, escape_path, tmp_path):
  del escape_path
  task, d = gpt
  bug = _spec("py:escape_shapes:softmax_tail64")
  ops = peat.playback_ops(d, bug, select=SOFTMAX,
                          campaign_dir=str(tmp_path / "ops"))
  assert ops.records and all(x["diagnosis"]["verdict"] == "pass"
                             for x in ops.records)
  camp = str(tmp_path / "bug")
  r = peat.fuzz(d, bug, task=task, select=SOFTMAX,
                variants=["len=63", "len=64", "len=65"], campaign_dir=camp)
  by = {x["variant"]: x for x in r.records}
  assert by["len=63"]["diagnosis"]["verdict"] == "pass"
  assert by["len=65"]["diagnosis"]["verdict"] == "pass"
  assert by["len=64"]["diagnosis"]["verdict"] == "fail"
  assert by["len=64"]["diagnosis"]["model"] in ("scale", "parameter")
  assert r.verdict.verdict == "fail" and "len=64" in r.summary
  # Rerun: nothing runs again, the same records.
  again = peat.fuzz(d, bug, task=task, select=SOFTMAX,
                    variants=["len=63", "len=64", "len=65"],
                    campaign_dir=camp)
  assert again.ran == 0 and again.records == r.records
  # The regression test for the kernel's repository.
  folder = peat.export_repro(camp, site=by["len=64"]["site"],
                             variant="len=64", task=task)
  case = peat.testing.load_repro(folder)
  # Exported at its smallest failing input: one row of 64 (found at
  # [2, 4, 40, 64]), the variant as found beside it.
  assert case.call.args[0].shape == (1, 1, 1, 64)
  assert case.meta["shrunk_from"] == "len=64"
  assert case.meta["original_shapes"] == [[2, 4, 40, 64]]
  assert case.meta["variant"] == r.shrunk[0]["variant"]
  assert "the smallest input failing as len=64 did" in open(
      os.path.join(folder, "test_repro.py")).read()
  as_found = peat.export_repro(camp, site=by["len=64"]["site"],
                               variant="len=64", task=task, smallest=False,
                               out_dir=str(tmp_path / "as_found"))
  assert peat.testing.load_repro(as_found).call.args[0].shape == (
      2, 4, 40, 64)
  env = dict(os.environ, PEAT_REPRO_PATH=os.path.abspath(ESCAPE))
  failed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                           "no:cacheprovider", folder], env=env,
                          capture_output=True, text=True, timeout=300)
  assert failed.returncode == 1, failed.stdout[-2000:]
  assert "GoldenMismatchError" in failed.stdout
  env["PEAT_REPRO_KUT"] = "py:escape_shapes:softmax_tail64_fixed"
  fixed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                          "no:cacheprovider", folder], env=env,
                         capture_output=True, text=True, timeout=300)
  assert fixed.returncode == 0, fixed.stdout[-2000:]
  assert "1 passed" in fixed.stdout
  # A third-party torch kernel on the same case: the repro imports the
  # PyTorch bridge for a torch: spec itself.
  env["PEAT_REPRO_KUT"] = "torch:softmax"
  torch_run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                              "no:cacheprovider", folder], env=env,
                             capture_output=True, text=True, timeout=300)
  assert torch_run.returncode == 0, torch_run.stdout[-2000:]


def test_a_kut_that_raises_is_a_finding(gpt, tmp_path, monkeypatch):
  task, d = gpt
  (tmp_path / "short_rows.py").write_text(
      "import jax\n"
      "def softmax(x, axis=-1):\n"
      "  if x.shape[-1] > 100:\n"
      "    raise ValueError('rows longer than 100 are not supported')\n"
      "  return jax.nn.softmax(x, axis=axis)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  r = peat.fuzz(d, _spec("py:short_rows:softmax"), task=task,
                select=SOFTMAX, variants=["len=64", "len=4097"],
                campaign_dir=str(tmp_path / "c"))
  # Found at 4097, shrunk to the smallest that raises: one row of 101.
  assert [e["variant"] for e in r.errors][0] == "len=4097"
  (small,) = r.shrunk
  assert small["shrunk_from"] == "len=4097" and small["shapes"] == [
      [1, 1, 1, 101]]
  assert [e["variant"] for e in r.errors] == ["len=4097", small["variant"]]
  assert "rows longer than 100" in r.errors[0]["error"]
  assert r.verdict.verdict == "fail" and "len=4097" in r.summary


def test_budgets(gpt, tmp_path):
  task, d = gpt
  r = peat.fuzz(d, "native:softmax:default", task=task, select=SOFTMAX,
                budget_cases=2, campaign_dir=str(tmp_path / "a"))
  assert r.ran == 2 and len(r.records) == 2
  assert [x["family"] for x in r.records] == ["batch", "rows"]
  assert len(r.skipped) == r.planned - 2
  assert all(s["reason"] == "over the budget" for s in r.skipped)
  more = peat.fuzz(d, "native:softmax:default", task=task, select=SOFTMAX,
                   budget_cases=1, campaign_dir=str(tmp_path / "a"))
  assert more.ran == 1 and len(more.records) == 3  # resumes, in order


def test_bad_input_is_refused(gpt, tmp_path):
  task, d = gpt
  for kw, msg in ((dict(budget_cases=0), "budget_cases must be a positive"),
                  (dict(families=["shapes"]), "unknown fuzz families")):
    with pytest.raises(peat.PeatError, match=msg):
      peat.fuzz(d, "native:softmax:default", task=task, **kw)
  with pytest.raises(peat.PeatError, match="no captures"):
    peat.fuzz(str(tmp_path), "native:softmax:default")
  with pytest.raises(peat.PeatError, match="no record of site"):
    peat.export_repro(d, site="fwd/nowhere:0", variant="len=64",
                      kut="native:softmax:default")


def test_the_repro_tool(gpt, escape_path, tmp_path):
  del escape_path
  task, d = gpt
  camp = str(tmp_path / "c")
  r = peat.fuzz(d, _spec("py:escape_shapes:softmax_tail64"), task=task,
                select=SOFTMAX, variants=["len=64"], campaign_dir=camp)
  site = r.records[0]["site"]
  env = dict(os.environ, PYTHONPATH=os.path.abspath(ESCAPE) + os.pathsep
             + os.environ.get("PYTHONPATH", ""))
  out = str(tmp_path / "repro")
  tool = [sys.executable, "-m", "peat_jax.tools.repro",
          f"--campaign_dir={camp}", f"--site={site}", "--variant=len=64",
          "--scenario=gpt", "--batch_size=2", '--overrides={"context": 40}',
          f"--out={out}"]
  done = subprocess.run(tool, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert f"repro: {out}" in done.stdout
  assert sorted(os.listdir(out)) == ["case.json", "case.npz",
                                     "test_repro.py"]
  bad = subprocess.run(tool[:5] + ["--variant=len=9999"], env=env,
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and "no record of site" in bad.stderr


def test_the_playback_tool_fuzzes(gpt, tmp_path):
  _, d = gpt
  tool = [sys.executable, "-m", "peat_jax.tools.playback",
          f"--campaign_dir={d}", "--kut=native:softmax:default", "--fuzz",
          "--fuzz_budget=2", f"--select={SOFTMAX}", "--scenario=gpt",
          "--batch_size=2", '--overrides={"context": 40}']
  done = subprocess.run(tool, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "fuzz verdict: pass" in done.stdout
  assert "[batch=1]" in done.stdout and "fuzz.msgpack" in done.stdout
  bad = subprocess.run(tool[:5] + ["--fuzz_budget=abc", "--fuzz"],
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and "--fuzz_budget must be" in bad.stderr


_GEMV_DROP = '''
import jax
from jax import lax


def dot_general(lhs, rhs, *, dimension_numbers, precision=None,
                preferred_element_type=None, out_sharding=None):
  """A GEMM whose one-row (GEMV) path leaves the last K term out."""
  del out_sharding
  (lc, rc), (lb, _) = dimension_numbers
  free = [d for d in range(lhs.ndim) if d not in tuple(lc) + tuple(lb)]
  rows = 1
  for d in free:
    rows *= lhs.shape[d]
  if rows == 1 and len(lc) == 1 and lhs.shape[lc[0]] > 1:
    k = lhs.shape[lc[0]]
    lhs = lax.slice_in_dim(lhs, 0, k - 1, axis=lc[0])
    rhs = lax.slice_in_dim(rhs, 0, k - 1, axis=rc[0])
  return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                         preferred_element_type=preferred_element_type)
'''


_GEMV = ("py:gemv_drop:dot_general", "rows=1", "dropped_last_term")
_NTAIL7 = ("py:escape_shapes:matmul_ntail7", "n=7", "repeated_last_column")


@pytest.mark.parametrize("which,kut,variant,name", [
    ("gpt",) + _GEMV, ("vit_bf16",) + _NTAIL7,
    pytest.param("vit_bf16", *_GEMV, marks=pytest.mark.slow),
    pytest.param("gpt", *_NTAIL7, marks=pytest.mark.slow)])
def test_gemm_slips_at_fuzz_shapes_are_named_from_their_inputs(
    which, kut, variant, name, request, escape_path, tmp_path, monkeypatch):
  """A GEMV that drops its last K term and an epilogue that repeats its
  last column (N % 8 == 7) pass training's shapes; at the fuzz's shape the
  record is named from the variant's own inputs (the port probe's slip
  search or the shape probe), and fails."""
  task, d = request.getfixturevalue(which)
  (tmp_path / "gemv_drop.py").write_text(_GEMV_DROP)
  monkeypatch.syspath_prepend(str(tmp_path))
  r = peat.fuzz(d, _spec(kut, "dot_general"), task=task,
                select="*dot_general:0", variants=[variant],
                campaign_dir=str(tmp_path / "c"), shrink=False)
  (rec,) = [x for x in r.records if x["variant"] == variant][:1]
  diag = rec["diagnosis"]
  assert (diag["model"], diag["verdict"]) == ("indexing", "fail"), diag
  assert rec["shape_probe"]["name"] == name
  # Named from the variant's own inputs: by the shape probe, or already by
  # the port probe's slip search (a lower ratio keeps its diagnosis).
  port = rec.get("port") or {}
  assert diag.get("named_by") == "inputs" or (
      port.get("explains") and port.get("model") == "indexing"), (diag, port)
  assert r.verdict.verdict == "fail"


def test_a_correct_gemm_passes_one_output_joint_variants(gpt, tmp_path):
  """A dot product of 134 terms (one output), a GEMV of 7 rows and a
  GEMM of odd shapes: a correct native matmul passes each, its one-output
  record read without a noise floor of one element, and the coverage
  says what ran."""
  task, d = gpt
  names = ["len=134,rest=1", "m=7,rest=1", "n=127,batch=3,rest=1"]
  r = peat.fuzz(d, "native:matmul:default", task=task,
                select="*dot_general:0", variants=names,
                campaign_dir=str(tmp_path / "c"), shrink=False)
  sites = {x["site"] for x in r.records}
  assert len(r.records) == len(names) * len(sites) and not r.errors
  assert {x["variant"] for x in r.records} == set(names)
  assert r.verdict.verdict == "pass", r.summary
  for one in (x for x in r.records if x["variant"] == names[0]):
    lhs, rhs = one["shapes"]  # every other axis one: one output
    assert math.prod(lhs) == math.prod(rhs) == 134, one["shapes"]
  assert r.coverage["tail"].ran == len(sites)
  assert r.coverage["joint"].ran == 2 * len(sites)
