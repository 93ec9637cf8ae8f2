"""Composite sites of stock JAX/Flax/Optax code, recognized without change.

The model below is written with stock Flax only (nnx.LayerNorm,
nnx.MultiHeadAttention, nnx.RMSNorm, jax.nn.gelu, jax.nn.softmax, optax's
cross-entropy): no @peat.composite anywhere.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import peat_jax as peat
from peat_jax import sites as sites_lib

D, HEADS = 16, 2


class Block(nnx.Module):

  def __init__(self, rngs):
    self.ln = nnx.LayerNorm(D, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(HEADS, D, decode=False, rngs=rngs)
    self.rms = nnx.RMSNorm(D, rngs=rngs)
    self.up = nnx.Linear(D, 2 * D, rngs=rngs)
    self.down = nnx.Linear(2 * D, D, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.ln(x))
    return x + self.down(jax.nn.gelu(self.up(self.rms(x))))


class Stock(nnx.Module):

  def __init__(self, rngs):
    self.embed = nnx.Linear(4, D, rngs=rngs)
    self.blocks = nnx.List([Block(rngs) for _ in range(2)])
    self.pool = nnx.Linear(D, 1, rngs=rngs)
    self.head = nnx.Linear(D, 3, rngs=rngs)

  def __call__(self, x):
    h = self.embed(x)
    for b in self.blocks:
      h = b(h)
    w = jax.nn.softmax(self.pool(h)[..., 0])
    return self.head(jnp.einsum("bt,btd->bd", w, h))


def _loss(model, batch):
  return optax.softmax_cross_entropy_with_integer_labels(
      model(batch["x"]), batch["y"]).mean()


def _batch_at(position):
  rng = np.random.default_rng(100 + int(position))
  return {"x": rng.standard_normal((4, 6, 4)).astype(np.float32),
          "y": rng.integers(0, 3, 4).astype(np.int32)}


@pytest.fixture(scope="module")
def task():
  return peat.nnx_task(lambda rngs: Stock(rngs), optax.adam(1e-2), _loss,
                       _batch_at, name="stock", default_steps=4,
                       default_checkpoint_every=2)


@pytest.fixture(scope="module")
def state(task):
  return task.init_state(0)


COMPOSITES = [
    "fwd/Stock/Block/LayerNorm/layer_norm:0",
    "fwd/Stock/Block/MultiHeadAttention/attention:0",
    "fwd/Stock/Block/RMSNorm/rms_norm:0",
    "fwd/Stock/Block/gelu:0",
    "fwd/Stock/Block/LayerNorm/layer_norm:1",
    "fwd/Stock/Block/MultiHeadAttention/attention:1",
    "fwd/Stock/Block/RMSNorm/rms_norm:1",
    "fwd/Stock/Block/gelu:1",
    "fwd/Stock/softmax:0",
    "fwd/cross_entropy:0",
    "bwd/cross_entropy:0",
    "bwd/Stock/softmax:0",
    "bwd/Stock/Block/gelu:0",
    "bwd/Stock/Block/RMSNorm/rms_norm:0",
    "bwd/Stock/Block/MultiHeadAttention/attention:0",
    "bwd/Stock/Block/LayerNorm/layer_norm:0",
    "bwd/Stock/Block/gelu:1",
    "bwd/Stock/Block/RMSNorm/rms_norm:1",
    "bwd/Stock/Block/MultiHeadAttention/attention:1",
    "bwd/Stock/Block/LayerNorm/layer_norm:1",
]


def test_stock_model_has_named_composite_sites(task, state):
  table = peat.discover_sites(task.step_fn, state, task.batch_at(0))
  assert [s.name for s in table if s.composite] == COMPOSITES
  again = peat.discover_sites(task.step_fn, state, task.batch_at(0))
  assert again.names() == table.names()  # stable
  # The primitives of a recognized call are named under it.
  assert "fwd/Stock/Block/LayerNorm/layer_norm/rsqrt:0" in table.names()
  with sites_lib.recognition(False):
    plain = peat.discover_sites(task.step_fn, state, task.batch_at(0))
  assert not any(s.composite for s in plain)
  assert "fwd/Stock/Block/LayerNorm/rsqrt:0" in plain.names()


def test_routing_is_undone_after_every_trace(task, state):
  originals = (jax.nn.softmax, jax.nn.gelu, nnx.LayerNorm.__call__,
               optax.softmax_cross_entropy_with_integer_labels)
  with pytest.raises(TypeError):
    peat.discover_sites(lambda s: task.step_fn(s), state)  # fails mid-trace
  peat.discover_sites(task.step_fn, state, task.batch_at(0))
  assert (jax.nn.softmax, jax.nn.gelu, nnx.LayerNorm.__call__,
          optax.softmax_cross_entropy_with_integer_labels) == originals


def _recorder(store, kind):
  def kut(*args, **kwargs):
    store.append((kind, args, kwargs))
    fn = {"softmax": lambda x, axis=-1: jax.nn.softmax(x, axis=axis),
          "gelu": lambda x, approximate=False: jax.nn.gelu(
              x, approximate=approximate),
          "rms_norm": lambda x, s, eps: x * jax.lax.rsqrt(
              jnp.mean(x * x, -1, keepdims=True) + eps) * s,
          "layer_norm": lambda x, s, b, eps: (
              (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(
                  x.var(-1, keepdims=True) + eps) * s + b),
          "attention": lambda q, k, v, mask=None, **kw:
              jax.nn.dot_product_attention(q, k, v, mask=mask, **kw),
          "cross_entropy": lambda lg, lb, reduction="mean":
              optax.softmax_cross_entropy_with_integer_labels(lg, lb)}[kind]
    return fn(*args, **kwargs)
  return kut


def test_a_kut_receives_the_reference_composites_arguments(task, state):
  store = []
  subs = [peat.Substitution(_recorder(store, k), kernel=k, phase="fwd")
          for k in ("layer_norm", "attention", "rms_norm", "gelu", "softmax",
                    "cross_entropy")]
  jax.eval_shape(peat.substitute(task.step_fn, *subs), state,
                 task.batch_at(0))
  got = {}
  for kind, args, kwargs in store:
    got.setdefault(kind, ([tuple(getattr(a, "shape", a)) if hasattr(
        a, "shape") else a for a in args], kwargs))
  assert got["layer_norm"] == ([(4, 6, D), (D,), (D,), 1e-6], {})
  assert got["rms_norm"] == ([(4, 6, D), (D,), 1e-6], {})
  assert got["attention"] == ([(4, 6, HEADS, D // HEADS)] * 3, {})
  assert got["gelu"] == ([(4, 6, 2 * D)], {"approximate": True})
  assert got["softmax"] == ([(4, 6)], {})
  assert got["cross_entropy"] == ([(4, 3), (4,)], {"reduction": "none"})


def _golden_everywhere(step):
  kinds = ("layer_norm", "attention", "rms_norm", "gelu", "softmax",
           "cross_entropy")
  return peat.substitute(step, *[peat.Substitution(
      peat.GOLDEN, kernel=k) for k in kinds])


def test_recognized_golden_step_is_the_plain_step(task, state):
  """Forward values bitwise; gradients bitwise but where a recognized
  call's input also feeds a residual (partial sums in another order)."""
  batch = task.batch_at(0)
  plain = jax.jit(task.step_fn)(state, batch)[1]
  marked = jax.jit(_golden_everywhere(task.step_fn))(state, batch)[1]
  assert float(plain["loss"]) == float(marked["loss"])   # bitwise
  forward = jax.jit(task.model_fn)
  traced_fwd = jax.jit(peat.substitute(
      task.model_fn, peat.Substitution(peat.GOLDEN, kernel="attention")))
  np.testing.assert_array_equal(forward(state.params, batch["x"]),
                                traced_fwd(state.params, batch["x"]))
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: Stock(nnx.Rngs(0))))
  grads = lambda p: jax.grad(  # noqa: E731
      lambda p: _loss(nnx.merge(graphdef, p), batch))(p)
  g_plain = jax.jit(grads)(state.params)
  g_marked = jax.jit(_golden_everywhere(grads))(state.params)
  differ = 0
  scale = max(float(np.max(np.abs(a))) for a in jax.tree.leaves(g_plain))
  for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_marked)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * scale)
    differ += not np.array_equal(a, b)
  assert 0 < differ < len(jax.tree.leaves(g_plain))


