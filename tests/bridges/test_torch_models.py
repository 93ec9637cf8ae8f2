"""torch ports of the reference models: weight maps, loading errors, forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import peat_jax as peat
from peat_jax.models.cnn import Cnn
from peat_jax.models.gpt import Gpt
from peat_jax.models.vit import Vit

torch = pytest.importorskip("torch")
from peat_jax.bridges import torch_models as tm  # pylint: disable=g-import-not-at-top

CONFIGS = {
    "cnn": (Cnn, dict(classes=10, width=4)),
    "vit": (Vit, dict(classes=10, dim=16, depth=2, heads=2, mlp_ratio=2)),
    "gpt": (Gpt, dict(dim=16, depth=2, heads=2, mlp_ratio=2, context=8)),
}


def _random_params(model: str, seed: int = 0, dtype=np.float32) -> dict:
  """Seeded random Flax params of the model's shapes (no XLA compile)."""
  cls, kw = CONFIGS[model]
  abstract = nnx.eval_shape(lambda: cls(**kw, rngs=nnx.Rngs(0)))
  shapes = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda s: (rng.standard_normal(s.shape) * 0.3).astype(dtype), shapes)


def _port(model: str):
  _, kw = CONFIGS[model]
  return tm.build_port({"model": model, "model_kwargs": kw})


@pytest.mark.parametrize("model", list(CONFIGS))
def test_weight_map_round_trip_is_bitwise(model):
  params = _random_params(model, seed=1)
  port = _port(model)
  state = tm.flax_to_torch(params, port.weight_map)
  assert set(state) == set(port.module.state_dict())
  back = tm.torch_to_flax(state, port.weight_map)
  jax.tree.map(np.testing.assert_array_equal, back, params)


def test_layouts_are_the_documented_ones():
  params = _random_params("vit", seed=2)
  state = tm.flax_to_torch(params, _port("vit").weight_map)
  qkv = params["blocks"][1]["attn"]["qkv"]
  d = qkv["kernel"].shape[0]
  for i, n in enumerate("qkv"):
    np.testing.assert_array_equal(state[f"blocks.1.attn.{n}.weight"],
                                  qkv["kernel"][:, i * d:(i + 1) * d].T)
    np.testing.assert_array_equal(state[f"blocks.1.attn.{n}.bias"],
                                  qkv["bias"][i * d:(i + 1) * d])
  np.testing.assert_array_equal(state["blocks.0.ln2.weight"],
                                params["blocks"][0]["ln2"]["scale"])
  cnn = _random_params("cnn", seed=3)
  cs = tm.flax_to_torch(cnn, _port("cnn").weight_map)
  np.testing.assert_array_equal(cs["conv2.weight"],
                                cnn["conv2"]["kernel"].transpose(3, 2, 0, 1))
  np.testing.assert_array_equal(cs["head.weight"], cnn["head"]["kernel"].T)


def test_bad_state_dict_lists_every_problem():
  port = _port("cnn")
  state = {k: v.clone() for k, v in port.module.state_dict().items()}
  del state["conv2.bias"]
  state["conv9.weight"] = torch.zeros(3)
  state["head.weight"] = torch.zeros(10, 7)
  state["conv1.bias"] = state["conv1.bias"].double()
  with pytest.raises(peat.PeatError) as err:
    tm.check_state_dict(port.module, state)
  msg = str(err.value)
  for part in ("missing keys ['conv2.bias']", "unexpected keys ['conv9.weight']",
               "head.weight: expected (10, 16), got (10, 7)",
               "conv1.bias: expected torch.float32, got torch.float64"):
    assert part in msg


def test_flax_params_missing_or_unknown_are_listed():
  params = _random_params("gpt", seed=4)
  del params["blocks"][1]["mlp"]["fc2"]["bias"]
  params["blocks"][0]["extra"] = {"kernel": np.zeros((2, 2), np.float32)}
  with pytest.raises(peat.PeatError) as err:
    tm.flax_to_torch(params, _port("gpt").weight_map)
  assert "missing ['blocks/1/mlp/fc2/bias']" in str(err.value)
  assert "not in the map ['blocks/0/extra/kernel']" in str(err.value)


def test_mis_shaped_flax_params_are_refused():
  params = _random_params("vit", seed=5)
  params["embed"]["kernel"] = params["embed"]["kernel"][:, :8]
  with pytest.raises(peat.PeatError, match=r"embed.weight: expected"):
    tm.load_flax_params(_port("vit").module, params, _port("vit").weight_map)


def test_dtype_mismatch_is_an_error_and_cast_is_explicit():
  params = _random_params("cnn", seed=6, dtype=jnp.bfloat16)
  port = _port("cnn")
  with pytest.raises(peat.PeatError, match="dtype mismatches"):
    tm.load_flax_params(port.module, params, port.weight_map)
  module = port.make().to(torch.bfloat16)
  tm.load_flax_params(module, params, port.weight_map)
  assert module.conv1.weight.dtype == torch.bfloat16
  tm.load_flax_params(port.module, params, port.weight_map,
                      cast=torch.float32)  # asked for: fine


def test_cnn_port_forward_matches_jax():
  params = _random_params("cnn", seed=7)
  cls, kw = CONFIGS["cnn"]
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: cls(**kw,
                                                     rngs=nnx.Rngs(0))))
  x = np.random.default_rng(8).random((5, 8, 8, 1)).astype(np.float32)
  logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, x)
  port = _port("cnn")
  tm.load_flax_params(port.module, params, port.weight_map)
  out = port.module(port.inputs({"x": x})).detach().numpy()
  np.testing.assert_allclose(out, np.asarray(logits), rtol=1e-5, atol=1e-5)


def test_unknown_model_has_no_port():
  with pytest.raises(peat.PeatError, match="no torch port of model 'resnet'"):
    tm.build_port({"model": "resnet", "model_kwargs": {}})
