"""Layer-by-layer comparison: both sides' named arrays, divergence, steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.bridges import compare as cmp
from peat_jax.models import layers

torch = pytest.importorskip("torch")
nn = torch.nn

# ------------------------------------------------------ compare_named


def _named(arrays: dict, grads: dict, loss: float = 1.0) -> cmp.Named:
  return cmp.Named(arrays, grads, {}, loss, {})


def _three_sides(seed: int, n_layers: int, bad_from: int | None,
                 shape=(8, 16)):
  """Reference r, golden/test = r + independent float32-size noise."""
  rng = np.random.default_rng(seed)
  ref, gold, test = {}, {}, {}
  for i in range(n_layers):
    r = rng.standard_normal(shape)
    ref[f"l{i}"] = r
    gold[f"l{i}"] = (r * (1 + 6e-8 * rng.standard_normal(shape))).astype(
        np.float32)
    err = 6e-8 if bad_from is None or i < bad_from else 1e-4
    test[f"l{i}"] = (r * (1 + err * rng.standard_normal(shape))).astype(
        np.float32)
  return ref, gold, test


@pytest.mark.parametrize("bad_from", [None, 2])
def test_first_divergent_layer_is_found(bad_from):
  ref, gold, test = _three_sides(1, 4, bad_from)
  points = [cmp.Point(n, f"site{n}", (n,)) for n in ref]
  grads = lambda d: dict(d)
  c = cmp.compare_named(_named(test, grads(test)), _named(gold, grads(gold)),
                        _named(ref, grads(ref)), points, signatures=False,
                        what=("activation", "gradient"))
  acts = [r for r in c.rows if r["what"] == "activation"]
  assert [r["diverged"] for r in acts] == [
      bad_from is not None and i >= bad_from for i in range(4)]
  if bad_from is None:
    assert c.first_divergent == {"activation": None, "gradient": None,
                                 "param_grad": None}
  else:
    assert c.first_divergent["activation"]["name"] == "l2"
    assert c.first_divergent["gradient"]["name"] == "l3"  # backward order
  for r in acts[:2]:
    assert 0.3 < r["noise_ratio"] < 3


def test_signatures_and_diagnoses_per_layer():
  ref, gold, test = _three_sides(2, 2, 1)
  points = [cmp.Point(n, f"s{n}", (n,)) for n in ref]
  c = cmp.compare_named(_named(test, {}), _named(gold, {}),
                        _named(ref, {}), points, what=("activation",))
  ok, bad = c.rows
  assert ok["model"] in ("reordering", "exact") and not ok["diverged"]
  assert bad["diverged"] and bad["model"] not in ("reordering", "exact")
  assert bad["signature"]["noise_ratio"] == pytest.approx(
      bad["noise_ratio"], rel=1e-3)
  assert "l1" in c.table()


def test_compare_refuses_layout_and_dtype_mismatches():
  a = {"x": np.ones((2, 3), np.float32)}
  pts = [cmp.Point("x", "s", ("m",))]
  with pytest.raises(peat.PeatError, match="never casts"):
    cmp.compare_named(_named({"x": np.ones((2, 3), np.float64)}, {}),
                      _named(a, {}), None, pts, what=("activation",))
  with pytest.raises(peat.PeatError, match="fix the point's layout"):
    cmp.compare_named(_named({"x": np.ones((3, 2), np.float32)}, {}),
                      _named(a, {}), None, pts, what=("activation",))
  with pytest.raises(peat.PeatError, match="missing on the torch side"):
    cmp.compare_named(_named({}, {}), _named(a, {}), None, pts,
                      what=("activation",))


# --------------------------------------------------- both sides, tiny MLP


def _mlp_params(seed):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.5, jnp.float32)
  return {"fc1": {"kernel": f(6, 12), "bias": f(12)},
          "fc2": {"kernel": f(12, 4), "bias": f(4)}}


def _mlp_loss(params, batch):
  h = batch["x"] @ params["fc1"]["kernel"] + params["fc1"]["bias"]
  y = layers.gelu(h) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
  return layers.cross_entropy(y, batch["y"])


POINTS = [
    cmp.Point("fc1.in", "fwd/dot_general:0", ("fc1",), jax_port="in0",
              torch_port="in0"),
    cmp.Point("fc1", "fwd/dot_general:0", ("fc1",),
              jax_bias=("fc1", "bias")),
    cmp.Point("act", "fwd/gelu:0", ("act",)),
    cmp.Point("fc2", "fwd/dot_general:1", ("fc2",),
              jax_bias=("fc2", "bias")),
]


class _TorchMlp(nn.Module):

  def __init__(self):
    super().__init__()
    self.fc1, self.act, self.fc2 = nn.Linear(6, 12), nn.GELU(), nn.Linear(
        12, 4)

  def forward(self, x):
    return self.fc2(self.act(self.fc1(x)))


def _torch_mlp(params):
  m = _TorchMlp()
  with torch.no_grad():
    for n in ("fc1", "fc2"):
      getattr(m, n).weight.copy_(torch.from_numpy(
          np.asarray(params[n]["kernel"]).T.copy()))
      getattr(m, n).bias.copy_(torch.from_numpy(
          np.array(params[n]["bias"])))
  return m


def _batch(seed):
  rng = np.random.default_rng(seed)
  return {"x": rng.standard_normal((5, 6)).astype(np.float32),
          "y": rng.integers(0, 4, 5).astype(np.int32)}


@pytest.fixture(scope="module")
def mlp():
  params, batch = _mlp_params(3), _batch(4)
  return params, batch, cmp.jax_side(_mlp_loss, params, batch, POINTS)


@jax.jit
def _mlp_references(params, batch):
  h = batch["x"] @ params["fc1"]["kernel"] + params["fc1"]["bias"]
  tail = lambda a: layers.cross_entropy(
      a @ params["fc2"]["kernel"] + params["fc2"]["bias"], batch["y"])
  return (h, jax.grad(tail)(layers.gelu(h)),
          jax.grad(lambda hh: tail(layers.gelu(hh)))(h),
          jax.grad(_mlp_loss)(params, batch))


def test_jax_side_activations_and_gradients_are_the_model_s(mlp):
  params, batch, side = mlp
  h, d_act, d_h, pg = _mlp_references(params, batch)
  np.testing.assert_allclose(side.activations["fc1"], h, rtol=1e-6)
  np.testing.assert_array_equal(side.activations["fc1.in"], batch["x"])
  np.testing.assert_allclose(side.gradients["act"], d_act, rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_allclose(side.gradients["fc1"], d_h, rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_allclose(side.param_grads["fc2/kernel"],
                             pg["fc2"]["kernel"], rtol=1e-6)
  assert side.context["fc1"] == {"kernel": "dot_general", "reduction": 6}
  assert side.loss == pytest.approx(float(_mlp_loss(params, batch)))


def test_torch_side_matches_jax_side_on_the_same_mlp(mlp):
  params, batch, golden = mlp

  def loss(m, b):
    y = torch.from_numpy(b["y"]).long()
    return nn.functional.cross_entropy(m(torch.from_numpy(b["x"])), y)

  test = cmp.torch_side(_torch_mlp(params), loss, batch, POINTS)
  assert "fc1.in" not in test.gradients  # the batch needs no grad
  c = cmp.compare_named(test, golden, None, POINTS, signatures=False,
                        what=("activation", "gradient"))
  assert max(r["max_rel"] for r in c.rows) < 1e-5
  assert {r["name"] for r in c.rows if r["what"] == "gradient"} == {
      "fc1", "act", "fc2"}


def test_reference_side_is_the_model_in_float64(mlp):
  params, batch, golden = mlp
  ref = cmp.reference_side(_mlp_loss, params, batch, POINTS[1:])
  for n in ("fc1", "act", "fc2"):
    assert ref.activations[n].dtype == np.float64
    assert ref.gradients[n].dtype == np.float64
    np.testing.assert_allclose(ref.activations[n], golden.activations[n],
                               rtol=1e-5, atol=1e-6)
  assert not jax.config.jax_enable_x64  # the scope did not leak


def test_mapping_errors_name_what_is_missing():
  params, batch = _mlp_params(7), _batch(8)
  bad = [cmp.Point("x", "fwd/dot_general:7", ("fc1",))]
  with pytest.raises(peat.PeatError, match="fwd/dot_general:7"):
    cmp.jax_side(_mlp_loss, params, batch, bad)
  loss = lambda m, b: m(torch.from_numpy(b["x"])).sum()
  with pytest.raises(peat.PeatError, match=r"\['fc9'\]"):
    cmp.torch_side(_torch_mlp(params), loss, batch,
                   [cmp.Point("x", "s", ("fc9",))])
  with pytest.raises(peat.PeatError, match="unknown layout"):
    cmp.torch_side(_torch_mlp(params), loss, batch,
                   [cmp.Point("x", "s", ("fc1",), layout="nhwc")])


# ------------------------------------------------------------- optimizer


def test_torch_adamw_step_is_the_task_optimizer():
  from peat_jax.models import tasks
  config = {"lr": 3e-3, "warmup": 20, "weight_decay": 1e-4, "clip": 1.0}
  tx = tasks._optimizer(config)  # pylint: disable=protected-access
  rng = np.random.default_rng(9)
  params = {"a": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(3), jnp.float32)}
  state = tx.init(params)
  update = jax.jit(lambda g, s, p: tx.update(g, s, p))
  for _ in range(3):  # warm-up counts > 0 and non-zero moments
    g = jax.tree.map(lambda p: jnp.asarray(
        rng.standard_normal(p.shape), jnp.float32), params)
    u, state = update(g, state, params)
    params = jax.tree.map(jnp.add, params, u)
  grads = jax.tree.map(lambda p: jnp.asarray(
      rng.standard_normal(p.shape) * 3, jnp.float32), params)  # clipped
  adam, sched = cmp._opt_parts(state)  # pylint: disable=protected-access
  u, _ = update(grads, state, params)
  want = jax.tree.map(jnp.add, params, u)  # = optax.apply_updates
  t = lambda tree: {k: torch.from_numpy(np.array(v)) for k, v in tree.items()}
  got, mu, nu, info = cmp.torch_adamw_step(
      t(params), t(grads), t(adam.mu), t(adam.nu), int(adam.count),
      int(sched.count), config)
  for k in params:
    np.testing.assert_allclose(got[k].numpy(), np.asarray(want[k]),
                               rtol=1e-6, atol=1e-8)
  assert info["lr"] == pytest.approx(3e-3 * 3 / 20, rel=1e-6)
  assert info["grad_norm"] > 1.0


# ------------------------------------------------------------- slow


@pytest.mark.slow
def test_cnn_port_has_no_divergent_layer():
  from peat_jax import models
  from peat_jax.bridges import torch_models as tm
  task = models.get_task("cnn", batch_size=8)
  state = task.init_state(0)
  c = cmp.compare_port(tm.build_port(task), state.params, task.batch_at(0))
  assert c.first_divergent == {"activation": None, "gradient": None,
                               "param_grad": None}
  assert abs(c.loss["torch"] - c.loss["jax"]) < 1e-5
  # Activations and their gradients within 2x JAX's own float64 error;
  # parameter gradients only rounding noise (torch's conv bias-gradient sums
  # are a few times further from float64 than XLA's).
  assert all(r["noise_ratio"] < 2 for r in c.rows
             if r["what"] != "param_grad")
  assert all(r["torch_ref_rms_rel"] < 1e-5 for r in c.rows)
  assert all(r["model"] is not None for r in c.rows)  # signatures ran


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["tanh_gelu", "swapped_qk"])
def test_a_broken_vit_port_diverges_at_the_broken_layer(bug):
  from peat_jax import models
  from peat_jax.bridges import torch_models as tm
  task = models.get_task("vit", batch_size=8, model_kwargs={"depth": 1})
  state = task.init_state(0)
  port = tm.build_port(task)
  if bug == "tanh_gelu":
    port.module.blocks[0].mlp.act = nn.GELU(approximate="tanh")
    want = "blocks.0.mlp.act"
  else:
    wm = [m._replace(torch=(m.torch[1], m.torch[0], m.torch[2]))
          if m.layout.startswith("qkv") else m for m in port.weight_map]
    port = port._replace(weight_map=wm)
    want = "blocks.0.attn.qkv"
  c = cmp.compare_port(port, state.params, task.batch_at(0),
                       signatures=False, what=("activation",))
  assert c.first_divergent["activation"]["name"] == want
  names = [r["name"] for r in c.rows]
  assert not any(r["diverged"] for r in c.rows[:names.index(want)])


@pytest.mark.slow
def test_torch_train_step_from_a_checkpoint_matches_golden(tmp_path):
  from peat_jax import models
  task = models.get_task("cnn", batch_size=16)
  peat.golden_train(task, str(tmp_path / "g"), steps=2, checkpoint_every=1,
                    evaluate=False)
  sc = cmp.compare_train_step(task, str(tmp_path / "g"), 1,
                              signatures=False)
  for k in ("loss", "grad_norm", "lr"):
    assert sc.scalars[k]["torch"] == pytest.approx(sc.scalars[k]["jax"],
                                                   rel=1e-5)
  assert sc.scalars["lr"]["jax"] > 0
  assert sc.first_divergent["update"] is None
  assert sc.first_divergent["param"] is None
  # Gradients and moments: float32 rounding noise (torch's convolution
  # bias-gradient sums are a few times further from float64 than XLA's).
  for r in sc.rows:
    if r["what"] in ("grad", "mu", "nu"):
      assert r["torch_ref_rms_rel"] < 1e-5, r["name"]
    else:  # new - old of float32 parameters: as far from float64 as JAX
      assert r["noise_ratio"] < 2, r["name"]
