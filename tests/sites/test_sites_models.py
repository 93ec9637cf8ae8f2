"""Site discovery, substitution and taps on every model in peat_jax.models."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from peat_jax import sites as _sites
from peat_jax import sites as S
from peat_jax import models
from peat_jax.kernels import kut as K

# Small configs: discovery only traces; substitution compiles the step.
SMALL = {
    "cnn": dict(batch_size=8, model_kwargs=dict(width=4)),
    "vit": dict(batch_size=8, model_kwargs=dict(dim=16, depth=2, heads=2)),
    "gpt": dict(batch_size=2, context=16, model_kwargs=dict(dim=16, depth=2, heads=2)),
}

# One block for the tests that compile the step (compilation dominates).
RUN = {
    "cnn": SMALL["cnn"],
    "vit": dict(batch_size=8, model_kwargs=dict(dim=16, depth=1, heads=2)),
    "gpt": dict(batch_size=2, context=16, model_kwargs=dict(dim=16, depth=1, heads=2)),
}

# Site counts per (kernel, phase) of each model's train step (depth 2 for the
# transformers: every Block-level count is twice the per-block count).
EXPECTED = {
    "cnn": {("conv_general_dilated", "fwd"): 3, ("conv_general_dilated", "bwd"): 5,
            ("dot_general", "fwd"): 1, ("dot_general", "bwd"): 2,
            ("cross_entropy", "fwd"): 1, ("cross_entropy", "bwd"): 1},
    "vit": {("dot_general", "fwd"): 14, ("dot_general", "bwd"): 29,
            ("attention", "fwd"): 2, ("attention", "bwd"): 2,
            ("softmax", "fwd"): 2, ("softmax", "bwd"): 4,
            ("layer_norm", "fwd"): 5, ("layer_norm", "bwd"): 5,
            ("gelu", "fwd"): 2, ("gelu", "bwd"): 2,
            ("cross_entropy", "fwd"): 1, ("cross_entropy", "bwd"): 1},
    "gpt": {("dot_general", "fwd"): 13, ("dot_general", "bwd"): 28,
            ("attention", "fwd"): 2, ("attention", "bwd"): 2,
            ("softmax", "fwd"): 2, ("softmax", "bwd"): 4,
            ("layer_norm", "fwd"): 5, ("layer_norm", "bwd"): 5,
            ("gelu", "fwd"): 2, ("gelu", "bwd"): 2,
            ("cross_entropy", "fwd"): 1, ("cross_entropy", "bwd"): 1},
}


def fresh_state(task, seed=0):
  """A seeded random TrainState with the task's structure.

  Built from ``jax.eval_shape(task.init_state)`` with numpy draws, which avoids
  the eager initialisers (seconds of compilation each on 2 cores).
  """
  shapes = jax.eval_shape(lambda: task.init_state(seed))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      x = rng.standard_normal(leaf.shape).astype(leaf.dtype)
      if "params" in str(path[0]):
        return jnp.asarray(x / np.sqrt(leaf.shape[-2]) if leaf.ndim >= 2 else 0.1 * x)
      return jnp.asarray(np.abs(x) * 1e-3)  # optimizer moments (nu >= 0)
    if "rng" in str(path[0]):
      return jnp.asarray(rng.integers(0, 2**31, leaf.shape), leaf.dtype)
    return jnp.zeros(leaf.shape, leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.cache
def setup(name, run=False):
  task = models.get_task(name, **(RUN if run else SMALL)[name])
  return task, fresh_state(task)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_site_counts_per_kernel_and_phase(name):
  task, state = setup(name)
  sites = _sites.discover_sites(task.step_fn, state, task.batch_at(0))
  counts = sites.counts()
  got = {k: counts.get(k, 0) for k in EXPECTED[name]}
  assert got == EXPECTED[name], sites.counts_table()
  assert counts.get(("sqrt", "upd"), 0) > 0  # Adam's update
  # The jitted train_step and the un-jitted step_fn give the same names.
  again = _sites.discover_sites(task.train_step, state, task.batch_at(0))
  assert again.names() == sites.names()


def test_transformer_site_names():
  task, state = setup("gpt")
  names = set(_sites.discover_sites(task.step_fn, state, task.batch_at(0)).names())
  for n in ["fwd/Gpt/Block/MultiHeadAttention/attention:1",
            "fwd/Gpt/Block/MultiHeadAttention/attention/softmax:0",
            "bwd/Gpt/Block/MultiHeadAttention/attention:0",
            "fwd/Gpt/Block/LayerNorm/layer_norm:3", "fwd/Gpt/LayerNorm/layer_norm:0",
            "fwd/Gpt/Block/Mlp/gelu:1", "fwd/cross_entropy:0", "bwd/Gpt/Linear/dot_general:1"]:
    assert n in names


@pytest.mark.parametrize("name", [
    "cnn",
    pytest.param("vit", marks=pytest.mark.slow),
    pytest.param("gpt", marks=pytest.mark.slow),
])
def test_golden_for_golden_bitwise(name):
  task, state = setup(name, run=True)
  sub = jax.jit(S.substitute(task.step_fn, S.Substitution(S.GOLDEN, phase=("fwd", "bwd", "upd"))))
  a, b = state, state
  for i in range(2):
    a, ma = task.train_step(a, task.batch_at(i))
    b, mb = sub(b, task.batch_at(i))
  for x, y in zip(jax.tree.leaves((a, ma)), jax.tree.leaves((b, mb))):
    np.testing.assert_array_equal(x, y)


def _bf16_attention(q, k, v, mask=None):
  """A KUT for the attention composite: scores and weights in bfloat16."""
  bf = jnp.bfloat16
  s = jnp.einsum("bthd,bshd->bhts", q.astype(bf), k.astype(bf)) / jnp.sqrt(
      jnp.asarray(q.shape[-1], bf))
  if mask is not None:
    s = jnp.where(mask, s, jnp.finfo(bf).min)
  w = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(bf)
  return jnp.einsum("bhts,bshd->bthd", w, v.astype(bf)).astype(q.dtype)


@pytest.mark.slow
def test_gpt_attention_kut_taps_and_substitution():
  task, state = setup("gpt", run=True)
  batch = task.batch_at(0)
  sel = S.Substitution(_bf16_attention, kernel="attention", phase="fwd")
  (out, metrics), taps = jax.jit(S.tap(task.step_fn, sel))(state, batch)
  assert sorted(taps) == ["fwd/Gpt/Block/MultiHeadAttention/attention:0"]
  for t in taps.values():
    assert [x.shape for x in t.inputs] == [(2, 16, 2, 8)] * 3 + [(1, 1, 16, 16)]
    err = np.abs(np.asarray(t.kut) - np.asarray(t.golden))
    assert 0 < err.max() < 0.1  # bf16 rounding: a real, small pseudo-error
  plain = task.train_step(state, batch)
  np.testing.assert_array_equal(metrics["loss"], plain[1]["loss"])  # continued on golden
  sub, sub_metrics = jax.jit(S.substitute(task.step_fn, sel))(state, batch)
  assert sub_metrics["loss"] != plain[1]["loss"]
  np.testing.assert_allclose(sub_metrics["loss"], plain[1]["loss"], rtol=1e-2)


def test_cnn_conv_kut_on_backward_sites_only():
  task, state = setup("cnn", run=True)
  batch = task.batch_at(0)

  def conv_kut(lhs, rhs, **params):
    return lax.conv_general_dilated_p.bind(lhs, rhs, **params) * jnp.float32(0.5)

  _, taps = jax.jit(S.tap(task.step_fn, S.Substitution(conv_kut, kernel="conv_general_dilated",
                                                       phase="bwd")))(state, batch)
  assert len(taps) == 5 and all(n.startswith("bwd/Cnn/Conv/") for n in taps)
  for t in taps.values():
    np.testing.assert_allclose(t.kut, 0.5 * np.asarray(t.golden), rtol=1e-6)


# Backward sites of each model: what backward="kut" runs there.
PAIRED = {  # kernel -> bwd sites whose kind is "vjp" / "recompute"
    "cnn": {"conv_general_dilated": (5, 0), "dot_general": (2, 0)},
    "vit": {"dot_general": (27, 2)},
    "gpt": {"dot_general": (26, 2)},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_backward_site_of_every_model_pairs_with_a_forward_site(name):
  """Every transposed site transposes a forward site (with its operands
  reachable where it runs), recomputations inside the composites'
  backward sites recompute one, and each composite's backward site is
  paired with its forward site."""
  task, state = setup(name)
  batch = task.batch_at(0)
  table = S.discover_sites(task.step_fn, state, batch)
  kernels = {s.kernel for s in table if s.composite} | {
      "dot_general", "conv_general_dilated"}
  fwd = [s.name for s in table if s.phase == "fwd" and s.kernel in kernels]
  found = S.backward_sites(task.step_fn, state, batch, forward=fwd)
  bwd = {s.name for s in table if s.phase == "bwd" and s.kernel in kernels}
  assert {b.site.name for b in found} == bwd
  for kernel, (n_vjp, n_recompute) in PAIRED[name].items():
    mine = [b for b in found if b.site.kernel == kernel]
    assert sum(b.kind == "vjp" for b in mine) == n_vjp
    assert sum(b.kind == "recompute" for b in mine) == n_recompute
    assert all(b.forward in fwd for b in mine), kernel
  # A composite's backward site belongs to its forward site; one nested in
  # another composite's backward site (softmax in attention's) belongs to
  # a recomputation there and is selected by kernel and module path.
  # The backward pass runs in reverse: backward ordinal i of n belongs to
  # forward ordinal n - 1 - i.
  composites = [b for b in found if b.kind == "composite_vjp"]
  assert composites
  by_name = table.by_name()
  for b in composites:
    if "composite" in b.site.where:
      assert b.forward is None, b
      continue
    f = by_name[b.forward]
    n = sum(1 for c in composites if (c.site.kernel, c.site.path) == (
        b.site.kernel, b.site.path) and "composite" not in c.site.where)
    assert (f.kernel, f.path, f.ordinal) == (
        b.site.kernel, b.site.path, n - 1 - b.site.ordinal), b


@pytest.mark.slow
def test_gpt_native_matmul_vjp_at_every_backward_site():
  """native:matmul:in_bf16 with backward="kut" on the GPT: its VJP (the
  native backward target) at the Linear layers and at the attention's
  products inside the composite's backward site."""
  task, state = setup("gpt", run=True)
  batch = task.batch_at(0)
  kut = K.kut_callable("native:matmul:in_bf16")
  _, taps = jax.jit(S.tap(task.step_fn, S.Substitution(
      kut, kernel="dot_general", phase="fwd", backward="kut")))(state, batch)
  bwd = [n for n in taps if n.startswith("bwd/")]
  assert len(bwd) == 15  # depth 1: 13 transposed, 2 recomputed
  for n in bwd:
    k, g = np.asarray(taps[n].kut), np.asarray(taps[n].golden)
    scale = np.abs(g).max()
    assert 0 < np.abs(k - g).max() < 2**-6 * scale * g.size ** 0.5, n
