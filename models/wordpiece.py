"""BERT's WordPiece tokenizer in pure Python (uncased, as all-MiniLM-L6-v2).

What BERT's ``BasicTokenizer`` + ``WordpieceTokenizer`` (and the
``tokenizer.json`` of all-MiniLM-L6-v2: ``BertNormalizer``,
``BertPreTokenizer``, ``WordPiece``) do, in this order:

1. clean: drop NUL, U+FFFD and control characters; every whitespace character
   becomes a space;
2. put spaces around CJK ideographs (each one becomes a word);
3. lower-case, then strip accents (NFD, drop combining marks, category Mn);
4. split on whitespace, then split every punctuation character off as its
   own word (ASCII ``!"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~`` and Unicode
   categories P*);
5. WordPiece: greedy longest-match-first pieces from the vocabulary, pieces
   after the first prefixed with ``##``; a word with no full cover, or longer
   than 100 characters, becomes ``[UNK]``.

:meth:`WordPiece.encode` adds ``[CLS]`` ... ``[SEP]``, truncates to a fixed
length and pads with ``[PAD]`` (id 0), returning ids and the attention mask.

>>> tok = WordPiece.from_file(vocab_path)                     # doctest: +SKIP
>>> tok.tokenize("Hello, world!")                             # doctest: +SKIP
['hello', ',', 'world', '!']
"""

import os
import unicodedata
from typing import NamedTuple, Sequence

import numpy as np

from peat_jax.core import PeatError

PAD, UNK, CLS, SEP = "[PAD]", "[UNK]", "[CLS]", "[SEP]"
MAX_CHARS_PER_WORD = 100


class Encoded(NamedTuple):
  """A batch of encoded texts.

  Attributes:
    ids: int32 ``[N, length]`` token ids, ``[CLS] ... [SEP]`` then ``[PAD]``.
    mask: int32 ``[N, length]``, 1 at real tokens (``[CLS]``/``[SEP]``
      included), 0 at padding.
  """

  ids: np.ndarray
  mask: np.ndarray


def _is_whitespace(ch: str) -> bool:
  return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
  if ch in "\t\n\r":
    return False
  return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch: str) -> bool:
  cp = ord(ch)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF
          or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
          or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
          or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def normalize(text: str) -> str:
  """Steps 1-3: clean, space out CJK, lower-case and strip accents."""
  out = []
  for ch in text:
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD or _is_control(ch):
      continue
    if _is_whitespace(ch):
      out.append(" ")
    elif _is_cjk(cp):
      out.append(f" {ch} ")
    else:
      out.append(ch)
  text = unicodedata.normalize("NFD", "".join(out).lower())
  return "".join(ch for ch in text if unicodedata.category(ch) != "Mn")


def basic_tokenize(text: str) -> list[str]:
  """Steps 1-4: normalized words with punctuation split off."""
  words = []
  for token in normalize(text).split():
    current = []
    for ch in token:
      if _is_punctuation(ch):
        if current:
          words.append("".join(current))
          current = []
        words.append(ch)
      else:
        current.append(ch)
    if current:
      words.append("".join(current))
  return words


class WordPiece:
  """An uncased BERT WordPiece tokenizer over a ``vocab.txt``.

  Args:
    vocab: the tokens in id order (line ``i`` of ``vocab.txt`` is id ``i``).

  Raises:
    PeatError: a special token is missing or a token appears twice.
  """

  def __init__(self, vocab: Sequence[str]):
    self.vocab = tuple(vocab)
    self.ids = {tok: i for i, tok in enumerate(self.vocab)}
    if len(self.ids) != len(self.vocab):
      seen, dup = set(), []
      for tok in self.vocab:
        if tok in seen:
          dup.append(tok)
        seen.add(tok)
      raise PeatError(f"vocabulary has duplicate tokens {dup[:10]}; expected "
                      "one token per line, each once (a BERT vocab.txt)")
    missing = [t for t in (PAD, UNK, CLS, SEP) if t not in self.ids]
    if missing:
      raise PeatError(f"vocabulary lacks the special tokens {missing}; "
                      "expected a BERT vocab.txt with [PAD], [UNK], [CLS], "
                      "[SEP]")
    self.pad_id, self.unk_id = self.ids[PAD], self.ids[UNK]
    self.cls_id, self.sep_id = self.ids[CLS], self.ids[SEP]

  @classmethod
  def from_file(cls, path: str | os.PathLike) -> "WordPiece":
    """Reads a ``vocab.txt`` (one token per line, UTF-8).

    Raises:
      PeatError: the file does not exist (or see the constructor).
    """
    if not os.path.isfile(path):
      raise PeatError(f"vocabulary file {os.fspath(path)!r} does not exist; "
                      "pass the vocab.txt of a BERT model directory")
    with open(path, encoding="utf-8") as f:
      return cls([line.rstrip("\n") for line in f])

  def __len__(self) -> int:
    return len(self.vocab)

  def word_pieces(self, word: str) -> list[str]:
    """Step 5 for one word: greedy longest-match-first pieces, or [UNK]."""
    if len(word) > MAX_CHARS_PER_WORD:
      return [UNK]
    pieces, start = [], 0
    while start < len(word):
      end = len(word)
      piece = None
      while start < end:
        candidate = word[start:end] if start == 0 else "##" + word[start:end]
        if candidate in self.ids:
          piece = candidate
          break
        end -= 1
      if piece is None:
        return [UNK]
      pieces.append(piece)
      start = end
    return pieces

  def tokenize(self, text: str) -> list[str]:
    """The WordPiece tokens of ``text`` (no special tokens)."""
    return [p for w in basic_tokenize(text) for p in self.word_pieces(w)]

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    """Ids of ``tokens``; unknown tokens map to the ``[UNK]`` id."""
    return [self.ids.get(t, self.unk_id) for t in tokens]

  def encode(self, texts: Sequence[str], length: int) -> Encoded:
    """``[CLS] tokens [SEP]`` per text, truncated and padded to ``length``.

    Args:
      texts: the texts.
      length: tokens per row, special tokens included (at least 2); longer
        texts keep their first ``length - 2`` tokens.

    Returns:
      :class:`Encoded` ids and mask, int32 ``[len(texts), length]``.

    Raises:
      PeatError: ``length`` < 2 or ``texts`` is a single string.
    """
    if isinstance(texts, str):
      raise PeatError("encode expects a sequence of texts, got one string; "
                      "wrap it in a list: encode([text], length)")
    if length < 2:
      raise PeatError(f"length must be at least 2 ([CLS] and [SEP]), got "
                      f"{length}")
    ids = np.full((len(texts), length), self.pad_id, np.int32)
    mask = np.zeros((len(texts), length), np.int32)
    for row, text in enumerate(texts):
      body = self.convert_tokens_to_ids(self.tokenize(text))[:length - 2]
      tokens = [self.cls_id, *body, self.sep_id]
      ids[row, :len(tokens)] = tokens
      mask[row, :len(tokens)] = 1
    return Encoded(ids, mask)
