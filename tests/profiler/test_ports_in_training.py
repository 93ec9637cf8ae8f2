"""Port mismatches and a benign split-K matmul in training (playback).

The KUTs are plain JAX ports (peat_jax.kernels.ports) registered at the
composite sites of a small model trained for real: a dense layer, layer
norm, GELU, softmax gating and a 40-class head (40 = 2 x 16 + 8: a partial
last tile). Each port must be named by its cause at every checkpoint, with
the constant estimated where the probe fits one; the split-K matmul, whose
partial last tile sums its K terms in two halves, must pass.
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import peat_jax as peat
from peat_jax.kernels import ports
from peat_jax.models import layers

pytestmark = pytest.mark.slow  # six KUTs compiled and played: ~1 minute

_TX = optax.adam(1e-2)


def _step(state, batch):
  def loss_fn(p):
    h = batch["x"] @ p["w1"]
    h = layers.layer_norm(h, p["scale"], p["bias"])
    h = layers.gelu(h)
    h = h * layers.softmax(h)
    logp = jax.nn.log_softmax(h @ p["w2"])
    return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], 1))

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt = _TX.update(grads, state.opt_state, state.params)
  return (state._replace(step=state.step + 1,
                         params=optax.apply_updates(state.params, updates),
                         opt_state=opt,
                         data_position=state.data_position + 1),
          {"loss": loss, "grad_norm": optax.tree.norm(grads),
           "update_norm": optax.tree.norm(updates)})


def _init(seed):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  params = {"w1": 0.15 * f(24, 96), "scale": 1.0 + 0.1 * f(96),
            "bias": 0.1 * f(96), "w2": 0.2 * f(96, 40)}
  return peat.TrainState(jnp.zeros((), jnp.int32), params, _TX.init(params),
                         jax.random.PRNGKey(seed), jnp.zeros((), jnp.int32))


def _batch(position):
  rng = np.random.default_rng(500 + int(position))
  return {"x": rng.standard_normal((32, 24)).astype(np.float32),
          "y": rng.integers(0, 40, 32).astype(np.int32)}


TASK = peat.TrainTask(
    name="ports_task", config={"batch": 32}, init_state=_init, step_fn=_step,
    train_step=jax.jit(_step), batch_at=_batch, evaluate=lambda state: {},
    default_steps=6, default_checkpoint_every=3, model_fn=None)


def _split_k_dot(lhs, rhs, *, dimension_numbers, precision=None,
                 preferred_element_type=None, **unused):
  """A correct matmul whose last partial 16-column tile sums its K terms
  in two halves (as a split-K kernel's edge path does)."""
  del unused, precision, preferred_element_type
  out = lax.dot_general(lhs, rhs, dimension_numbers)
  (lc, rc), _ = dimension_numbers
  if out.ndim != 2 or len(lc) != 1 or out.shape[1] % 16 == 0:
    return out
  k, w = lhs.shape[lc[0]], out.shape[1] % 16
  h = k // 2
  part = lambda s: lax.dot_general(
      lax.slice_in_dim(lhs, s.start, s.stop, axis=lc[0]),
      lax.slice_in_dim(rhs, s.start, s.stop, axis=rc[0]), dimension_numbers)
  edge = part(slice(0, h)) + part(slice(h, k))
  return out.at[:, -w:].set(edge[:, -w:])


KUTS = {
    "test:ln_eps_1e-5": (functools.partial(ports.layer_norm_eps,
                                           port_eps=1e-5), "layer_norm",
                         "parameter"),
    "test:ln_eps_in_std": (ports.layer_norm_eps_std, "layer_norm",
                           "parameter"),
    "test:ln_fast_rsqrt": (ports.layer_norm_fast_rsqrt, "layer_norm",
                           "approximation"),
    "test:gelu_tanh": (ports.gelu_tanh, "gelu", "approximation"),
    "test:softmax_fast_exp": (ports.softmax_fast_exp, "softmax",
                              "approximation"),
    "test:split_k_edge": (_split_k_dot, "dot_general", None),
}
for _name, (_fn, _kernel, _) in KUTS.items():
  peat.register_kut(_name, _fn, kernel=_kernel)


@pytest.fixture(scope="module")
def played(tmp_path_factory):
  d = tmp_path_factory.mktemp("ports")
  golden = peat.golden_train(TASK, str(d / "golden"), steps=6,
                             checkpoint_every=3, seed=0).workdir
  return peat.playback_many(TASK, golden, list(KUTS), campaign_dir=d / "c")


@pytest.mark.parametrize("spec", [s for s, v in KUTS.items() if v[2]])
def test_port_is_named_by_its_cause_at_every_checkpoint(played, spec):
  _, kernel, want = KUTS[spec]
  recs = [r for r in played[spec].records if r["kernel"] == kernel]
  assert len(recs) >= 2  # one per checkpoint
  for r in recs:
    d = r["diagnosis"]
    assert d["model"] == want, (r["site"], r["step"], d["evidence"])
    assert d["verdict"] in ("warn", "fail")
  if spec == "test:ln_eps_1e-5":
    assert all("1e-05" in r["diagnosis"]["evidence"] for r in recs), [
        r["diagnosis"]["evidence"] for r in recs]


def test_split_k_matmul_with_a_partial_last_tile_passes(played):
  recs = played["test:split_k_edge"].records
  assert recs and all(r["kernel"] == "dot_general" for r in recs)
  # The head (40 columns: a partial tile of 8) differs from golden there.
  head = [r for r in recs if r["signature"]["share_differ"] > 0]
  assert head, "the split-K edge must change some output"
  for r in recs:
    assert r["diagnosis"]["verdict"] == "pass", (r["site"],
                                                 r["diagnosis"]["evidence"])
