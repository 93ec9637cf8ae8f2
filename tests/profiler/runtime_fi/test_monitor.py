"""A KUT inside a user's own Flax/Optax training loop (peat.Monitor)."""

import os
import re
import subprocess
import sys
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import peat_jax as peat
from peat_jax.models import data


class UserState(NamedTuple):  # the user's own state: no peat type
  step: jax.Array
  params: dict
  opt: optax.OptState


class Mlp(nnx.Module):

  def __init__(self, rngs):
    self.l1 = nnx.Linear(64, 48, rngs=rngs)
    self.l2 = nnx.Linear(48, 10, rngs=rngs)

  def __call__(self, x):
    return self.l2(jax.nn.relu(self.l1(x)))


def _user_training():
  graphdef, params = nnx.split(Mlp(nnx.Rngs(0)))
  params = params.to_pure_dict()
  tx = optax.adam(3e-3)

  def loss_fn(p, batch):
    logits = nnx.merge(graphdef, p)(batch["x"].reshape(-1, 64))
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, batch["y"]).mean()

  def step_fn(state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt = tx.update(grads, state.opt, state.params)
    return UserState(state.step + 1, optax.apply_updates(state.params,
                                                         updates), opt), {
                                                             "loss": loss}

  train = data.digits("train")
  batches = [data.classification_batch(train, 32, 0, p) for p in range(8)]
  return step_fn, UserState(jnp.int32(0), params, tx.init(params)), batches


def test_monitor_streams_signatures_from_a_users_loop(tmp_path):
  step_fn, state, batches = _user_training()
  with peat.Monitor(step_fn, "native:matmul:in_bf16", tmp_path,
                    record_every=3) as mon:
    losses = []
    for batch in batches:
      state, metrics = mon(state, batch)
      losses.append(float(metrics["loss"]))
    with pytest.raises(peat.PeatError, match="lock"):
      with peat.Monitor(step_fn, "golden", tmp_path):
        pass
  assert int(state.step) == len(batches) and np.all(np.isfinite(losses))
  recs = mon.records()
  # Calls 0, 3, 6 are recorded, at the two forward dense layers.
  assert sorted({r["step"] for r in recs}) == [0, 3, 6]
  assert len({r["site"] for r in recs}) == 2
  assert {r["diagnosis"]["model"] for r in recs} == {"precision:bf16"}
  assert mon.verdict().verdict == "warn"
  assert mon._run._cache_size() == 1 and mon._tapped._cache_size() == 1


def test_golden_monitor_passes_and_bad_input_is_named(tmp_path):
  step_fn, state, batches = _user_training()
  mon = peat.Monitor(step_fn, "golden", tmp_path / "g", record_every=2)
  for batch in batches[:4]:
    state, _ = mon(state, batch)
  assert {r["diagnosis"]["model"] for r in mon.records()} == {"exact"}
  assert mon.verdict().verdict == "pass"
  with pytest.raises(peat.PeatError, match="record_every"):
    peat.Monitor(step_fn, "golden", tmp_path, record_every=0)
  with pytest.raises(peat.PeatError):
    peat.Monitor(step_fn, "native:matmul:nope", tmp_path)
  with pytest.raises(peat.PeatError, match="no site of kernel 'softmax'"):
    peat.Monitor(step_fn, "native:softmax:default", tmp_path / "s")(
        state, batches[0])


def test_docs_example_runs_and_prints_what_the_docs_show(tmp_path):
  """docs/profiler.md's complete Monitor script, pasted into a file and run."""
  readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs",
                             "profiler.md")).read()
  section = readme[readme.index("### Inside your own training loop"):]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  shown = re.search(r"```text\n(.*?)```", section, re.S).group(1)
  (tmp_path / "example.py").write_text(code)
  out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.splitlines() == shown.splitlines()
  assert (tmp_path / "runs" / "my_model" / "monitor.msgpack").is_file()
