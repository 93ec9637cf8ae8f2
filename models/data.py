"""Real data shipped with every install: scikit-learn's digits, stdlib text.

Nothing here downloads anything.

* **Digits**: the 1,797 8x8 grey-level images of handwritten digits bundled
  with scikit-learn (``sklearn.datasets.load_digits``, UCI optical digits test
  set). Pixels 0..16 are scaled to [0, 1]. Split: a fixed permutation of the
  1,797 indices drawn with ``numpy.random.default_rng(20260101)``; the first
  360 are the test split, the remaining 1,437 the train split.
* **Python source** (GPT pretraining): the bytes of the top-level ``*.py``
  files of the running interpreter's standard library
  (``sysconfig.get_paths()["stdlib"]``), files sorted by name. A file belongs
  to the test split when ``zlib.crc32(basename) % 10 == 0``, otherwise to the
  train split. Files are joined with a ``\\x00`` separator byte.
* **English prose** (GPT finetuning, "another kind of text"): the values of
  ``pydoc_data.topics.topics`` (the Python reference manual's topic texts that
  ``help()`` shows), topics sorted by key; test split when
  ``zlib.crc32(key) % 10 == 0``.

Batches are pure functions of ``(seed, data_position)``, so a resumed run
sees the same batches as an uninterrupted one.
"""

import functools
import glob
import os
import sysconfig
import zlib
from typing import NamedTuple

import numpy as np

DIGITS_SPLIT_SEED = 20260101
DIGITS_TEST_SIZE = 360
SEPARATOR = b"\x00"


class ArrayDataset(NamedTuple):
  """Images and labels of one split (``x``: float32 [N, 8, 8, 1])."""

  x: np.ndarray
  y: np.ndarray


class TextSplits(NamedTuple):
  """Train and test bytes of one corpus, as uint8 arrays."""

  train: np.ndarray
  test: np.ndarray
  train_files: tuple[str, ...]
  test_files: tuple[str, ...]


@functools.cache
def _digits_all() -> tuple[np.ndarray, np.ndarray]:
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  digits = datasets.load_digits()
  x = (digits.images.astype(np.float32) / 16.0)[..., None]
  y = digits.target.astype(np.int32)
  return x, y


def digits(split: str, classes: tuple[int, ...] | None = None) -> ArrayDataset:
  """Returns one split of the digits, optionally only some classes.

  Args:
    split: ``"train"`` (1,437 images) or ``"test"`` (360 images).
    classes: keep only these digit classes; labels are re-indexed to
      ``0..len(classes)-1`` in the given order (e.g. ``(5, 6, 7, 8, 9)``).

  Returns:
    The images and labels.

  Raises:
    ValueError: unknown split or class.
  """
  x, y = _digits_all()
  perm = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(y))
  if split == "test":
    idx = perm[:DIGITS_TEST_SIZE]
  elif split == "train":
    idx = perm[DIGITS_TEST_SIZE:]
  else:
    raise ValueError(f"digits split must be 'train' or 'test', got {split!r}")
  x, y = x[idx], y[idx]
  if classes is not None:
    bad = [c for c in classes if c not in range(10)]
    if bad:
      raise ValueError(f"digit classes must be in 0..9, got {bad}")
    keep = np.isin(y, classes)
    remap = np.full(10, -1, np.int32)
    remap[list(classes)] = np.arange(len(classes), dtype=np.int32)
    x, y = x[keep], remap[y[keep]]
  return ArrayDataset(np.ascontiguousarray(x), y)


def _is_test(name: str) -> bool:
  return zlib.crc32(name.encode()) % 10 == 0


def _join(chunks: list[bytes]) -> np.ndarray:
  return np.frombuffer(SEPARATOR.join(chunks), dtype=np.uint8).copy()


def _split(items) -> TextSplits:
  """``(name, bytes)`` pairs -> splits by ``crc32(name) % 10 == 0``."""
  parts = {True: ([], []), False: ([], [])}
  for name, data in items:
    chunks, names = parts[_is_test(name)]
    chunks.append(data)
    names.append(name)
  return TextSplits(_join(parts[False][0]), _join(parts[True][0]),
                    tuple(parts[False][1]), tuple(parts[True][1]))


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


@functools.cache
def python_source() -> TextSplits:
  """The running interpreter's top-level stdlib ``*.py`` files, split."""
  stdlib = sysconfig.get_paths()["stdlib"]
  files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
  if not files:
    raise FileNotFoundError(
        f"no *.py files in the standard library directory {stdlib!r}; "
        "the GPT models need the interpreter's stdlib sources")
  return _split((os.path.basename(p), _read(p)) for p in files)


@functools.cache
def english_prose() -> TextSplits:
  """The Python manual's topic texts from ``pydoc_data.topics``, split."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  return _split((key, topics.topics[key].encode("utf-8"))
                for key in sorted(topics.topics))


def classification_batch(data: ArrayDataset, batch_size: int, seed: int,
                         position: int) -> dict[str, np.ndarray]:
  """The ``position``-th batch of epoch-wise shuffled classification data.

  Epoch ``e = position // batches_per_epoch`` uses the permutation drawn from
  ``default_rng((seed, e))``; incomplete tail batches are dropped.

  Args:
    data: the train split.
    batch_size: examples per batch.
    seed: data seed of the run.
    position: number of batches consumed before this one.

  Returns:
    ``{"x": float32 [B, 8, 8, 1], "y": int32 [B]}``.
  """
  n = len(data.y)
  per_epoch = n // batch_size
  epoch, index = divmod(int(position), per_epoch)
  perm = np.random.default_rng((seed, epoch)).permutation(n)
  idx = perm[index * batch_size:(index + 1) * batch_size]
  return {"x": data.x[idx], "y": data.y[idx]}


def text_batch(data: np.ndarray, batch_size: int, context: int, seed: int,
               position: int) -> dict[str, np.ndarray]:
  """Random windows of ``context + 1`` bytes, a pure function of position.

  Args:
    data: uint8 corpus.
    batch_size: windows per batch.
    context: tokens the model sees; targets are the next bytes.
    seed: data seed of the run.
    position: number of batches consumed before this one.

  Returns:
    ``{"tokens": int32 [B, T], "targets": int32 [B, T]}``.
  """
  rng = np.random.default_rng((seed, int(position)))
  starts = rng.integers(0, len(data) - context - 1, size=batch_size)
  windows = data[starts[:, None] + np.arange(context + 1)].astype(np.int32)
  return {"tokens": windows[:, :-1], "targets": windows[:, 1:]}


def text_eval_windows(data: np.ndarray, context: int,
                      max_windows: int) -> dict[str, np.ndarray]:
  """Evenly spaced, non-overlapping evaluation windows of a test split."""
  count = min(max_windows, (len(data) - 1) // context)
  stride = (len(data) - 1) // count
  starts = np.arange(count) * stride
  windows = data[starts[:, None] + np.arange(context + 1)].astype(np.int32)
  return {"tokens": windows[:, :-1], "targets": windows[:, 1:]}
