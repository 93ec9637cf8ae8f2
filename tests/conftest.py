"""Shared pytest set-up, and the user's own code (``byo``) for its tests."""

import os
import sys

import pytest
from absl import flags


@pytest.fixture(autouse=True, scope="module")
def _bounded_mappings():
  """Keeps the one pytest process under the kernel's mapping limit: the
  suite compiles tens of thousands of executables, about six memory
  mappings each (peat_jax.core.release_compiled, after each module)."""
  yield
  from peat_jax import core
  core.release_compiled()


#: Tests the CI job leaves to the slow set, by measured duration
#: (tests/ci_slow.txt: node ids or module paths, with their seconds).
CI_SLOW_LIST = os.path.join(os.path.dirname(__file__), "ci_slow.txt")


def ci_slow_entries(path: str = CI_SLOW_LIST) -> list[str]:
  """The node ids and module paths listed in ``path`` (comments and blank
  lines left out)."""
  with open(path, encoding="utf-8") as f:
    return [ln.split("#", 1)[0].strip() for ln in f
            if ln.split("#", 1)[0].strip()]


def pytest_collection_modifyitems(config, items):
  """Marks the tests of tests/ci_slow.txt ``slow`` (the CI job deselects
  them with ``-m 'not slow'``; ``./test.sh -m slow`` runs them)."""
  del config
  entries = set(ci_slow_entries())
  for item in items:
    if (item.nodeid in entries
        or item.nodeid.split("::", 1)[0] in entries):
      item.add_marker(pytest.mark.slow)


def pytest_configure(config):
  del config
  # absl flags are unparsed under pytest; tools' tests parse explicit lists.
  flags.FLAGS.mark_as_parsed()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  # Tools run here compile into no persistent cache (a test of the cache
  # names its own directory): what a test measures or counts is compiled
  # by it, whatever an earlier run left in the user's cache.
  os.environ["PEAT_JAX_COMPILATION_CACHE"] = ""


# The user's own code, as a kernel engineer's repository would hold it: a
# stock-Flax model (no peat_jax marker) with its task, and py: / torch: KUTs.
BYO_MODULE = '''
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import peat_jax as peat


class Net(nnx.Module):
  def __init__(self, rngs):
    self.ln = nnx.LayerNorm(16, rngs=rngs)
    self.fc = nnx.Linear(16, 10, rngs=rngs)

  def __call__(self, x):
    return self.fc(jax.nn.gelu(self.ln(x)))


def loss_fn(model, batch):
  return optax.softmax_cross_entropy_with_integer_labels(
      model(batch["x"]), batch["y"]).mean()


def batch_at(position):
  rng = np.random.default_rng(500 + int(position))
  return {"x": rng.standard_normal((8, 16)).astype(np.float32),
          "y": rng.integers(0, 10, 8).astype(np.int32)}


def task():
  return peat.nnx_task(lambda rngs: Net(rngs), optax.sgd(0.1), loss_fn,
                       batch_at, name="byo_net", default_steps=4,
                       default_checkpoint_every=2,
                       eval_batches=[batch_at(10 ** 6)])


def factory():
  return peat.TaskFactory("byo_model", "task")


def layer_norm(x, scale, bias, eps):
  m = jnp.mean(x, -1, keepdims=True)
  v = jnp.mean(jnp.square(x - m), -1, keepdims=True)
  return (x - m) * jax.lax.rsqrt(v + eps) * scale + bias


def gelu_bf16(x, approximate=False):
  y = jax.nn.gelu(x.astype(jnp.bfloat16), approximate=approximate)
  return y.astype(x.dtype)


def torch_matmul(a, b):
  import torch
  return torch.matmul(a, b)
'''



@pytest.fixture(scope="session")
def byo(tmp_path_factory):
  """Directory holding ``byo_model.py`` (on sys.path for the session)."""
  d = tmp_path_factory.mktemp("byo")
  (d / "byo_model.py").write_text(BYO_MODULE)
  sys.path.insert(0, str(d))
  yield d
  sys.path.remove(str(d))
  sys.modules.pop("byo_model", None)


ESCAPE_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmarks", "escape")


@pytest.fixture(scope="session")
def escape_lib(tmp_path_factory):
  """The escape suite's C++ kernels (benchmarks/escape/escape_kernels.cc),
  compiled for the session; its JAX ports (``escape_jax``) importable."""
  import shutil
  import subprocess
  import jax
  gxx = shutil.which("g++")
  if gxx is None:
    pytest.skip("g++ is not installed: cannot build the escape kernels")
  out = str(tmp_path_factory.mktemp("escape") / "libescape_kernels.so")
  subprocess.run([gxx, "-std=c++17", "-O2", "-fPIC", "-shared",
                  f"-isystem{jax.ffi.include_dir()}",
                  os.path.join(ESCAPE_DIR, "escape_kernels.cc"), "-o", out],
                 check=True)
  sys.path.insert(0, ESCAPE_DIR)
  yield out
  sys.path.remove(ESCAPE_DIR)
