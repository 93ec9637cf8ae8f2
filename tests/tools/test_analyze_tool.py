"""Tests of tools/analyze.py and tools/detect.py on one signature."""

import ml_dtypes
import numpy as np
import pytest

from peat_jax.tools import _cli
from peat_jax.tools import analyze
from peat_jax.tools import detect


@pytest.fixture()
def arrays(tmp_path):
  """golden.npy, test.npz (golden rounded to bf16) and ref64.npy."""
  rng = np.random.default_rng(7)
  ref = rng.standard_normal((8, 10))
  golden = ref.astype(np.float32)
  test = golden.astype(ml_dtypes.bfloat16).astype(np.float32)
  np.save(tmp_path / "golden.npy", golden)
  np.savez(tmp_path / "test.npz", y=test, other=golden)
  np.save(tmp_path / "ref64.npy", ref)
  return tmp_path, test, golden


def test_analyze_prints_fields_and_detect_names_the_model(arrays, cli):
  d, test, golden = arrays
  rc, out, err = cli.run(analyze, [
      f"--test={d}/test.npz:y", f"--golden={d}/golden.npy",
      f"--reference={d}/ref64.npy", f"--out={d}/sig.npz"])
  assert rc == 0, err
  fields = dict(line.split()[:2] for line in out.splitlines()[2:]
                if len(line.split()) == 2)
  differ = int(np.sum(test != golden))
  assert int(fields["n"]) == 80 and int(fields["n_bit_equal"]) == 80 - differ
  assert f"80 elements, {differ} differ" in out and "noise ratio" in out
  assert f"signature: {d}/sig.npz" in out
  rc, out, err = cli.run(detect, [f"--signature={d}/sig.npz",
                                  "--kernel=dot_general", "--reduction=64"])
  assert rc == 0, err
  assert "model: precision:bf16" in out and "verdict: warn" in out
  assert out.splitlines()[0].split()[:2] == ["candidate", "confidence"]


@pytest.mark.parametrize("argv, message", [
    ([], "--test and --golden are required"),
    (["--test={d}/test.npz", "--golden={d}/golden.npy"],
     "holds arrays ['y', 'other']; choose one"),
    (["--test={d}/test.npz:z", "--golden={d}/golden.npy"], "no array 'z'"),
    (["--test={d}/missing.npy", "--golden={d}/golden.npy"], "does not exist"),
    (["--test={d}/ref64.npy", "--golden={d}/golden.npy"], "dtype"),
])
def test_analyze_bad_input_exits_2(arrays, cli, argv, message):
  d, _, _ = arrays
  rc, _, err = cli.run(analyze, [a.format(d=d) for a in argv])
  assert rc == 2 and message in err, err


@pytest.mark.parametrize("argv, message", [
    ([], "exactly one of --signature and --campaign_dir"),
    (["--signature={d}/golden.npy"], "holds one array"),
    (["--signature={d}/test.npz"], "lacks signature fields"),
    (["--signature={d}/nope.npz"], "not a readable signature"),
])
def test_detect_bad_input_exits_2(arrays, cli, argv, message):
  d, _, _ = arrays
  rc, _, err = cli.run(detect, [a.format(d=d) for a in argv])
  assert rc == 2 and message in err, err


@pytest.mark.parametrize("tool, words, flags", [
    (analyze, ("Signature", "noise floor"),
     ("--test", "--golden", "--reference", "--out", "--[no]arrays")),
    (detect, ("error model", "verdict"),
     ("--signature", "--kernel", "--reduction", "--campaign_dir", "--source",
      "--kut")),
])
def test_helpfull_explains_the_tool(capsys, tool, words, flags):
  with pytest.raises(SystemExit) as e:
    _cli.run(tool.main, tool.FLAGS, tool.__doc__, argv=["t", "--helpfull"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for w in words + flags:
    assert w in out
