"""peat.forward_campaign: faults into a forward function's sites, as one
set of compiled programs, recomputing only the hit samples where the rest
of the function is separable over the batch.

Every injection's output is checked against an independent reference: the
same fault put into the same site by ``peat.sites.interpret`` (the whole
function re-evaluated at full batch, the site's output changed), and
replays are checked bitwise.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import peat_jax as peat
from peat_jax.injectors import _sparse
from peat_jax.injectors import _models

DN = ("NCHW", "OIHW", "NCHW")


def _conv(h, w, b):
  return lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)),
                                  dimension_numbers=DN) + b[None, :, None,
                                                            None]


def cnn(p, x):
  h = jax.nn.relu(_conv(x, p["w1"], p["b1"]))
  h = jax.nn.relu(_conv(h, p["w2"], p["b2"]))
  return h.reshape(h.shape[0], -1) @ p["fw"].T + p["fb"]


def cnn_batchnorm(p, x):
  """A batch statistic after the first convolution: samples mix."""
  h = _conv(x, p["w1"], p["b1"])
  h = (h - jnp.mean(h, axis=0)) / (jnp.std(h, axis=0) + 1e-3)
  h = jax.nn.relu(_conv(jax.nn.relu(h), p["w2"], p["b2"]))
  return h.reshape(h.shape[0], -1) @ p["fw"].T + p["fb"]


@pytest.fixture(scope="module")
def params():
  r = np.random.default_rng(0)
  p = {"w1": r.standard_normal((4, 1, 3, 3)) / 3, "b1": r.standard_normal(4),
       "w2": r.standard_normal((6, 4, 3, 3)) / 6, "b2": r.standard_normal(6),
       "fw": r.standard_normal((5, 6 * 36)) / 15, "fb": r.standard_normal(5)}
  x = r.random((8, 1, 6, 6))
  return (jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p),
          jnp.asarray(x, jnp.float32))


_REFS = {}


def _reference(fn, args, site_name, key, name, params, on="outputs"):
  """``fn(*args)`` with ``inject(name, key, ...)`` at one site, evaluated
  by the interpreter at full batch (no frontier, no sample slicing)."""
  cache = (fn, site_name, name, tuple(sorted(params.items())), on)
  if cache not in _REFS:
    site = peat.discover_sites(fn, *args).by_name()[site_name]

    def faulted(key, *a):
      def handler(eqn, invals, addr, loops):
        del loops
        if addr != site.address:
          return None
        invals = list(invals)
        prm = eqn.primitive.get_bind_params(eqn.params)
        if on == "weights":  # the largest input but the first
          w = max(range(1, len(invals)), key=lambda i: np.size(invals[i]))
          invals[w] = peat.inject(name, key, invals[w], **params)
          return [eqn.primitive.bind(*invals, **prm)]
        out = eqn.primitive.bind(*invals, **prm)
        return [peat.inject(name, key, out, **params)]

      return peat.sites.interpret(fn, handler)(*a)

    _REFS[cache] = jax.jit(faulted)
  return np.asarray(_REFS[cache](jnp.asarray(key), *args))


def _bits(a):
  a = np.asarray(a)
  return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


@pytest.mark.parametrize("name,params", [
    ("bitflip", {}), ("bitflip", {"count": 3, "bits_per_element": 2}),
    ("random_value", {"count": 2}), ("nan", {"kind": "inf"}),
    ("zero", {"count": 4}), ("exact", {})])
def test_sparse_form_is_the_injector_bitwise(name, params):
  p = _models.validate_tensor_params(name, params)
  f = _sparse.sparse_fn(name, p)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((7, 9)),
                  jnp.float32)
  for seed in range(5):
    key = jax.random.key(seed)
    idx, val = jax.jit(f)(key, x.reshape(-1))
    got = x.reshape(-1).at[idx].set(val).reshape(x.shape)
    want = peat.inject(name, key, x, **params)
    assert np.array_equal(_bits(got), _bits(want))
  assert _sparse.sparse_fn("stuck_at", _models.validate_tensor_params(
      "stuck_at", {"bit": 3})) is None


SITES = ("fwd/add:0", "fwd/add:1", "fwd/add:2")


@pytest.mark.parametrize("name,kw", [("bitflip", {}),
                                     ("bitflip", {"count": 2}),
                                     ("random_value", {})])
def test_sample_path_equals_full_batch_faults(params, name, kw):
  p, x = params
  c = peat.forward_campaign(cnn, (p, x), name, key=jax.random.key(3), n=90,
                            sites=SITES, **kw)
  assert c.modes == {s: "sample" for s in SITES}
  golden = np.asarray(jax.jit(cnn)(p, x))
  assert np.array_equal(_bits(c.golden), _bits(golden))
  assert np.asarray(c.outputs).shape == (90,) + golden.shape
  keys = np.asarray(c.keys)
  hit = collections.Counter(c.site_index.tolist())
  assert sorted(hit) == [0, 1, 2] and min(hit.values()) > 15
  for i in range(90):
    ref = _reference(cnn, (p, x), c.sites[c.site_index[i]], keys[i], name,
                     kw)
    got = np.asarray(c.outputs[i])
    # The hit sample is recomputed alone; the others are golden's rows.
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-6, equal_nan=True), i
    same = np.all(_bits(ref) == _bits(golden), axis=1)
    assert np.all(_bits(got)[same] == _bits(golden)[same])  # masked: exact
  for i in (0, 7, 89):
    r = c.replay(i)
    assert np.array_equal(_bits(r), _bits(c.outputs[i]))
    assert c.record(i).site == c.sites[c.site_index[i]]


def test_faults_say_where_and_what(params):
  p, x = params
  c = peat.forward_campaign(cnn, (p, x), "bitflip", key=jax.random.key(5),
                            n=60, sites=SITES)
  xor = _bits(c.faults.golden) ^ _bits(c.faults.value)
  assert np.all(xor != 0) and np.all((xor & (xor - 1)) == 0)  # one bit
  assert c.faults.index.shape == (60, 1)


def test_batch_statistics_fall_back_to_the_whole_batch(params):
  p, x = params
  c = peat.forward_campaign(cnn_batchnorm, (p, x), "bitflip",
                            key=jax.random.key(4), n=40,
                            sites=["fwd/add:0", "fwd/add:2"])
  assert c.modes["fwd/add:0"].startswith("batch:")
  assert "mixes samples" in c.modes["fwd/add:0"] or "batch axis" in (
      c.modes["fwd/add:0"])
  assert c.modes["fwd/add:2"] == "sample"
  golden = np.asarray(jax.jit(cnn_batchnorm)(p, x))
  keys = np.asarray(c.keys)
  spread = 0
  for i in range(40):
    site = c.sites[c.site_index[i]]
    ref = _reference(cnn_batchnorm, (p, x), site, keys[i], "bitflip", {})
    got = np.asarray(c.outputs[i])
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-5, equal_nan=True), i
    if site == "fwd/add:0":
      with np.errstate(invalid="ignore"):
        spread = max(spread, int(np.sum(np.any(got != golden, axis=1))))
  assert spread > 1  # a fault in one sample moved the others' outputs


@pytest.mark.parametrize("name,kw", [("stuck_at", {"bit": 22, "share": 0.1}),
                                     ("scale", {"factor": 1.5})])
def test_dense_models_recompute_the_batch(params, name, kw):
  p, x = params
  c = peat.forward_campaign(cnn, (p, x), name, key=jax.random.key(6), n=20,
                            sites=SITES, **kw)
  assert all(m.startswith("batch:") for m in c.modes.values())
  assert c.faults is None
  keys = np.asarray(c.keys)
  for i in range(20):
    ref = _reference(cnn, (p, x), c.sites[c.site_index[i]], keys[i], name,
                     kw)
    assert np.allclose(np.asarray(c.outputs[i]), ref, rtol=1e-5, atol=1e-5)
  assert np.array_equal(_bits(c.replay(11)), _bits(c.outputs[11]))


def test_weight_faults_and_summaries(params):
  p, x = params
  top1 = jnp.argmax(cnn(p, x), axis=1)
  summ = lambda out: jnp.sum(jnp.argmax(out, axis=1) != top1)
  c = peat.forward_campaign(
      cnn, (p, x), "bitflip", key=jax.random.key(7), n=30,
      kernel="conv_general_dilated", on="weights", summarize=summ,
      bits=(30,))
  assert c.sites == ("fwd/conv_general_dilated:0",
                     "fwd/conv_general_dilated:1")
  assert np.asarray(c.outputs).shape == (30,)
  keys = np.asarray(c.keys)
  for i in range(30):
    ref = _reference(cnn, (p, x), c.sites[c.site_index[i]], keys[i],
                     "bitflip", {"bits": (30,)}, on="weights")
    assert int(c.outputs[i]) == int(summ(jnp.asarray(ref)))
  assert int(c.replay(c.record(3))) == int(c.outputs[3])


@pytest.mark.slow
def test_a_transformer_forward_is_separable():
  from peat_jax import models  # pylint: disable=g-import-not-at-top

  task = models.get_task("gpt", batch_size=3, context=8,
                         model_kwargs=dict(dim=16, depth=1, heads=2))
  state = task.init_state(0)
  tokens = jnp.asarray(task.batch_at(0)["tokens"])
  fn = task.model_fn
  c = peat.forward_campaign(fn, (state.params, tokens), "bitflip",
                            key=jax.random.key(8), n=24,
                            kernel="dot_general")
  assert set(c.modes.values()) == {"sample"}, c.modes
  keys = np.asarray(c.keys)
  for i in range(0, 24, 3):
    ref = _reference(fn, (state.params, tokens), c.sites[c.site_index[i]],
                     keys[i], "bitflip", {})
    assert np.allclose(np.asarray(c.outputs[i]), ref, rtol=1e-4, atol=1e-5,
                       equal_nan=True)


def test_bad_input_is_named(params):
  p, x = params
  key = jax.random.key(0)
  with pytest.raises(peat.PeatError, match="unknown error model"):
    peat.forward_campaign(cnn, (p, x), "flip", key=key, n=4)
  with pytest.raises(peat.PeatError, match="injecting_kernel"):
    peat.forward_campaign(cnn, (p, x), "accumulation:fp16", key=key, n=4)
  with pytest.raises(peat.PeatError, match="'n' expected"):
    peat.forward_campaign(cnn, (p, x), "bitflip", key=key, n=0)
  with pytest.raises(peat.PeatError, match="'on' expected"):
    peat.forward_campaign(cnn, (p, x), "bitflip", key=key, n=4, on="inputs")
  with pytest.raises(peat.PeatError, match="unknown site"):
    peat.forward_campaign(cnn, (p, x), "bitflip", key=key, n=4,
                          sites=["fwd/add:9"])
  with pytest.raises(peat.PeatError, match="count"):
    peat.forward_campaign(cnn, (p, x), "bitflip", key=key, n=4,
                          sites=["fwd/add:2"], count=1000)
  with pytest.raises(peat.PeatError, match="no weight operand"):
    peat.forward_campaign(cnn, (p, x), "bitflip", key=key, n=4,
                          sites=["fwd/max:0"], on="weights")

  def scanned(p, x):
    def body(h, _):
      return jnp.tanh(h @ p), None
    return lax.scan(body, x, None, length=2)[0]

  w = jnp.ones((3, 3)) * 0.1
  with pytest.raises(peat.PeatError, match="inside `scan`"):
    peat.forward_campaign(scanned, (w, jnp.ones((4, 3))), "bitflip",
                          key=key, n=4, sites=["fwd/dot_general:0"])
