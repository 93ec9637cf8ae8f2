"""The tools on the user's own model and kernels: --task, --kut=py:/ffi:/
torch:, --kernel, --fail_on exit codes, and the one-line exit-2 error."""

import importlib
import os
import shutil
import subprocess

import jax
import pytest

from peat_jax.tools import _cli
from peat_jax.tools import playback
from peat_jax.tools import sites
from peat_jax.tools import validate

TOOLS = ("analyze", "calibrate", "detect", "golden", "playback", "profile",
         "report", "runtime", "scaleout", "sites", "validate")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.mark.parametrize("name", TOOLS)
def test_a_stray_positional_argument_exits_2_in_one_line(name, capsys):
  tool = importlib.import_module(f"peat_jax.tools.{name}")
  with pytest.raises(SystemExit) as e:
    _cli.run(tool.main, tool.FLAGS, tool.__doc__, argv=[name, "oops"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: unexpected positional arguments ['oops']; this tool "
                 "takes flags only (--name=value). Pass --help to list them."]


def _validate(cli, d, *flags):
  return cli.run(validate, [f"--campaign_dir={d}", "--task=byo_model:task",
                            "--steps=4", "--checkpoint_every=2",
                            "--frequencies=", *flags], task=None)


def test_sites_of_the_users_task(byo, cli):
  del byo
  rc, out, err = cli.run(sites, ["--task=byo_model:task",
                                 "--kernel=layer_norm,gelu,cross_entropy"],
                         task=None)
  assert rc == 0, err
  assert out.splitlines()[2].startswith("fwd/Net/LayerNorm/layer_norm:0  "
                                        "layer_norm*")
  assert "fwd/Net/gelu:0" in out and "bwd/cross_entropy:0" in out


def test_validate_py_kut_exit_codes_follow_fail_on(byo, cli, tmp_path):
  del byo
  d = tmp_path / "gelu"
  rc, out, err = _validate(cli, d, "--kut=py:byo_model:gelu_bf16",
                           "--kernel=gelu")
  assert rc == 0, err
  assert "KUT py:byo_model:gelu_bf16@gelu on byo_net: WARN" in out
  assert "fwd/Net/gelu:0" in out and "precision:bf16" in out
  rc, out, err = _validate(cli, d, "--kut=py:byo_model:gelu_bf16",
                           "--kernel=gelu", "--fail_on=warn")
  assert rc == 1 and "verdict warn reaches --fail_on=warn" in err
  rc, _, _ = _validate(cli, d, "--kut=py:byo_model:gelu_bf16", "--kernel=gelu",
                       "--fail_on=never")
  assert rc == 0


@pytest.mark.parametrize("flags, message", [
    (["--kut=py:byo_model:gelu_bf16"], "needs the site kernel it replaces"),
    (["--kut=py:byo_model:nope", "--kernel=gelu"], "has no function 'nope'"),
    (["--kut=golden", "--scenario=vit"], "--scenario set the reference "
     "scenario, which --task=byo_model:task replaces"),
    (["--kut=ffi:./missing.so:F", "--kernel=dot_general"], "not found"),
])
def test_validate_bad_user_input_exits_2(byo, cli, tmp_path, flags, message):
  del byo
  rc, _, err = _validate(cli, tmp_path / "c", *flags)
  assert rc == 2 and message in err
  assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_validate_torch_kut_of_the_users_module(byo, cli, tmp_path):
  del byo
  pytest.importorskip("torch")
  rc, out, err = _validate(cli, tmp_path / "t",
                           "--kut=torch:byo_model:torch_matmul",
                           "--kernel=dot_general")
  assert rc == 0, err
  assert "KUT torch:byo_model:torch_matmul@dot_general on byo_net: PASS" in out


@pytest.fixture(scope="module")
def ffi_matmul(tmp_path_factory):
  gxx = shutil.which("g++")
  if gxx is None:
    pytest.skip("g++ is not installed: cannot build the example FFI library")
  out = tmp_path_factory.mktemp("ffi") / "libffi_matmul.so"
  subprocess.run([gxx, "-std=c++17", "-O2", "-fPIC", "-shared",
                  f"-isystem{jax.ffi.include_dir()}",
                  os.path.join(ROOT, "docs", "examples", "ffi_matmul.cc"),
                  "-o", str(out)], check=True)
  return str(out)


def test_playback_ffi_kut_on_the_users_task(byo, cli, tmp_path, ffi_matmul):
  del byo
  d = tmp_path / "f"
  rc, _, err = _validate(cli, d, "--kut=golden", "--isolate=off")
  assert rc == 0, err
  rc, out, err = cli.run(playback, [
      f"--campaign_dir={d}", "--task=byo_model:task",
      f"--kut=ffi:{ffi_matmul}:MyMatmul:MyMatmulBwd", "--kernel=dot_general",
      "--fail_on=warn"], task=None)
  assert rc == 0, err
  assert (f"KUT ffi:{ffi_matmul}:MyMatmul:MyMatmulBwd@dot_general on "
          "byo_net: PASS") in out
  assert "fwd/Net/Linear/dot_general:0" in out


@pytest.mark.slow
def test_validate_ffi_kut_isolated_by_default(byo, cli, tmp_path, ffi_matmul):
  del byo
  rc, out, err = _validate(cli, tmp_path / "i",
                           f"--kut=ffi:{ffi_matmul}:MyMatmul:MyMatmulBwd",
                           "--kernel=dot_general", "--frequencies=every")
  assert rc == 0, err
  assert "(isolated: worker processes" in out and "verdict: pass" in out
