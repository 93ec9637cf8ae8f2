"""Tests of the reference models and their train steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import models

# Small configs keep each case to a few seconds on 2 cores.
SMALL = {
    "cnn": dict(batch_size=32),
    "vit": dict(batch_size=32, model_kwargs=dict(dim=32, depth=1, heads=2)),
    "gpt": dict(batch_size=4, context=32,
                model_kwargs=dict(dim=32, depth=1, heads=2)),
}
OUT_SHAPE = {"cnn": (32, 10), "vit": (32, 10), "gpt": (4, 32, 256)}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_forward_shapes_and_finite(name):
  task = models.get_task(name, **SMALL[name])
  state = task.init_state(0)
  batch = task.batch_at(0)
  inputs = batch["x"] if "x" in batch else batch["tokens"]
  out = jax.jit(task.model_fn)(state.params, inputs)
  assert out.shape == OUT_SHAPE[name] and out.dtype == jnp.float32
  assert bool(jnp.isfinite(out).all())


@pytest.mark.parametrize("name", sorted(SMALL))
def test_train_step_learns_without_recompiling(name):
  task = models.get_task(name, **SMALL[name], lr=3e-3, warmup=1)
  state = task.init_state(0)
  losses = []
  for position in range(40):
    state, metrics = task.train_step(state, task.batch_at(position))
    losses.append(float(metrics["loss"]))
  assert task.train_step._cache_size() == 1  # one compilation for 40 steps
  assert int(state.step) == 40 and int(state.data_position) == 40
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
  assert set(metrics) >= {"loss", "grad_norm", "update_norm"}
  assert all(np.isfinite(float(v)) for v in metrics.values())


def test_step_fn_is_pure():
  task = models.get_task("cnn", **SMALL["cnn"])
  state = task.init_state(1)
  batch = task.batch_at(0)
  a, _ = task.train_step(state, batch)
  b, _ = task.train_step(state, batch)  # same inputs, same outputs, bitwise
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # The input state was not changed in place.
  assert int(state.step) == 0


def test_unknown_scenario_and_key_are_named():
  with pytest.raises(peat.PeatError, match="unknown scenario 'resnet'.*cnn"):
    models.get_task("resnet")
  with pytest.raises(peat.PeatError, match="unknown config keys.*'depht'"):
    models.get_task("cnn", depht=3)


def test_finetune_needs_a_pretraining_checkpoint(tmp_path):
  with pytest.raises(peat.PeatError, match="init_from=.*'cnn_04'"):
    models.get_task("cnn_finetune")
  with pytest.raises(peat.PeatError, match="trains from scratch"):
    models.get_task("cnn", init_from=str(tmp_path))
  pre = peat.golden_train(models.get_task("cnn_04", batch_size=32),
                          tmp_path / "pre", steps=3, checkpoint_every=3)
  task = models.get_task("cnn_finetune", init_from=str(tmp_path / "pre"),
                         batch_size=32)
  state = task.init_state(5)
  for layer in ("conv1", "conv2", "conv3"):
    np.testing.assert_array_equal(state.params[layer]["kernel"],
                                  pre.state.params[layer]["kernel"])
  fresh = models.get_task("cnn_04", batch_size=32).init_state(5).params
  np.testing.assert_array_equal(state.params["head"]["kernel"],
                                fresh["head"]["kernel"])
  assert int(state.step) == 0
