"""Tests of injection through kernels under test, trees, optax and campaigns.

Covers the error models of the computation (accumulation:<fmt>, reordering,
nondeterminism) against float64, the custom_vjp kernel wrapper forward and
backward, inject_tree / inject_gradients, and campaign replay.
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from peat_jax import injectors
from peat_jax.injectors import _campaigns as campaigns
from peat_jax.injectors import _checks as checks
from peat_jax.injectors import _rounding as fm
from peat_jax.injectors import _random as rnd
from peat_jax.core import PeatError

DOT = (((1,), (0,)), ((), ()))


def data(seed, shape, dtype=jnp.float32, scale=1.0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * scale
  x = np.where(np.abs(x) < 1e-3, 1e-3, x)
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def bits(a):
  a = np.asarray(a)
  return a.view(fm.uint_dtype(a.dtype)).astype(np.uint64)


def f64(a):
  return np.asarray(a, np.float64)


def matmul(a, b):
  return lax.dot_general(a, b, DOT)


def conv(x, w):
  return lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))


def conv64(x, w):
  """float64 reference of ``conv`` (numpy, no x64 needed)."""
  x, w = f64(x), f64(w)
  kh, kw = w.shape[:2]
  xp = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
  out = np.zeros(x.shape[:3] + (w.shape[3],))
  for i in range(kh):
    for j in range(kw):
      out += np.einsum("nhwc,co->nhwo",
                       xp[:, i:i + x.shape[1], j:j + x.shape[2]], w[i, j])
  return out


# ---------------------------------------------------------------------------
# Error models of the computation.


def _accum_err(fmt, k, chunk):
  a, b = data(k, (8, k)), data(k + 1, (k, 8))
  kut = injectors.injecting_kernel(f"accumulation:{fmt}", matmul, chunk=chunk)
  y = jax.jit(lambda a, b, key: kut(a, b, inject_key=key))(
      a, b, jax.random.key(0))
  ref = f64(a) @ f64(b)
  # Error relative to the size of the terms, which grows like sqrt(k).
  return np.sqrt(np.mean((f64(y) - ref) ** 2)) / np.sqrt(k)


@pytest.mark.parametrize("fmt", ("fp16", "bf16", "tf32"))
def test_accumulation_error_grows_with_reduction_length(fmt):
  errs = [_accum_err(fmt, k, 4) for k in (16, 256, 4096)]
  assert errs[0] < errs[1] < errs[2], errs
  a, b = data(1, (8, 4096)), data(2, (4096, 8))
  golden = np.sqrt(np.mean((f64(matmul(a, b)) - f64(a) @ f64(b)) ** 2)) / 64
  assert errs[2] > 30 * golden


def test_accumulation_output_lies_in_the_narrow_format():
  a, b = data(3, (4, 300)), data(4, (300, 5))
  for fmt in ("fp16", "bf16", "fp8_e5m2"):
    kut = injectors.injecting_kernel(f"accumulation:{fmt}", matmul, chunk=1)
    y = np.asarray(kut(a, b, inject_key=jax.random.key(0)))
    f = fm.FORMATS[fmt]
    np.testing.assert_array_equal(y.astype(f.dtype).astype(np.float32), y)


def test_accumulation_in_convolutions_grows_with_channels():
  errs = []
  for c in (4, 64, 512):
    x, w = data(c, (1, 6, 6, c)), data(c + 1, (3, 3, c, 4))
    kut = injectors.injecting_kernel("accumulation:fp16", conv, chunk=2)
    y = kut(x, w, inject_key=jax.random.key(0))
    errs.append(np.sqrt(np.mean((f64(y) - conv64(x, w)) ** 2) / (9 * c)))
  assert errs[0] < errs[1] < errs[2], errs


@pytest.mark.parametrize("fn,args,ref", [
    (matmul, lambda: (data(5, (16, 512)), data(6, (512, 12))),
     lambda a, b: f64(a) @ f64(b)),
    (conv, lambda: (data(7, (2, 5, 5, 64)), data(8, (3, 3, 64, 6))), conv64),
], ids=("dot", "conv"))
@pytest.mark.parametrize("order", ("reverse", "pairwise", "forward"))
def test_reordering_is_rounding_noise_and_key_independent(fn, args, ref, order):
  a, b = args()
  kut = injectors.injecting_kernel("reordering", fn, blocks=5, order=order)
  y1 = kut(a, b, inject_key=jax.random.key(1))
  y2 = kut(a, b, inject_key=jax.random.key(2))
  np.testing.assert_array_equal(bits(y1), bits(y2))
  g = fn(a, b)
  r = ref(a, b)
  scale = np.abs(r).max()
  # Within a few float32 rounding errors of float64, like the golden kernel.
  assert np.abs(f64(y1) - r).max() < 64 * 2.0**-24 * scale * 5
  assert np.abs(f64(g) - r).max() < 64 * 2.0**-24 * scale * 5


@pytest.mark.parametrize("fn,args", [
    (matmul, lambda: (data(9, (16, 640)), data(10, (640, 12)))),
    (conv, lambda: (data(11, (2, 5, 5, 64)), data(12, (3, 3, 64, 6)))),
], ids=("dot", "conv"))
def test_nondeterminism_differs_across_keys_and_repeats_per_key(fn, args):
  a, b = args()
  kut = injectors.injecting_kernel("nondeterminism", fn, blocks=8)
  step = jax.jit(lambda a, b, k: kut(a, b, inject_key=k))
  outs = [step(a, b, jax.random.key(s)) for s in range(4)]
  again = step(a, b, jax.random.key(0))
  np.testing.assert_array_equal(bits(outs[0]), bits(again))
  for i in range(4):
    for j in range(i + 1, 4):
      assert (bits(outs[i]) != bits(outs[j])).any()
  g = fn(a, b)
  rel = np.abs(f64(outs[0]) - f64(g)).max() / np.abs(f64(g)).max()
  assert 0 < rel < 1e-5


def test_computation_models_in_the_backward_pass():
  a, b = data(13, (8, 2048)), data(14, (2048, 8))
  ct = data(15, (8, 8))
  loss = lambda f: (lambda a, b: jnp.sum(f(a, b) * ct))
  # The wrapper runs jitted: its golden counterpart is jitted too (eager and
  # jitted dots round differently on some CPUs, PITFALLS.md).
  g_gold = jax.jit(jax.grad(loss(matmul), argnums=(0, 1)))(a, b)
  ga_ref = f64(ct) @ f64(b).T
  kut = injectors.injecting_kernel("accumulation:bf16", matmul, where="bwd",
                             chunk=1)
  f = lambda a, b: kut(a, b, inject_key=jax.random.key(0))
  np.testing.assert_array_equal(bits(f(a, b)), bits(matmul(a, b)))
  g = jax.jit(jax.grad(loss(f), argnums=(0, 1)))(a, b)
  # The rhs gradient reduces over 8 terms, the lhs gradient over 8 as well;
  # both are rounded to bf16: representable in bf16, off from golden.
  for gi, gg in zip(g, g_gold):
    np.testing.assert_array_equal(
        f64(np.asarray(gi).astype(jnp.bfloat16).astype(np.float32)), f64(gi))
    assert (bits(gi) != bits(gg)).any()
  assert np.abs(f64(g[0]) - ga_ref).max() < 2.0**-7 * np.abs(ga_ref).max()
  # where="fwd": the backward is golden.
  kut = injectors.injecting_kernel("accumulation:bf16", matmul, where="fwd")
  f = lambda a, b: kut(a, b, inject_key=jax.random.key(0))
  g = jax.grad(loss(f), argnums=(0, 1))(a, b)
  for gi, gg in zip(g, g_gold):
    np.testing.assert_array_equal(bits(gi), bits(gg))


def test_emulation_reaches_dots_inside_composite_kernels_and_nested_jit():
  x, w1, w2 = data(16, (4, 256)), data(17, (256, 64)), data(18, (64, 8))

  @jax.jit
  def inner(h, w):
    return jnp.tanh(h) @ w

  def mlp(x, w1, w2):
    return inner(jax.nn.relu(x @ w1), w2)

  kut = injectors.injecting_kernel("accumulation:fp8_e5m2", mlp, chunk=1)
  y = kut(x, w1, w2, inject_key=jax.random.key(0))
  np.testing.assert_array_equal(
      np.asarray(y).astype(jnp.float8_e5m2).astype(np.float32), np.asarray(y))
  assert (bits(y) != bits(mlp(x, w1, w2))).any()


def _in_scan(h, ws):
  return lax.scan(lambda c, w: (jnp.tanh(c @ w), None), h, ws)[0]


def _unrolled(h, ws):
  for i in range(ws.shape[0]):
    h = jnp.tanh(h @ ws[i])
  return h


def _in_while(h, ws):
  # A trip count known only at run time: a while loop, not a scan.
  n = jnp.asarray(ws.shape[0], jnp.int32) - (h[0, 0] > 1e9).astype(jnp.int32)
  return lax.fori_loop(0, n, lambda i, c: jnp.tanh(c @ ws[i]), h)


def _in_cond(h, ws):
  return lax.cond(h[0, 0] < 1e9, lambda c: _unrolled(c, ws),
                  lambda c: c @ ws[0], h)


@pytest.mark.parametrize("construct", [_in_scan, _in_while, _in_cond])
@pytest.mark.parametrize("name,params", [
    ("accumulation:bf16", {"chunk": 4}),
    ("reordering", {"blocks": 4, "order": "pairwise"})])
def test_emulation_reaches_dots_inside_scan_while_and_cond(construct, name,
                                                           params):
  """A dot inside lax control flow is re-computed like the same dot outside."""
  h, ws = data(41, (8, 128)), data(42, (3, 128, 128), scale=0.09)
  key = jax.random.key(0)
  want = injectors.injecting_kernel(name, _unrolled, **params)(
      h, ws, inject_key=key)
  got = injectors.injecting_kernel(name, construct, **params)(
      h, ws, inject_key=key)
  np.testing.assert_array_equal(bits(got), bits(want))
  assert (bits(got) != bits(construct(h, ws))).any()


def test_grouped_convolutions_are_refused_with_a_clear_error():
  x, w = data(19, (1, 4, 4, 4)), data(20, (3, 3, 1, 4))
  grouped = lambda x, w: lax.conv_general_dilated(
      x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
      feature_group_count=4)
  kut = injectors.injecting_kernel("reordering", grouped)
  with pytest.raises(PeatError, match="feature_group_count"):
    kut(x, w, inject_key=jax.random.key(0))


# ---------------------------------------------------------------------------
# Tensor models through the kernel wrapper.


@pytest.mark.parametrize("name,params", [
    ("bitflip", {"count": 2, "bits": 22}),
    ("precision:bf16", {}),
    ("zero", {"mode": "rows"}),
    ("lane", {"stride": 4, "lane": 1, "effect": "nan"}),
])
@pytest.mark.parametrize("where", ("fwd", "bwd", "both"))
def test_kernel_wrapper_injects_forward_output_and_backward_cotangents(
    name, params, where):
  a, b = data(21, (16, 32)), data(22, (32, 8))
  key = jax.random.key(3)
  kut = injectors.injecting_kernel(name, lax.dot_general, where=where, **params)
  f = lambda a, b: kut(a, b, DOT, inject_key=key)
  y, vjp = jax.vjp(f, a, b)
  ct = data(23, (16, 8))
  # The wrapper runs jitted: so does the golden VJP it is compared with
  # (eager and jitted dots round differently on some CPUs, PITFALLS.md).
  y_gold, g_gold = jax.jit(
      lambda a, b, ct: (lambda y, f: (y, f(ct)))(*jax.vjp(matmul, a, b)))(
          a, b, ct)
  g = vjp(ct)
  kf, kb = rnd.derive(key, 0), rnd.derive(key, 1)
  if where in ("fwd", "both"):
    want = injectors.inject(name, rnd.derive(kf, 0), y_gold, **params)
    np.testing.assert_array_equal(bits(y), bits(want))
  else:
    np.testing.assert_array_equal(bits(y), bits(y_gold))
  for i in range(2):
    if where in ("bwd", "both"):
      want = injectors.inject(name, rnd.derive(kb, i), g_gold[i], **params)
      np.testing.assert_array_equal(bits(g[i]), bits(want))
    else:  # straight through: the golden VJP
      np.testing.assert_array_equal(bits(g[i]), bits(g_gold[i]))


def test_kernel_wrapper_on_inputs_rounds_operands():
  a, b = data(24, (8, 64)), data(25, (64, 8))
  kut = injectors.injecting_kernel("precision:bf16", matmul, on="inputs")
  y = kut(a, b, inject_key=jax.random.key(0))
  r = lambda t: t.astype(jnp.bfloat16).astype(jnp.float32)
  np.testing.assert_array_equal(bits(y), bits(matmul(r(a), r(b))))
  g = jax.grad(lambda a: kut(a, b, inject_key=jax.random.key(0)).sum())(a)
  g_want = jax.grad(lambda a: matmul(a, r(b)).sum())(a)
  np.testing.assert_array_equal(bits(g), bits(g_want))


def test_kernel_in_a_jitted_training_step_with_a_key_per_call():
  w = data(26, (32, 4))
  x, t = data(27, (16, 32)), data(28, (16, 4))
  kut = injectors.injecting_kernel("bitflip", matmul, where="both", count=1,
                             field_weights=(0, 0, 1))
  traces = []

  @jax.jit
  def step(w, key):
    traces.append(1)
    loss = lambda w: jnp.mean((kut(x, w, inject_key=key) - t) ** 2)
    l, g = jax.value_and_grad(loss)(w)
    return w - 0.1 * g, l

  w1, l1 = step(w, jax.random.key(0))
  w2, l2 = step(w1, jax.random.key(1))
  _, l1b = step(w, jax.random.key(0))
  assert len(traces) == 1 and step._cache_size() == 1
  np.testing.assert_array_equal(bits(l1), bits(l1b))
  assert np.isfinite(f64(w2)).all()


def test_kernel_wrapper_errors():
  with pytest.raises(PeatError, match="'where' expected one of"):
    injectors.injecting_kernel("bitflip", matmul, where="fw")
  with pytest.raises(PeatError, match="'chunk' expected an integer >= 1"):
    injectors.injecting_kernel("accumulation:fp16", matmul, chunk=0)
  with pytest.raises(PeatError, match="unknown parameter"):
    injectors.injecting_kernel("reordering", matmul, share=0.1)
  with pytest.raises(PeatError, match="on='inputs' expected where"):
    injectors.injecting_kernel("bitflip", matmul, on="inputs", where="bwd")
  kut = injectors.injecting_kernel("bitflip", matmul)
  with pytest.raises(PeatError, match="inject_key"):
    kut(data(0, (2, 2)), data(1, (2, 2)))


# ---------------------------------------------------------------------------
# Trees and optax.


def _params():
  return {"params": {"Dense_0": {"kernel": data(30, (16, 8)),
                                 "bias": data(31, (8,))},
                     "Dense_1": {"kernel": data(32, (8, 4)),
                                 "bias": data(33, (4,))}},
          "step": jnp.int32(3)}


def _n_diff(t1, t2):
  return sum(int((bits(a) != bits(b)).sum())
             for a, b in zip(jax.tree_util.tree_leaves(t1),
                             jax.tree_util.tree_leaves(t2))
             if jnp.issubdtype(jnp.result_type(a), jnp.floating))


def test_inject_tree_one_leaf_each_leaf_and_regex():
  p = _params()
  for s in range(3):
    q = injectors.inject_tree("bitflip", jax.random.key(s), p)
    assert _n_diff(p, q) == 1
  q = injectors.inject_tree("bitflip", jax.random.key(0), p, scope="each_leaf")
  assert _n_diff(p, q) == 4
  q = injectors.inject_tree("zero", jax.random.key(0), p, leaves=r"kernel$",
                      scope="each_leaf", count=3)
  assert _n_diff(p["params"]["Dense_0"]["bias"],
                 q["params"]["Dense_0"]["bias"]) == 0
  assert _n_diff(p, q) == 6
  q = injectors.inject_tree(
      "scale", jax.random.key(0), p,
      leaves=lambda path, leaf: path.startswith("params/Dense_1"))
  assert _n_diff(p["params"]["Dense_0"], q["params"]["Dense_0"]) == 0
  assert q["step"] == 3
  # Jit-able and vmappable over keys.
  keys = jax.random.split(jax.random.key(9), 3)
  qs = jax.jit(jax.vmap(lambda k: injectors.inject_tree("bitflip", k, p)))(keys)
  for i in range(3):
    one = injectors.inject_tree("bitflip", keys[i], p)
    assert _n_diff(jax.tree_util.tree_map(lambda v: v[i], qs), one) == 0
  with pytest.raises(PeatError, match="selected no floating leaf"):
    injectors.inject_tree("bitflip", jax.random.key(0), p, leaves="nothing")


def test_inject_gradients_hits_only_the_chosen_step():
  p = _params()["params"]
  grads = jax.tree_util.tree_map(lambda v: v * 0.5, p)
  tx = injectors.inject_gradients("bitflip", jax.random.key(0), steps=(1, 3),
                            count=1, bits=30)
  state = tx.init(p)
  update = jax.jit(tx.update)
  hits = []
  for _ in range(5):
    u, state = update(grads, state)
    hits.append(_n_diff(u, grads))
  assert hits == [0, 1, 0, 1, 0]
  chain = optax.chain(
      injectors.inject_gradients("nan", jax.random.key(0), steps=0), optax.sgd(0.1))
  u, _ = chain.update(grads, chain.init(p), p)
  assert sum(int(jnp.isnan(v).sum()) for v in jax.tree_util.tree_leaves(u)) == 1
  with pytest.raises(PeatError, match="'steps' expected"):
    injectors.inject_gradients("nan", jax.random.key(0), steps=-1)


# ---------------------------------------------------------------------------
# Campaigns.


@pytest.mark.parametrize("name,params", [
    ("bitflip", {"count": 2, "bits_per_element": 2}),
    ("random_value", {"mode": "normal", "count": 4}),
    ("stuck_at", {"bit": 9, "share": 0.1}),
    ("indexing", {"mode": "tile_swap", "tile": (4, 4)}),
])
@pytest.mark.parametrize("dtype", (
    pytest.param(jnp.float32, id="f32"),
    pytest.param(jnp.bfloat16, id="bf16", marks=pytest.mark.slow),
    pytest.param(jnp.float16, id="f16", marks=pytest.mark.slow)))
def test_tensor_campaign_equals_loop_and_replays_bitwise(name, params, dtype):
  x = data(40, (16, 16), dtype)
  c = injectors.campaign(name, jax.random.key(5), x, n=12, **params)
  assert c.outputs.shape == (12, 16, 16)
  for i in range(12):  # a Python loop of single jitted injections
    np.testing.assert_array_equal(bits(c.outputs[i]),
                                  bits(injectors.inject(name, c.keys[i], x,
                                                  **params)))
  rec = c.records[7]
  assert rec.index == 7 and rec.name == name
  assert rec.params == injectors.injection_params(name, **params)
  np.testing.assert_array_equal(bits(injectors.replay(rec, x)), bits(c.outputs[7]))
  np.testing.assert_array_equal(bits(c.replay(3)), bits(c.outputs[3]))
  assert len({bits(o).tobytes() for o in c.outputs}) > 1


def test_campaign_summaries_and_batches_match_the_full_vmap():
  x = data(41, (32, 32))
  stat = lambda y: jnp.max(jnp.abs(y - x))
  c = injectors.campaign("bitflip", jax.random.key(1), x, n=64, summarize=stat)
  cb = injectors.campaign("bitflip", jax.random.key(1), x, n=64, summarize=stat,
                    batch_size=16)
  assert c.outputs.shape == (64,)
  np.testing.assert_array_equal(bits(c.outputs), bits(cb.outputs))
  # Another campaign with the same settings and a new key: no recompilation.
  c2 = injectors.campaign("bitflip", jax.random.key(2), x, n=64, summarize=stat)
  batched, _ = campaigns._tensor_campaign_fns("bitflip", checks._freeze(c.params),
                                        stat, None)
  assert batched._cache_size() == 1
  assert (bits(c2.outputs) != bits(c.outputs)).any()
  np.testing.assert_array_equal(bits(c.replay(10)), bits(c.outputs[10]))


@pytest.mark.parametrize("name,where,params", [
    ("bitflip", "both", {"count": 1}),
    ("precision:fp8_e4m3", "fwd", {}),
    pytest.param("nondeterminism", "both", {"blocks": 4},
                 marks=pytest.mark.slow),
    ("accumulation:fp16", "bwd", {"chunk": 8}),
])
def test_kernel_campaign_replays_bitwise(name, where, params):
  a, b = data(42, (8, 64)), data(43, (64, 8))
  c = injectors.kernel_campaign(name, jax.random.key(2), matmul, (a, b), n=6,
                          where=where, **params)
  for i in (0, 5):
    want = c.replay(i)
    got = jax.tree_util.tree_map(lambda v: v[i], c.outputs)
    for u, v in zip(jax.tree_util.tree_leaves(want),
                    jax.tree_util.tree_leaves(got)):
      np.testing.assert_array_equal(bits(u), bits(v))
  assert c.record(5).params == injectors.injection_params(name, **params)


def test_campaign_errors():
  x = data(44, (4, 4))
  with pytest.raises(PeatError, match="'n' expected a positive int"):
    injectors.campaign("bitflip", jax.random.key(0), x, n=0)
  with pytest.raises(PeatError, match="'batch_size' expected"):
    injectors.campaign("bitflip", jax.random.key(0), x, n=4, batch_size=0)
  with pytest.raises(PeatError, match="arrays only"):
    injectors.kernel_campaign("bitflip", jax.random.key(0), lax.dot_general,
                        (x, x, DOT), n=2)
  # Kernels with static arguments: bind them with functools.partial.
  c = injectors.kernel_campaign("bitflip", jax.random.key(0),
                          functools.partial(lax.dot_general,
                                            dimension_numbers=DOT),
                          (x, x), n=2)
  assert c.outputs.shape == (2, 4, 4)