def test_without_fan_out_gradients_are_bitwise_too():
  ln = nnx.LayerNorm(D, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(ln)
  x = jnp.asarray(np.random.default_rng(2).standard_normal((8, D)),
                  jnp.float32)

  def step(p, x):
    def loss(p, x):
      y = jax.nn.gelu(nnx.merge(graphdef, p)(x))
      return optax.softmax_cross_entropy_with_integer_labels(
          jax.nn.log_softmax(y), jnp.arange(8) % D).mean()
    return jax.grad(loss, argnums=(0, 1))(p, x)

  plain = jax.jit(step)(params, x)
  marked = jax.jit(peat.substitute(step, *[peat.Substitution(
      peat.GOLDEN, kernel=k) for k in ("layer_norm", "gelu", "log_softmax",
                                       "cross_entropy")]))(params, x)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(marked)):
    np.testing.assert_array_equal(a, b)


def test_golden_run_is_bitwise_with_and_without_recognition(task, state,
                                                            tmp_path):
  peat.discover_sites(task.step_fn, state, task.batch_at(0))  # routes, undoes
  on = peat.golden_train(task, tmp_path / "on", steps=3, checkpoint_every=3,
                         evaluate=False)
  with sites_lib.recognition(False):
    off = peat.golden_train(task, tmp_path / "off", steps=3,
                            checkpoint_every=3, evaluate=False)
  a, b = peat.read_log(on.workdir), peat.read_log(off.workdir)
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  pa = peat.restore_state(on.workdir, task).params
  pb = peat.restore_state(off.workdir, task).params
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    np.testing.assert_array_equal(x, y)


