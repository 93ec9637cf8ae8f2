"""Tests of site discovery, substitution, taps and schedules (peat_jax.sites._discovery*).

The small Flax nnx + Optax train steps below cover the constructs a real step
uses: plain layers with composites, a conv net, attention blocks under
``nnx.scan`` with ``nnx.remat``, a ``cond``, a ``vmap`` and a nested ``jit``.
"""

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax import lax

from peat_jax import sites as _sites
from peat_jax import sites as S
from peat_jax.sites import composite, composite_call
from peat_jax.core import PeatError
from peat_jax.profiler import TrainState

# ---------------------------------------------------------------------------
# Small models and train steps


@composite("softmax")
def softmax(x, axis=-1):
  return jax.nn.softmax(x, axis=axis)


@composite("gelu")
def gelu(x):
  return jax.nn.gelu(x)


@composite("cross_entropy")
def cross_entropy(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@composite("attention")
def attention(q, k, v):
  s = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
  return jnp.einsum("bts,bsd->btd", softmax(s), v)


class MLP(nnx.Module):

  def __init__(self, rngs):
    self.l1 = nnx.Linear(8, 16, rngs=rngs)
    self.ln = nnx.LayerNorm(16, rngs=rngs)
    self.l2 = nnx.Linear(16, 4, rngs=rngs)

  def __call__(self, x):
    h = composite_call("layer_norm", self.ln, self.l1(x))
    return self.l2(gelu(h))


class ConvNet(nnx.Module):

  def __init__(self, rngs):
    self.conv = nnx.Conv(1, 4, (3, 3), rngs=rngs)
    self.head = nnx.Linear(4 * 4 * 4, 4, rngs=rngs)

  def __call__(self, x):
    h = nnx.relu(self.conv(x))
    h = nnx.avg_pool(h, (2, 2), strides=(2, 2))
    return self.head(h.reshape(h.shape[0], -1))


class Block(nnx.Module):

  def __init__(self, d, rngs):
    self.qkv = nnx.Linear(d, 3 * d, rngs=rngs)
    self.out = nnx.Linear(d, d, rngs=rngs)

  def __call__(self, x):
    q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
    h = x + self.out(attention(q, k, v))
    # A data-dependent branch (cond) inside the scanned, rematted body.
    return lax.cond(h.sum() > 0, lambda h: h * 0.5, lambda h: jnp.tanh(h), h)


class ScanNet(nnx.Module):

  def __init__(self, rngs, d=8, layers=3):
    @nnx.split_rngs(splits=layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return Block(d, rngs)

    self.blocks = make(rngs)
    self.head = nnx.Linear(d, 4, rngs=rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    @nnx.remat
    def body(block, x):
      return block(x)

    h = body(self.blocks, x)
    return self.head(h.mean(axis=1))


def _per_example_norm(x):
  return x / jnp.sqrt(jnp.sum(x * x) + 1.0)


def _make_task(model_cls, opt, xshape, seed=0):
  """Returns ``(step_fn, init_state, batch_at)`` for a 4-class classifier."""
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_cls(nnx.Rngs(seed))), nnx.Param)

  def loss_fn(params, x, y):
    m = nnx.merge(graphdef, params)
    # vmap: a per-example op, and a nested jit.
    x = jax.vmap(jax.jit(_per_example_norm))(x)
    return cross_entropy(m(x), y)

  def step_fn(state, batch):
    x, y = batch
    loss, grads = jax.value_and_grad(loss_fn)(state.params, x, y)
    updates, opt_state = opt.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return TrainState(state.step + 1, params, opt_state, state.rng, state.data_position + 1), metrics

  def init_state():
    # Fresh seeded random parameters drawn with numpy: no XLA compilation of
    # initializers (slow on a loaded 2-core machine).
    rng = np.random.default_rng(seed)
    shapes = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: model_cls(nnx.Rngs(seed))),
                                        nnx.Param))

    def draw(path, leaf):
      x = rng.standard_normal(leaf.shape).astype(np.float32)
      if path[-1].key == "scale":
        return jnp.asarray(1.0 + 0.1 * x)
      return jnp.asarray(x / np.sqrt(leaf.shape[-2]) if leaf.ndim >= 2 else 0.1 * x)

    params = jax.tree_util.tree_map_with_path(draw, shapes)
    return TrainState(jnp.int32(0), params, opt.init(params),
                      jax.random.key_data(jax.random.key(seed)), jnp.int32(0))

  def batch_at(pos):
    rng = np.random.default_rng([seed, pos])
    return (rng.standard_normal(xshape, dtype=np.float32),
            rng.integers(0, 4, (xshape[0],), dtype=np.int32))

  return step_fn, init_state, batch_at


