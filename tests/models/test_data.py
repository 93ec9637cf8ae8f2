"""Tests of the real data sets shipped with the install."""

import numpy as np
import pytest

from peat_jax.models import data


def test_digits_split_is_fixed_and_disjoint():
  train, test = data.digits("train"), data.digits("test")
  assert train.x.shape == (1437, 8, 8, 1) and test.x.shape == (360, 8, 8, 1)
  assert train.x.dtype == np.float32 and 0.0 <= train.x.min()
  assert train.x.max() == 1.0
  # Disjoint: no test image appears in the train split.
  train_rows = {r.tobytes() for r in train.x.reshape(len(train.x), -1)}
  dup = sum(r.tobytes() in train_rows for r in test.x.reshape(360, -1))
  assert dup <= 2  # the raw UCI set holds a couple of duplicate images
  np.testing.assert_array_equal(data.digits("test").y, test.y)
  assert set(np.unique(train.y)) == set(range(10))


def test_digits_class_subset_is_reindexed():
  high = data.digits("train", (5, 6, 7, 8, 9))
  assert set(np.unique(high.y)) == {0, 1, 2, 3, 4}
  full = data.digits("train")
  assert len(high.y) == int(np.sum(full.y >= 5))
  with pytest.raises(ValueError, match="0..9"):
    data.digits("train", (3, 12))
  with pytest.raises(ValueError, match="'train' or 'test'"):
    data.digits("validation")


@pytest.mark.parametrize("corpus", [data.python_source, data.english_prose])
def test_text_corpora_split_by_name(corpus):
  splits = corpus()
  assert not set(splits.train_files) & set(splits.test_files)
  assert len(splits.test_files) > 0 and len(splits.train_files) > 0
  assert splits.train.dtype == np.uint8
  assert len(splits.train) > 5 * len(splits.test) > 0


def test_python_source_is_the_stdlib():
  splits = data.python_source()
  assert "os.py" in splits.train_files + splits.test_files
  assert b"def " in splits.train[:200_000].tobytes()
  assert len(splits.train) > 1_000_000


def test_batches_are_pure_functions_of_position():
  train = data.digits("train")
  a = data.classification_batch(train, 64, 3, 17)
  b = data.classification_batch(train, 64, 3, 17)
  c = data.classification_batch(train, 64, 3, 18)
  np.testing.assert_array_equal(a["x"], b["x"])
  assert not np.array_equal(a["x"], c["x"])
  # One epoch visits every kept example once.
  per_epoch = len(train.y) // 64
  seen = np.concatenate([data.classification_batch(train, 64, 3, p)["y"]
                         for p in range(per_epoch)])
  assert len(seen) == per_epoch * 64
  text = data.python_source().train
  t1 = data.text_batch(text, 4, 32, 0, 5)
  t2 = data.text_batch(text, 4, 32, 0, 5)
  np.testing.assert_array_equal(t1["tokens"], t2["tokens"])
  np.testing.assert_array_equal(t1["tokens"][:, 1:], t1["targets"][:, :-1])
  assert t1["tokens"].shape == (4, 32) and t1["tokens"].max() < 256
