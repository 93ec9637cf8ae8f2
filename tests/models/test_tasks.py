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
    "llama": dict(batch_size=4, context=32,
                  model_kwargs=dict(dim=32, depth=1, heads=4, kv_heads=2,
                                    hidden=64)),
    "vit_bf16": dict(batch_size=32, model_kwargs=dict(dim=32, depth=1,
                                                      heads=2)),
}
OUT_SHAPE = {"cnn": (32, 10), "vit": (32, 10), "gpt": (4, 32, 256),
             "llama": (4, 32, 256), "vit_bf16": (32, 10)}
#: The compute dtype of each scenario's outputs (bf16 mixed precision:
#: float32 parameters, bfloat16 activations).
OUT_DTYPE = {"llama": jnp.bfloat16, "vit_bf16": jnp.bfloat16}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_forward_shapes_and_finite(name):
  task = models.get_task(name, **SMALL[name])
  state = task.init_state(0)
  batch = task.batch_at(0)
  inputs = batch["x"] if "x" in batch else batch["tokens"]
  out = jax.jit(task.model_fn)(state.params, inputs)
  assert out.shape == OUT_SHAPE[name]
  assert out.dtype == OUT_DTYPE.get(name, jnp.float32)
  assert bool(jnp.isfinite(out).all())
  # Parameters stay float32 in every scenario (bf16 ones compute in bf16).
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {
      jnp.dtype(jnp.float32)}


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


@pytest.mark.parametrize("name", ["llama", "vit_bf16"])
def test_bf16_scenarios_compute_in_bf16_with_a_float32_loss(name):
  """Every site of the forward pass but the loss has bfloat16 outputs; the
  loss (cross-entropy of the logits cast to float32) is float32, and so are
  the gradients and the optimizer's update."""
  task = models.get_task(name, **SMALL[name])
  state = task.init_state(0)
  batch = task.batch_at(0)
  table = peat.discover_sites(task.step_fn, state, batch)
  kinds = ("dot_general", "attention", "rms_norm", "layer_norm", "silu",
           "rope", "gelu", "softmax")
  # Sites of the model itself, not the golden kernels' insides (XLA's
  # attention computes its logits in float32).
  fwd = [s for s in table if s.phase == "fwd" and s.kernel in kinds
         and not set(s.path.split("/")) & {"attention"}]
  assert fwd and {d for s in fwd for d in s.out_dtypes} == {"bfloat16"}
  ce = [s for s in table if s.phase == "fwd" and s.kernel == "cross_entropy"]
  assert [s.in_dtypes[0] for s in ce] == ["float32"]
  new, metrics = task.train_step(state, batch)
  assert metrics["loss"].dtype == jnp.float32
  assert {x.dtype for x in jax.tree.leaves(new.params)} == {
      jnp.dtype(jnp.float32)}


def test_llama_has_its_kernels_as_sites():
  """RMSNorm (nnx.RMSNorm, recognized), RoPE on queries and keys (fewer key
  heads), grouped-query attention through jax.nn.dot_product_attention,
  the SwiGLU activation as a silu site with two operands; no biases."""
  task = models.get_task("llama", **SMALL["llama"])
  state = task.init_state(0)
  table = peat.discover_sites(task.step_fn, state, task.batch_at(0))
  fwd = {}
  for s in table:
    if s.phase == "fwd":
      fwd.setdefault(s.kernel, []).append(s)
  assert len(fwd["rms_norm"]) == 3  # two per block and the final one
  assert [s.in_shapes[0] for s in fwd["rope"]] == [(4, 32, 4, 8),
                                                   (4, 32, 2, 8)]
  (att,) = fwd["attention"]
  assert att.in_shapes == ((4, 32, 4, 8), (4, 32, 2, 8), (4, 32, 2, 8))
  (act,) = fwd["silu"]
  assert act.in_shapes == ((4, 32, 64), (4, 32, 64))
  assert not any("bias" in "/".join(map(str, p)) for p, _ in
                 jax.tree_util.tree_flatten_with_path(state.params)[0])


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
