"""Probes of the GPU check (scripts/gpu_check.py runs them as steps).

``--env``: versions of Python, jax and the packages peat_jax needs, the
compilers and the GPU (``nvidia-smi``), and the devices jax picks by
default; fails (exit 1) when a needed package is missing or jax's default
backend is not ``--expect_backend``.

``--build``: peat_jax, its models and a tool import with this machine's
jax (so nothing at import time insists on the pinned version); each
platform's native library exists, loads (ctypes) and exports every FFI
handler (found with dlsym); with ``--wheel_dir`` the libraries are read from the
wheel built there instead of the installed package.

Each prints one ``GPU_CHECK_JSON {...}`` line with its findings.
"""

import argparse
import ctypes
import glob
import importlib.metadata
import importlib.resources
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # pylint: disable=g-import-not-at-top,wrong-import-position

NEEDED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy",
          "ml_dtypes", "msgpack", "absl-py", "scikit-learn", "safetensors",
          "setuptools", "pytest", "hypothesis")
OPTIONAL = ("jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
            "jax-cuda12-pjrt", "torch", "wheel", "tensorstore", "peat_jax")


def _version(dist: str) -> str | None:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


def _first_line(argv: list[str], last: bool = False) -> str | None:
  if shutil.which(argv[0]) is None:
    return None
  try:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError) as e:
    return f"error: {e}"
  lines = [l.strip() for l in (out.stdout or out.stderr).splitlines()
           if l.strip()]
  if not lines:
    return None
  return lines[-1] if last else lines[0]


def probe_env(expect_backend: str) -> tuple[dict, list[str]]:
  versions = {d: _version(d) for d in NEEDED + OPTIONAL}
  problems = [f"package {d} is not installed" for d in NEEDED
              if versions[d] is None]
  out = {
      "python": sys.version.split()[0], "executable": sys.executable,
      "platform": platform.platform(), "cpus": os.cpu_count(),
      "versions": versions,
      "nvcc": _first_line(["nvcc", "--version"], last=True),
      "gpu": _first_line(["nvidia-smi", "--query-gpu=name,driver_version,"
                          "memory.total", "--format=csv,noheader"]),
      "cxx": _first_line(["c++", "--version"]),
      "cmake": _first_line(["cmake", "--version"]),
  }
  if expect_backend == "gpu" and not any(
      versions[d] for d in ("jax-cuda13-plugin", "jax-cuda12-plugin")):
    problems.append("no jax CUDA plugin (jax-cuda13-plugin) is installed")
  try:
    import jax  # pylint: disable=g-import-not-at-top
    devices = jax.devices()
    out["backend"] = jax.default_backend()
    out["devices"] = [f"{d.platform}:{d.device_kind}" for d in devices]
    out["platform_version"] = devices[0].client.platform_version
  except Exception as e:  # pylint: disable=broad-except
    problems.append(f"jax does not start: {type(e).__name__}: {e}")
    return out, problems
  if out["backend"] != expect_backend:
    problems.append(f"jax's default backend is {out['backend']}, expected "
                    f"{expect_backend} (devices {out['devices']})")
  return out, problems


def _library_dir(wheel_dir: str | None, scratch: str) -> str:
  if wheel_dir is None:
    return str(importlib.resources.files("peat_jax.kernels"))
  wheels = sorted(glob.glob(os.path.join(wheel_dir, "peat_jax-*.whl")))
  if not wheels:
    raise FileNotFoundError(f"no peat_jax wheel in {wheel_dir}")
  with zipfile.ZipFile(wheels[-1]) as z:
    for name in z.namelist():
      if name.startswith("peat_jax/kernels/") and name.endswith(".so"):
        z.extract(name, scratch)
  return os.path.join(scratch, "peat_jax", "kernels")


def probe_build(platforms: list[str], wheel_dir: str | None
                ) -> tuple[dict, list[str]]:
  problems = []
  out = {"python": sys.version.split()[0]}
  try:
    import jax  # pylint: disable=g-import-not-at-top
    import peat_jax  # pylint: disable=g-import-not-at-top
    from peat_jax import models  # pylint: disable=g-import-not-at-top,unused-import
    from peat_jax.tools import validate  # pylint: disable=g-import-not-at-top,unused-import
    out.update(jax=jax.__version__, peat_jax=peat_jax.__version__,
               peat_jax_file=peat_jax.__file__)
  except Exception as e:  # pylint: disable=broad-except
    problems.append(f"import failed: {type(e).__name__}: {e}")
  reqs = importlib.metadata.requires("peat_jax") or []
  out["declared_jax"] = [r for r in reqs if r.startswith(("jax", "jaxlib"))]
  with tempfile.TemporaryDirectory() as scratch:
    try:
      libdir = _library_dir(wheel_dir, scratch)
    except (OSError, zipfile.BadZipFile) as e:
      return out, problems + [f"libraries not found: {e}"]
    out["libraries"] = {}
    for plat in platforms:
      path = os.path.join(libdir, gpu_check.LIBRARIES[plat])
      info = {"path": path if wheel_dir is None else
              f"{os.path.basename(wheel_dir)}:{gpu_check.LIBRARIES[plat]}"}
      out["libraries"][plat] = info
      if not os.path.exists(path):
        problems.append(f"{plat} library {gpu_check.LIBRARIES[plat]} was "
                        "not built")
        continue
      info["bytes"] = os.path.getsize(path)
      try:
        lib = ctypes.CDLL(path)
      except OSError as e:
        info["loads"] = False
        problems.append(f"{plat} library does not load: {e}")
        continue
      info["loads"] = True
      missing = [h for h in gpu_check.HANDLERS if not hasattr(lib, h)]
      info["handlers_missing"] = missing
      if missing:
        problems.append(f"{plat} library lacks the handlers {missing}")
  return out, problems


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--env", action="store_true")
  p.add_argument("--expect_backend", default="gpu")
  p.add_argument("--build", action="store_true")
  p.add_argument("--platforms", default="cpu,CUDA")
  p.add_argument("--wheel_dir", default=None)
  args = p.parse_args()
  if args.env:
    out, problems = probe_env(args.expect_backend)
  else:
    out, problems = probe_build(args.platforms.split(","), args.wheel_dir)
  out["problems"] = problems
  print(json.dumps(out, indent=1))
  print(gpu_check.MARK + json.dumps(out))
  if problems:
    print("problems: " + "; ".join(problems), file=sys.stderr)
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
