"""A tiny task (one dense layer, softmax cross-entropy) on public names only.

Shared by the generator of the pre-move campaign fixture (``make.py``, run
with peat_jax at commit 7e3e18d, before the component packages) and by the
test that reads that campaign with today's peat_jax.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import peat_jax as peat

_TX = optax.sgd(0.1)


def _step_fn(state, batch):
  def loss_fn(params):
    logits = batch["x"] @ params["w"] + params["b"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], 1))

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt = _TX.update(grads, state.opt_state, state.params)
  new = state._replace(step=state.step + 1,
                       params=optax.apply_updates(state.params, updates),
                       opt_state=opt, data_position=state.data_position + 1)
  return new, {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "update_norm": optax.tree.norm(updates)}


def _init_state(seed):
  rng = np.random.default_rng(seed)
  params = {"w": jnp.asarray(0.3 * rng.standard_normal((32, 10)),
                             jnp.float32),
            "b": jnp.zeros((10,), jnp.float32)}
  return peat.TrainState(jnp.zeros((), jnp.int32), params, _TX.init(params),
                         jax.random.PRNGKey(seed), jnp.zeros((), jnp.int32))


def _batch_at(position):
  rng = np.random.default_rng(700 + int(position))
  return {"x": rng.standard_normal((16, 32)).astype(np.float32),
          "y": rng.integers(0, 10, 16).astype(np.int32)}


def get_task():
  return peat.TrainTask(
      name="tiny_old", config={"batch": 16, "width": 32}, init_state=_init_state,
      step_fn=_step_fn, train_step=jax.jit(_step_fn), batch_at=_batch_at,
      evaluate=lambda state: {}, default_steps=6, default_checkpoint_every=2,
      model_fn=None)


#: The campaign's settings (validate keywords), the same in both versions.
SETTINGS = dict(steps=6, checkpoint_every=2, frequencies=("every",),
                runtime_steps=4, scenario="tiny_old", progress=None)
KUT = "native:matmul:in_bf16"
