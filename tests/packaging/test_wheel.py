"""The wheel: built from the tree (not editable), installed and used elsewhere.

Packages are found by setup.py, not listed, so a new folder cannot go
missing from the wheel: the wheel must hold every package folder of the
checkout (peat_jax/*, and bridges/, models/, tools/ inside the peat_jax
namespace), the native library and the kernel sources. The slow test
installs the wheel into a fresh virtual environment outside the checkout
and runs a small campaign there, process isolation included (the workers
import the installed peat_jax).
"""

import glob
import os
import subprocess
import sys
import textwrap
import venv
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _tree_packages() -> set[str]:
  """Package names the checkout's folders make (what the wheel must hold)."""
  out = set()
  for init in glob.glob(os.path.join(ROOT, "peat_jax", "**", "__init__.py"),
                        recursive=True):
    rel = os.path.relpath(os.path.dirname(init), ROOT)
    out.add(rel.replace(os.sep, "."))
  for name in ("bridges", "models", "tools"):
    for init in glob.glob(os.path.join(ROOT, name, "**", "__init__.py"),
                          recursive=True):
      rel = os.path.relpath(os.path.dirname(init), ROOT)
      out.add("peat_jax." + rel.replace(os.sep, "."))
  return out


def test_setup_finds_every_package_of_the_tree():
  code = ("import runpy, sys, setuptools\n"
          "got = {}\n"
          "setuptools.setup = lambda **kw: got.update(kw)\n"
          "runpy.run_path('setup.py')\n"
          "print(' '.join(got['packages']))\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                       capture_output=True, text=True).stdout.split()
  assert set(out) == _tree_packages()
  assert not {"bridges", "models", "tools"} & set(out)


@pytest.mark.slow  # builds the native library (about 1-2 min) and a campaign
def test_wheel_installs_and_runs_a_campaign_outside_the_checkout(tmp_path):
  wheels = tmp_path / "wheels"
  env = dict(os.environ, PEAT_BUILD_CUDA="0")
  subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                  "--no-build-isolation", "-w", str(wheels), ROOT],
                 check=True, env=env, cwd=tmp_path)
  (whl,) = glob.glob(str(wheels / "peat_jax-*.whl"))
  names = zipfile.ZipFile(whl).namelist()
  for pkg in _tree_packages():
    assert pkg.replace(".", "/") + "/__init__.py" in names, pkg
  assert "peat_jax/kernels/_peat_kernels_cpu.so" in names
  assert "peat_jax/kernels/csrc/signature.h" in names
  assert not [n for n in names if n.split("/")[0] in ("bridges", "models",
                                                      "tools", "tests")]
  # A fresh environment outside the checkout; peat_jax's dependencies come
  # from this environment's site-packages as a plain path (no .pth file of
  # it runs, so the checkout's editable install stays invisible).
  target = tmp_path / "venv"
  venv.create(target, with_pip=True)
  py = str(target / "bin" / "python")
  site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        check=True, capture_output=True, text=True).stdout.strip()
  deps = [p for p in sys.path if p.endswith("site-packages")]
  with open(os.path.join(site, "peat_deps.pth"), "w") as f:
    f.write("\n".join(deps) + "\n")
  subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps",
                  "--no-index", whl], check=True, cwd=tmp_path)
  script = textwrap.dedent("""
      import os, sys
      import peat_jax as peat
      from peat_jax import models
      assert "/work/main" not in peat.__file__ or "site-packages" in peat.__file__, peat.__file__
      print("peat_jax from", os.path.dirname(peat.__file__))
      factory = peat.TaskFactory("peat_jax.models", "get_task",
                                 {"name": "cnn", "batch_size": 16})
      paths = peat.validate(factory, "native:conv2d:in_bf16", "campaign",
                            steps=4, checkpoint_every=2, frequencies=("every",),
                            runtime_steps=2, scenario="cnn", progress=None)
      print("verdict", paths.verdict)
      """)
  out = subprocess.run([py, "-c", script], cwd=tmp_path, check=True,
                       capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items()
                            if k != "PYTHONPATH"})
  lines = out.stdout.splitlines()
  assert lines[0].startswith("peat_jax from " + site), lines
  assert lines[-1] == "verdict warn", out.stdout + out.stderr
  assert (tmp_path / "campaign" / "report.json").exists()
