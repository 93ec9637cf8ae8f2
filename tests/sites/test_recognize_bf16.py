"""Stock bf16 Llama-style code, recognized without change.

A model written with stock Flax and JAX only (``nnx.Linear`` and
``nnx.RMSNorm`` with ``dtype=bfloat16, param_dtype=float32``,
``jax.nn.silu``, ``jax.nn.swish``, ``jax.nn.dot_product_attention`` with
fewer key/value heads than query heads): its SiLU calls and its
grouped-query attention are sites, with bf16 inputs and outputs, and the
golden step with recognition computes what it computes without.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import peat_jax as peat
from peat_jax import sites as sites_lib

D, HEADS, KV, HD = 32, 4, 2, 8
BF16 = jnp.bfloat16


class Block(nnx.Module):

  def __init__(self, rngs, act):
    lin = lambda i, o: nnx.Linear(i, o, use_bias=False, dtype=BF16,  # noqa: E731
                                  param_dtype=jnp.float32, rngs=rngs)
    self.norm = nnx.RMSNorm(D, dtype=BF16, param_dtype=jnp.float32,
                            rngs=rngs)
    self.q, self.k, self.v = lin(D, HEADS * HD), lin(D, KV * HD), lin(
        D, KV * HD)
    self.o = lin(HEADS * HD, D)
    self.gate, self.up, self.down = lin(D, 2 * D), lin(D, 2 * D), lin(
        2 * D, D)
    self.swish = act == "swish"

  def __call__(self, x):
    b, t, _ = x.shape
    h = self.norm(x)
    q = self.q(h).reshape(b, t, HEADS, HD)
    k = self.k(h).reshape(b, t, KV, HD)
    v = self.v(h).reshape(b, t, KV, HD)
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    x = x + self.o(y.reshape(b, t, HEADS * HD))
    g = self.gate(x)  # stock calls: jax.nn.swish is jax.nn.silu
    a = jax.nn.swish(g) if self.swish else jax.nn.silu(g)
    return x + self.down(a * self.up(x))


class Stock(nnx.Module):

  def __init__(self, rngs):
    self.embed = nnx.Embed(16, D, dtype=BF16, param_dtype=jnp.float32,
                           rngs=rngs)
    self.blocks = nnx.List([Block(rngs, "silu"), Block(rngs, "swish")])
    self.head = nnx.Linear(D, 16, dtype=BF16, param_dtype=jnp.float32,
                           rngs=rngs)

  def __call__(self, tokens):
    h = self.embed(tokens)
    for b in self.blocks:
      h = b(h)
    return self.head(h)


def _loss(model, batch):
  return optax.softmax_cross_entropy_with_integer_labels(
      model(batch["x"]).astype(jnp.float32), batch["y"]).mean()


def _batch_at(position):
  rng = np.random.default_rng(300 + int(position))
  return {"x": rng.integers(0, 16, (2, 12)).astype(np.int32),
          "y": rng.integers(0, 16, (2, 12)).astype(np.int32)}


@pytest.fixture(scope="module")
def task():
  return peat.nnx_task(lambda rngs: Stock(rngs), optax.adam(1e-2), _loss,
                       _batch_at, name="stock_bf16", default_steps=4,
                       default_checkpoint_every=2)


@pytest.fixture(scope="module")
def table(task):
  return peat.discover_sites(task.step_fn, task.init_state(0),
                             task.batch_at(0))


def test_silu_swish_and_grouped_attention_are_bf16_sites(table):
  fwd = {}
  for s in table:
    if s.phase == "fwd" and s.composite:
      fwd.setdefault(s.kernel, []).append(s)
  assert [s.name for s in fwd["silu"]] == ["fwd/Stock/Block/silu:0",
                                           "fwd/Stock/Block/silu:1"]
  assert all(s.in_dtypes == ("bfloat16",) and s.out_dtypes == ("bfloat16",)
             for s in fwd["silu"])
  assert [s.in_shapes for s in fwd["attention"]] == [
      ((2, 12, HEADS, HD), (2, 12, KV, HD), (2, 12, KV, HD))] * 2
  assert [s.in_dtypes for s in fwd["rms_norm"]] == [("bfloat16", "float32")] * 2
  assert {s.name for s in table if s.phase == "bwd" and s.kernel == "silu"} \
      == {"bwd/Stock/Block/silu:0", "bwd/Stock/Block/silu:1"}


def test_a_kut_gets_the_site_kernels_arguments(task):
  got = []

  def silu_kut(x):
    got.append(("silu", x.shape, x.dtype))
    return jax.nn.silu(x)

  def attention_kut(q, k, v, mask=None, **kw):
    got.append(("attention", (q.shape, k.shape, v.shape), kw))
    return jax.nn.dot_product_attention(q, k, v, mask=mask, **kw)

  jax.eval_shape(peat.substitute(
      task.step_fn, peat.Substitution(silu_kut, kernel="silu"),
      peat.Substitution(attention_kut, kernel="attention")),
      task.init_state(0), task.batch_at(0))
  assert ("silu", (2, 12, 2 * D), jnp.dtype(BF16)) in got
  assert ("attention", ((2, 12, HEADS, HD), (2, 12, KV, HD),
                        (2, 12, KV, HD)), {"is_causal": True}) in got


def test_recognized_golden_step_is_the_plain_step(task):
  """The golden kernel of a recognized site is the library call itself:
  the loss of the step traced with recognition is bitwise the plain one."""
  state, batch = task.init_state(0), task.batch_at(0)
  plain = jax.jit(task.step_fn)(state, batch)[1]
  marked = jax.jit(peat.substitute(task.step_fn, *[
      peat.Substitution(peat.GOLDEN, kernel=k)
      for k in ("silu", "attention", "rms_norm", "cross_entropy")]))(
          state, batch)[1]
  assert float(plain["loss"]) == float(marked["loss"])
  with sites_lib.recognition(False):
    off = peat.discover_sites(task.step_fn, state, batch)
  assert not any(s.composite for s in off)


def test_silu_reference_is_float64(table):
  x = np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32)
  up = np.random.default_rng(5).standard_normal((5, 7)).astype(np.float32)
  x64, up64 = x.astype(np.float64), up.astype(np.float64)
  want = x64 / (1 + np.exp(-x64))
  np.testing.assert_allclose(peat.reference_silu(x), want, rtol=1e-14)
  np.testing.assert_allclose(peat.reference_silu(x, up), want * up64,
                             rtol=1e-14)
  assert peat.reference_silu(jnp.asarray(x, BF16)).dtype == np.float64