TASKS = {
    "mlp": lambda: _make_task(MLP, optax.adam(1e-2), (6, 8)),
    "conv": lambda: _make_task(ConvNet, optax.sgd(0.1, momentum=0.9), (4, 8, 8, 1)),
    "scan": lambda: _make_task(ScanNet, optax.adamw(1e-2), (2, 5, 8)),
}


@functools.cache
def task(name):
  step_fn, init_state, batch_at = TASKS[name]()
  state = init_state()
  return step_fn, lambda: state, batch_at


def run(step, state, batch_at, n):
  outs = []
  for i in range(n):
    state, metrics = step(state, batch_at(i))
    outs.append((state, metrics))
  return outs


def assert_bitwise(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


ALL_PHASES = ("fwd", "bwd", "upd")


def sites_of(name):
  step_fn, init, batch_at = task(name)
  return _sites.discover_sites(step_fn, init(), batch_at(0))


# ---------------------------------------------------------------------------
# Discovery


EXPECTED_COUNTS = {
    # (kernel, phase): count
    "mlp": {("dot_general", "fwd"): 2, ("dot_general", "bwd"): 3, ("layer_norm", "fwd"): 1,
            ("layer_norm", "bwd"): 1, ("gelu", "fwd"): 1, ("gelu", "bwd"): 1,
            ("cross_entropy", "fwd"): 1, ("cross_entropy", "bwd"): 1, ("sqrt", "upd"): 7},
    "conv": {("conv_general_dilated", "fwd"): 1, ("conv_general_dilated", "bwd"): 1,
             ("dot_general", "fwd"): 1, ("dot_general", "bwd"): 2,
             ("reduce_window_sum", "fwd"): 1},
    # Inside scan: qkv and out (2), plus 2 recomputed by remat; attention's
    # own two einsums; the head (1 fwd, 2 bwd).
    "scan": {("dot_general", "fwd"): 2 + 2 + 2 + 2 + 1, ("attention", "fwd"): 2,
             ("attention", "bwd"): 1, ("softmax", "fwd"): 2, ("softmax", "bwd"): 2,
             ("cross_entropy", "fwd"): 1},
}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_discovery_counts_per_kernel_and_phase(name):
  sites = sites_of(name)
  counts = sites.counts()
  for key, n in EXPECTED_COUNTS[name].items():
    assert counts.get(key, 0) == n, (key, sites.counts_table())
  assert {s.phase for s in sites} == set(ALL_PHASES)
  names = sites.names()
  assert len(set(names)) == len(names)
  for s in sites:
    assert s.name == (f"{s.phase}/{s.path}/{s.kernel}:{s.ordinal}" if s.path
                      else f"{s.phase}/{s.kernel}:{s.ordinal}")
    assert len(s.in_shapes) == len(s.in_dtypes) and len(s.out_shapes) == len(s.out_dtypes) >= 1


def test_discovery_names_and_constructs_in_scan_remat_cond_vmap_jit():
  by = sites_of("scan").by_name()
  assert by["fwd/Block/Linear/dot_general:0"].where == ("scan",)
  assert by["fwd/Block/attention/softmax:0"].where[:2] == ("scan", "composite")
  remat = [s for s in by.values() if s.recompute]
  assert remat and all(s.phase == "fwd" and "remat" in s.where for s in remat)
  assert any(s.where[-1:] == ("cond",) for s in by.values())
  # vmap of a nested jit: batched kernel inside a jit.
  norm = [s for s in by.values() if s.where == ("jit",) and s.kernel == "reduce_sum"]
  assert norm and norm[0].in_shapes == ((2, 5, 8),)
  # Adam's update reads the optimizer path.
  assert any(n.startswith("upd/scale_by_adam/") for n in by)


def test_discovery_is_stable_across_traces_and_processes():
  names = sites_of("mlp").names()
  step_fn, init, batch_at = task("mlp")
  again = _sites.discover_sites(jax.jit(step_fn), init(), batch_at(0)).names()
  assert again == names  # a jitted step gives the same names
  code = textwrap.dedent(f"""
      import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
      import test_sites as t
      print("\\n".join(t.sites_of("mlp").names()))
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.stdout.split() == names


def test_table_prints_every_site():
  sites = sites_of("conv")
  table = sites.table()
  assert "fwd/ConvNet/Conv/conv_general_dilated:0" in table
  assert table.splitlines()[0].split()[:3] == ["site", "kernel", "inputs"]
  assert f"{len(sites)} sites" in table
  assert "conv_general_dilated" in sites.counts_table()
  assert "more sites" in sites.table(max_rows=3)


# ---------------------------------------------------------------------------
# Substitution


@pytest.mark.parametrize("name", ["mlp", "conv", pytest.param("scan", marks=pytest.mark.slow)])
def test_golden_for_golden_is_bitwise_identical_training(name):
  step_fn, init, batch_at = task(name)
  plain = jax.jit(step_fn)
  sub = jax.jit(S.substitute(step_fn, S.Substitution(S.GOLDEN, phase=ALL_PHASES)))
  assert_bitwise(run(plain, init(), batch_at, 2), run(sub, init(), batch_at, 2))


def _dot_kut(lhs, rhs, **params):
  return lax.dot_general_p.bind(lhs, rhs, **params)


def test_reimplemented_golden_kernels_are_bitwise_identical():
  step_fn, init, batch_at = task("mlp")
  sub = jax.jit(S.substitute(
      step_fn,
      S.Substitution(_dot_kut, kernel="dot_general"),
      S.Substitution(lambda x: jax.nn.gelu(x), kernel="gelu"),
  ))
  assert_bitwise(run(jax.jit(step_fn), init(), batch_at, 2), run(sub, init(), batch_at, 2))


def _scaled_dot(lhs, rhs, **params):
  return lax.dot_general_p.bind(lhs, rhs, **params) * jnp.float32(1.001)


@pytest.mark.slow
def test_tapped_kut_changes_exactly_the_selected_site():
  step_fn, init, batch_at = task("mlp")
  state, batch = init(), batch_at(0)
  names = sites_of("mlp").names()
  target = "fwd/MLP/Linear/dot_general:1"
  base_out, base = jax.jit(S.tap(step_fn, S.Substitution(None, phase=ALL_PHASES)))(state, batch)
  others = [n for n in names if n != target]
  tapped = jax.jit(S.tap(step_fn, S.Substitution(_scaled_dot, sites=(target,)),
                         S.Substitution(None, sites=tuple(others))))
  out, taps = tapped(state, batch)
  assert set(taps) == set(base) == set(names)
  # The step continued on the golden value. (Compared with a run that taps
  # the same sites: exporting hundreds of intermediates changes XLA's fusion
  # and can move the last bit of the continuing step.)
  assert_bitwise(out, base_out)
  for n in others:
    assert_bitwise(taps[n].golden, base[n].golden)
    assert_bitwise(taps[n].inputs, base[n].inputs)
    assert taps[n].kut is None
  assert_bitwise(taps[target].golden, base[target].golden)
  np.testing.assert_allclose(taps[target].kut, taps[target].golden * 1.001, rtol=1e-6)
  assert not np.array_equal(taps[target].kut, taps[target].golden)


def test_tap_continue_with_kut_propagates_downstream_only():
  step_fn, init, batch_at = task("mlp")
  state, batch = init(), batch_at(0)
  target = "fwd/MLP/Linear/dot_general:1"
  sel = (S.Substitution(_scaled_dot, sites=(target,)),
         S.Substitution(None, sites=("fwd/MLP/Linear/dot_general:0", "fwd/cross_entropy:0")))
  _, g = jax.jit(S.tap(step_fn, *sel))(state, batch)
  out, k = jax.jit(S.tap(step_fn, *sel, continue_with="kut"))(state, batch)
  assert_bitwise(k["fwd/MLP/Linear/dot_general:0"], g["fwd/MLP/Linear/dot_general:0"])  # upstream
  assert_bitwise(k[target].inputs, g[target].inputs)
  # With a few taps, continuing on golden gives the plain step's bits.
  assert_bitwise(jax.jit(S.tap(step_fn, *sel))(state, batch)[0], jax.jit(step_fn)(state, batch))
  assert not np.array_equal(k["fwd/cross_entropy:0"].golden, g["fwd/cross_entropy:0"].golden)
  sub_out = jax.jit(S.substitute(step_fn, S.Substitution(_scaled_dot, sites=(target,))))(state, batch)
  assert_bitwise(out, sub_out)


@pytest.mark.parametrize("selection, expected", [
    (dict(kernel="dot_general"), {"fwd": 2, "bwd": 3}),
    (dict(kernel="dot_general", phase="bwd"), {"bwd": 3}),
    (dict(kernel="dot_general", phase="fwd", backward="kut"), {"fwd": 2, "bwd": 3}),
    (dict(pattern="fwd/MLP/Linear/*"), {"fwd": 4}),
    (dict(sites=("bwd/MLP/Linear/dot_general:2", "fwd/MLP/gelu:0")), {"fwd": 1, "bwd": 1}),
])
def test_selection_by_kernel_pattern_phase_and_list(selection, expected):
  step_fn, init, batch_at = task("mlp")
  _, taps = jax.eval_shape(S.tap(step_fn, S.Substitution(S.GOLDEN, **selection)), init(), batch_at(0))
  got = {}
  for n in taps:
    got[n.split("/")[0]] = got.get(n.split("/")[0], 0) + 1
  assert got == expected


@jax.custom_vjp
def _gelu_zero_grad(x):
  return jax.nn.gelu(x)


_gelu_zero_grad.defvjp(lambda x: (jax.nn.gelu(x), None), lambda _, g: (jnp.zeros_like(g),))


@pytest.mark.parametrize("backward", ["golden", "kut"])
def test_composite_backward_uses_kut_backward_when_asked(backward):
  step_fn, init, batch_at = task("mlp")
  state = init()
  sub = jax.jit(S.substitute(step_fn, S.Substitution(_gelu_zero_grad, kernel="gelu", phase="fwd",
                                                     backward=backward)))
  new, _ = sub(state, batch_at(0))
  frozen = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), new.params["l1"], state.params["l1"])
  assert all(jax.tree.leaves(frozen)) == (backward == "kut")
  assert not np.array_equal(new.params["l2"]["kernel"], state.params["l2"]["kernel"])


def test_substituted_kut_changes_training():
  step_fn, init, batch_at = task("conv")
  golden = run(jax.jit(step_fn), init(), batch_at, 2)[-1]
  sub = run(jax.jit(S.substitute(step_fn, S.Substitution(_scaled_dot, kernel="dot_general",
                                                         phase="fwd"))), init(), batch_at, 2)[-1]
  assert not np.array_equal(golden[0].params["head"]["kernel"], sub[0].params["head"]["kernel"])
  np.testing.assert_allclose(golden[1]["loss"], sub[1]["loss"], rtol=1e-2)


# ---------------------------------------------------------------------------
# Schedules and recompilation


def _counting(fn):
  count = [0]

  def wrapped(*args):
    count[0] += 1
    return fn(*args)

  return wrapped, count


def _exp_plus_one(x, **params):
  return lax.exp_p.bind(x, **params) + 1.0


def _scan_exp(state, x):
  def body(c, xi):
    return c, jnp.exp(xi)

  return lax.scan(body, 0.0, x)[1]


@pytest.mark.parametrize("schedule, active", [
    (S.EveryCall(), [True] * 6),
    (S.EveryNSteps(3), [True, False, False, True, False, False]),
    (S.EveryNSteps(2, 1), [False, True] * 3),
])
def test_schedule_every_n_steps_without_retracing(schedule, active):
  fn, count = _counting(_scan_exp)
  sub = jax.jit(S.substitute(fn, S.Substitution(_exp_plus_one, kernel="exp", schedule=schedule)))
  x = jax.random.normal(jax.random.key(0), (4, 3))
  for step in range(6):
    st = TrainState(jnp.int32(step), None, None, None, jnp.int32(0))
    got = sub(st, x)
    np.testing.assert_array_equal(got, jnp.exp(x) + (1.0 if active[step] else 0.0))
  assert count[0] == 1  # traced once: the schedule is decided inside the step


def test_schedule_seeded_fraction_of_calls():
  fn, count = _counting(_scan_exp)
  x = jax.random.normal(jax.random.key(1), (400, 2))

  def hits(seed, step):
    sub = jax.jit(S.substitute(fn, S.Substitution(_exp_plus_one, kernel="exp",
                                                  schedule=S.Fraction(0.25, seed))))
    st = TrainState(jnp.int32(step), None, None, None, jnp.int32(0))
    d = np.asarray(sub(st, x) - jnp.exp(x))
    assert np.all((d == 0) | (np.abs(d - 1) < 1e-5))
    return (d[:, 0] > 0.5)

  a, b, c = hits(7, 0), hits(7, 0), hits(7, 1)
  assert 60 < a.sum() < 140  # about a quarter of 400 calls (per scan iteration)
  np.testing.assert_array_equal(a, b)  # seeded
  assert not np.array_equal(a, c)  # a new step draws new calls


def test_train_step_does_not_recompile():
  step_fn, init, batch_at = task("mlp")
  fn, count = _counting(step_fn)
  sub = jax.jit(S.substitute(fn, S.Substitution(_scaled_dot, kernel="dot_general",
                                                schedule=S.EveryNSteps(2))))
  tapped = jax.jit(S.tap(fn, S.Substitution(_scaled_dot, kernel="dot_general")))
  state = init()
  for i in range(3):
    state, _ = sub(state, batch_at(i))
    _, taps = tapped(state, batch_at(i))
  assert count[0] == 2  # one trace each for sub and tapped
  assert sub._cache_size() == 1 and tapped._cache_size() == 1


# ---------------------------------------------------------------------------
# Constructs: taps in scan and cond, while, unsupported constructs


def test_taps_inside_scan_are_stacked_per_iteration():
  step_fn, init, batch_at = task("scan")
  site = "fwd/Block/attention:0"
  _, taps = jax.eval_shape(S.tap(step_fn, S.Substitution(None, sites=(site,))), init(), batch_at(0))
  assert [a.shape for a in taps[site].inputs] == [(3, 2, 5, 8)] * 3  # 3 layers
  assert taps[site].golden.shape == (3, 2, 5, 8)


def _cond_fn(state, x):
  return lax.cond(x.sum() > 0, lambda x: jnp.exp(x), lambda x: jnp.sin(x), x)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_taps_in_cond_branches(sign):
  x = sign * jnp.abs(jax.random.normal(jax.random.key(2), (5,)))
  out, taps = jax.jit(S.tap(_cond_fn, S.Substitution(S.GOLDEN, kernel=("exp", "sin"))))(None, x)
  taken, other = ("fwd/exp:0", "fwd/sin:0") if sign > 0 else ("fwd/sin:0", "fwd/exp:0")
  assert_bitwise(taps[taken].golden, out)
  assert_bitwise(taps[taken].inputs, (x,))
  assert not np.any(taps[other].golden)  # branch not taken: zeros


def _while_fn(state, x):
  return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.exp(c[1]) * 0.5), (0, x))[1]


def test_substitute_inside_while_and_taps_refused():
  x = jax.random.normal(jax.random.key(3), (4,))
  got = jax.jit(S.substitute(_while_fn, S.Substitution(_exp_plus_one, kernel="exp")))(None, x)
  want = x
  for _ in range(3):
    want = (jnp.exp(want) + 1.0) * 0.5
  np.testing.assert_allclose(got, want, rtol=1e-6)
  with pytest.raises(PeatError, match=r"fwd/exp:0.*while"):
    S.tap(_while_fn, S.Substitution(None, kernel="exp"))(None, x)


def _solve_fn(state, b):
  mat = jnp.eye(3) * 2.0
  return lax.custom_linear_solve(lambda v: mat @ v, b, lambda mv, r: r / 2.0)


def test_unsupported_construct_is_named():
  b = jax.random.normal(jax.random.key(4), (3,))
  sites = _sites.discover_sites(_solve_fn, None, b)
  assert any("custom_linear_solve" in s.where for s in sites)
  with pytest.raises(PeatError, match="custom_linear_solve"):
    jax.jit(S.substitute(_solve_fn, S.Substitution(S.GOLDEN, kernel="dot_general")))(None, b)


# ---------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("sub, match", [
    (S.Substitution(S.GOLDEN, sites=("fwd/MLP/Linear/dot_generl:0",)),
     r"unknown site 'fwd/MLP/Linear/dot_generl:0'; close matches: 'fwd/MLP/Linear/dot_general:0'"),
    (S.Substitution(S.GOLDEN, kernel="matmul"), r"no site of kernel 'matmul'"),
    (S.Substitution(S.GOLDEN, pattern="nothing/*"), r"matches no site"),
    (S.Substitution(S.GOLDEN, phase="forward"), r"phase must be one of"),
    (S.Substitution(S.GOLDEN), r"must select sites"),
    (S.Substitution(None, kernel="exp"), r"needs a kernel under test"),
    (S.Substitution(lambda l, r, **p: jnp.zeros((1,)), kernel="dot_general"),
     r"returned float32\[1\]; expected float32\[6, 16\]"),
    (S.Substitution(lambda l, r, **p: lax.dot_general(l, r, p["dimension_numbers"]).astype(
        jnp.bfloat16), kernel="dot_general"), r"returned bfloat16\[6, 16\]; expected float32"),
    (S.Substitution(S.GOLDEN, kernel="exp", backward="both"), r"backward must be 'golden' or 'kut'"),
])
def test_errors_say_expected_and_got(sub, match):
  step_fn, init, batch_at = task("mlp")
  with pytest.raises(PeatError, match=match):
    jax.eval_shape(S.substitute(step_fn, sub), init(), batch_at(0))


def test_schedule_and_overlap_errors():
  with pytest.raises(PeatError, match="EveryNSteps needs"):
    S.substitute(_scan_exp, S.Substitution(S.GOLDEN, kernel="exp", schedule=S.EveryNSteps(0)))
  with pytest.raises(PeatError, match="Fraction.p"):
    S.substitute(_scan_exp, S.Substitution(S.GOLDEN, kernel="exp", schedule=S.Fraction(2.0)))
  x = jnp.ones((2, 2))
  with pytest.raises(PeatError, match="selected by two substitutions"):
    S.substitute(_scan_exp, S.Substitution(S.GOLDEN, kernel="exp"),
                 S.Substitution(S.GOLDEN, phase="fwd"))(None, x)
  with pytest.raises(PeatError, match=r"has no `\.step`"):
    S.substitute(_scan_exp, S.Substitution(S.GOLDEN, kernel="exp",
                                            schedule=S.EveryNSteps(2)))(None, x)


def _constructs_loss(w, x):
  def body(c, wi):
    c = jax.checkpoint(lambda c: jnp.tanh(c @ wi))(c)
    c = lax.cond(c.sum() > 0, lambda c: c * 0.5, lambda c: softmax(c), c)
    return c, c.sum()

  c, ys = lax.scan(body, x, w)
  c = jax.vmap(jax.jit(lambda r: r @ w[0]))(c)
  return jnp.sum(jnp.sin(c) ** 2) + ys.sum()


def _constructs_step(state, x):
  w = state
  loss, g = jax.value_and_grad(_constructs_loss)(w, x)
  # A while loop in the update (while is not reverse-differentiable).
  g = lax.while_loop(lambda c: jnp.abs(c[1]).max() > 1.0, lambda c: (c[0] + 1, c[1] * 0.5),
                     (0, g))[1]
  return w - 0.1 * g, loss


def test_golden_for_golden_bitwise_under_scan_remat_cond_vmap_jit_while():
  w = jax.random.normal(jax.random.key(5), (3, 4, 4)) * 0.5
  x = jax.random.normal(jax.random.key(6), (2, 4))
  sites = _sites.discover_sites(_constructs_step, w, x)
  wheres = {c for s in sites for c in s.where}
  assert {"scan", "remat", "cond", "jit", "while", "composite"} <= wheres
  plain = jax.jit(_constructs_step)
  sub = jax.jit(S.substitute(_constructs_step, S.Substitution(S.GOLDEN, phase=ALL_PHASES)))
  a, b = (w, None), (w, None)
  for _ in range(3):
    a, b = plain(a[0], x), sub(b[0], x)
    assert_bitwise(a, b)
  # A KUT inside the scanned, rematted body changes the result.
  kut = jax.jit(S.substitute(_constructs_step, S.Substitution(_scaled_dot, kernel="dot_general",
                                                              pattern="*/dot_general:0")))
  assert not np.array_equal(kut(w, x)[1], plain(w, x)[1])