def test_calls_outside_the_table_stay_primitives():
  x = jnp.ones((3, 4, 5))
  mask = jnp.asarray(np.random.default_rng(0).random((3, 4, 5)) > 0.5)
  q = jnp.ones((2, 4, 2, 8))
  ln = nnx.LayerNorm(5, rngs=nnx.Rngs(0))

  def f(x, q):
    return (jax.nn.softmax(x, where=mask).sum()
            + jax.nn.softmax(x, axis=(0, 1)).sum()
            + ln(x, mask=mask).sum()
            + jax.nn.dot_product_attention(q, q, q,
                                           local_window_size=(1, 1)).sum())
  table = peat.discover_sites(f, x, q)
  # Only the softmax that the unrecognized attention itself calls.
  assert [s.name for s in table if s.composite] == ["fwd/softmax:0"]


@peat.composite("softmax")
def _marked_softmax(x):
  return jax.nn.softmax(x)   # the marked function's own call: no new site


def test_a_marked_composite_stays_one_site():
  table = peat.discover_sites(
      jax.grad(lambda x: jnp.sum(jnp.sin(_marked_softmax(x)))), jnp.ones(5))
  assert [s.name for s in table if s.composite] == ["fwd/softmax:0",
                                                     "bwd/softmax:0"]


def test_every_backward_dot_of_a_stock_transformer_pairs(task, state):
  """nnx.MultiHeadAttention's q, k and v projections read one input: each
  weight cotangent first matches all three forward calls, and is told
  apart by its partner (the other operand's transposition), which pairs
  uniquely."""
  batch = task.batch_at(0)
  table = peat.discover_sites(task.step_fn, state, batch)
  fwd = [s.name for s in table
         if s.kernel == "dot_general" and s.phase == "fwd"]
  bwd = {s.name for s in table
         if s.kernel == "dot_general" and s.phase == "bwd"}
  found = sites_lib.backward_sites(task.step_fn, state, batch, forward=fwd)
  paired = {b.site.name for b in found if b.site.kernel == "dot_general"}
  assert paired == bwd
  assert len({b.forward for b in found
              if b.site.kernel == "dot_general"}) == len(fwd)
