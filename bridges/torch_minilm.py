"""all-MiniLM-L6-v2 in PyTorch, and its layer-by-layer agreement with the port.

:class:`TorchMiniLM` is a small ``torch.nn`` BERT written here (the
``transformers`` package is not used): its module names are HF ``BertModel``'s
(``embeddings.word_embeddings``, ``encoder.layer.0.attention.self.query``,
...), so ``model.safetensors`` loads into it with ``load_state_dict``, and it
computes the same sentence embedding as the Flax port
:class:`peat_jax.models.minilm.MiniLM` (mean pooling, L2 normalization).

:func:`compare_layers` runs real sentences through

* the JAX port in float32 (the golden model of the campaigns),
* this torch module in float32,
* this torch module in float64 (the reference),

and reports, per named activation (``embeddings``, ``layer.i.attention``,
``layer.i.intermediate``, ``layer.i.output``, ``pooled``, ``embedding``),
the max and RMS relative error of each float32 side against the float64
reference, over real (unpadded) tokens:

* ``max_rel = max|x - r| / max|r|`` (norm-wise, so near-zero elements do not
  dominate);
* ``rms_rel = ||x - r||_2 / ||r||_2``;

and optionally the peat_jax signature and diagnosis of torch float32 (as a
kernel under test) against JAX float32 (as golden) with the float64
reference.

:func:`build_port` plugs the finetuning classifier
(:class:`TorchMiniLMClassifier`) into :mod:`peat_jax.bridges.compare`
(activations, activation gradients and parameter gradients layer by layer,
and a training step played back in torch).

torch is imported when this module is imported (never by ``peat_jax``
itself); without it the import raises ``TorchNotInstalledError`` saying how
to install it.
"""

import os
from typing import Any, NamedTuple, Sequence

import numpy as np
from flax import nnx

from peat_jax.core import PeatError
from peat_jax.models import minilm as minilm_lib
from peat_jax.models import wordpiece

from peat_jax.bridges._torch import require_torch

torch = require_torch()  # TorchNotInstalledError says how to install it
nn = torch.nn


# ------------------------------------------------------------------ model


class _Embeddings(nn.Module):

  def __init__(self, config: minilm_lib.MiniLMConfig):
    super().__init__()
    d = config.hidden_size
    self.word_embeddings = nn.Embedding(config.vocab_size, d)
    self.position_embeddings = nn.Embedding(config.max_positions, d)
    self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
    self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)  # pylint: disable=invalid-name

  def forward(self, ids):
    t = ids.shape[1]
    positions = torch.arange(t, device=ids.device)
    types = torch.zeros(t, dtype=torch.long, device=ids.device)
    x = (self.word_embeddings(ids) + self.position_embeddings(positions)[None]
         + self.token_type_embeddings(types)[None])
    return self.LayerNorm(x)


class _AttentionCore(nn.Module):
  """softmax(q k^T / sqrt(D), masked) v on ``[B, H, T, D]`` (no weights)."""

  def forward(self, q, k, v, mask):
    scores = q @ k.transpose(-1, -2) / float(np.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~mask[:, None, None, :],
                                torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ v


class _SelfAttention(nn.Module):

  def __init__(self, config: minilm_lib.MiniLMConfig):
    super().__init__()
    d = config.hidden_size
    self.heads = config.num_heads
    self.query = nn.Linear(d, d)
    self.key = nn.Linear(d, d)
    self.value = nn.Linear(d, d)

    self.core = _AttentionCore()

  def forward(self, x, mask):
    b, t, d = x.shape
    split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
    y = self.core(split(self.query(x)), split(self.key(x)),
                  split(self.value(x)), mask)
    return y.transpose(1, 2).reshape(b, t, d)


class _DenseNorm(nn.Module):
  """HF's ``BertSelfOutput`` / ``BertOutput``: LayerNorm(dense(h) + x)."""

  def __init__(self, width: int, config: minilm_lib.MiniLMConfig):
    super().__init__()
    self.dense = nn.Linear(width, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size,  # pylint: disable=invalid-name
                                  eps=config.layer_norm_eps)

  def forward(self, h, x):
    return self.LayerNorm(self.dense(h) + x)


class _Attention(nn.Module):

  def __init__(self, config: minilm_lib.MiniLMConfig):
    super().__init__()
    self.self = _SelfAttention(config)
    self.output = _DenseNorm(config.hidden_size, config)

  def forward(self, x, mask):
    return self.output(self.self(x, mask), x)


class _Intermediate(nn.Module):

  def __init__(self, config: minilm_lib.MiniLMConfig):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

  def forward(self, x):
    return nn.functional.gelu(self.dense(x))  # exact erf form, as BERT


class _Layer(nn.Module):

  def __init__(self, config: minilm_lib.MiniLMConfig):
    super().__init__()
    self.attention = _Attention(config)
    self.intermediate = _Intermediate(config)
    self.output = _DenseNorm(config.intermediate_size, config)

  def forward(self, x, mask, collect, prefix):
    a = self.attention(x, mask)
    i = self.intermediate(a)
    out = self.output(i, a)
    collect.update({f"{prefix}attention": a, f"{prefix}intermediate": i,
                    f"{prefix}output": out})
    return out


class _Encoder(nn.Module):

  def __init__(self, config: minilm_lib.MiniLMConfig):
    super().__init__()
    self.layer = nn.ModuleList(_Layer(config)
                               for _ in range(config.num_layers))


class TorchMiniLM(nn.Module):
  """BERT + mean pooling + L2 normalization, with HF ``BertModel`` names.

  Args:
    config: the model config (:func:`peat_jax.models.minilm.read_config`).
  """

  def __init__(self, config: minilm_lib.MiniLMConfig):
    super().__init__()
    self.config = config
    self.embeddings = _Embeddings(config)
    self.encoder = _Encoder(config)

  def layer_outputs(self, ids: "torch.Tensor") -> dict[str, "torch.Tensor"]:
    """Every named activation (the names of ``MiniLM.layer_outputs``)."""
    mask = ids != self.config.pad_id
    collect = {}
    x = collect["embeddings"] = self.embeddings(ids)
    for i, layer in enumerate(self.encoder.layer):
      x = layer(x, mask, collect, f"layer.{i}.")
    m = mask.to(x.dtype)[..., None]
    pooled = (x * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
    collect["pooled"] = pooled
    collect["embedding"] = nn.functional.normalize(pooled, p=2, dim=-1)
    return collect

  def forward(self, ids: "torch.Tensor") -> "torch.Tensor":
    """L2-normalized sentence embeddings ``[B, hidden_size]``."""
    return self.layer_outputs(ids)["embedding"]


class TorchMiniLMClassifier(nn.Module):
  """:class:`TorchMiniLM` (``bert``) and a dense head (``classifier``).

  The torch counterpart of ``peat_jax.models.minilm.MiniLMClassifier``:
  logits ``classifier(sqrt(hidden_size) * embedding)``.
  """

  def __init__(self, classes: int, config: minilm_lib.MiniLMConfig):
    super().__init__()
    self.bert = TorchMiniLM(config)
    self.classifier = nn.Linear(config.hidden_size, classes)
    self.scale = float(np.sqrt(config.hidden_size))

  def forward(self, ids: "torch.Tensor") -> "torch.Tensor":
    return self.classifier(self.scale * self.bert(ids))


def load_torch_model(model_dir: str | os.PathLike | None = None,
                     dtype: "torch.dtype" = torch.float32) -> TorchMiniLM:
  """A :class:`TorchMiniLM` with the weights of ``model_dir``, in eval mode.

  Args:
    model_dir: default: the installed all-MiniLM-L6-v2.
    dtype: ``torch.float32`` or ``torch.float64`` (weights are converted
      from the file's float32 exactly).

  Returns:
    The module (no gradients needed: call it under ``torch.no_grad()``).

  Raises:
    PeatError: missing, unexpected (beyond
      :data:`peat_jax.models.minilm.IGNORED_WEIGHTS`) or mis-shaped tensors,
      listing each.
  """
  from safetensors import torch as st_torch  # pylint: disable=g-import-not-at-top

  model_dir = os.fspath(model_dir or minilm_lib.default_model_dir())
  config = minilm_lib.read_config(model_dir)
  path = os.path.join(model_dir, "model.safetensors")
  if not os.path.isfile(path):
    raise PeatError(f"{path!r} does not exist; pass the directory of a "
                    "sentence-transformers BERT model")
  tensors = {k: v for k, v in st_torch.load_file(path).items()
             if k not in minilm_lib.IGNORED_WEIGHTS}
  model = TorchMiniLM(config)
  own = model.state_dict()
  missing = sorted(set(own) - set(tensors))
  extra = sorted(set(tensors) - set(own))
  bad = sorted(f"{k}: expected {tuple(own[k].shape)}, got {tuple(v.shape)}"
               for k, v in tensors.items() if k in own
               and own[k].shape != v.shape)
  if missing or extra or bad:
    raise PeatError(
        f"{path} does not match TorchMiniLM: missing {missing}, unexpected "
        f"{extra}, mis-shaped {bad}; pass a BERT checkpoint with HF BertModel "
        "tensor names and the shapes of its config.json")
  model.load_state_dict(tensors, strict=True)
  return model.to(dtype).eval()


# -------------------------------------------------------------- comparison


class LayerAgreement(NamedTuple):
  """Agreement of one named activation with the float64 reference.

  Attributes:
    name: activation name (``embeddings``, ``layer.0.attention``, ...).
    elements: compared elements (real tokens only for token-level ones).
    jax_max_rel: ``max|jax32 - ref| / max|ref|``.
    jax_rms_rel: ``||jax32 - ref|| / ||ref||``.
    torch_max_rel: the same for torch float32.
    torch_rms_rel: the same for torch float32.
    torch_vs_jax_max_rel: ``max|torch32 - jax32| / max|ref|``.
    diagnosis: peat_jax error model of torch32 (as KUT) vs jax32 (as
      golden) with the reference, or ``""`` when not asked for.
    verdict: that diagnosis's verdict (``pass``/``warn``/``fail``) or ``""``.
  """

  name: str
  elements: int
  jax_max_rel: float
  jax_rms_rel: float
  torch_max_rel: float
  torch_rms_rel: float
  torch_vs_jax_max_rel: float
  diagnosis: str
  verdict: str


def _rel(x: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
  diff = x.astype(np.float64) - ref
  scale = float(np.max(np.abs(ref)))
  return (float(np.max(np.abs(diff))) / scale,
          float(np.linalg.norm(diff) / np.linalg.norm(ref)))


def _valid(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Token-level activations at real tokens [N, width]; others unchanged."""
  return x[mask] if x.ndim == 3 else x


def jax_layer_outputs(model: minilm_lib.MiniLM,
                      ids: np.ndarray) -> dict[str, np.ndarray]:
  """``model.layer_outputs(ids)``, jitted, as float32 numpy arrays."""
  out = _jax_layer_outputs(model, ids)
  return {k: np.asarray(v) for k, v in out.items()}


_jax_layer_outputs = nnx.jit(lambda model, ids: model.layer_outputs(ids))


def torch_layer_outputs(model: TorchMiniLM,
                        ids: np.ndarray) -> dict[str, np.ndarray]:
  """``model.layer_outputs(ids)`` without gradients, as numpy arrays."""
  with torch.no_grad():
    out = model.layer_outputs(torch.from_numpy(ids.astype(np.int64)))
  return {k: v.numpy() for k, v in out.items()}


def compare_layers(texts: Sequence[str], *, length: int = 64,
                   model_dir: str | os.PathLike | None = None,
                   diagnose: bool = False,
                   models: tuple | None = None) -> list[LayerAgreement]:
  """Layer-by-layer agreement of JAX f32 and torch f32 with torch f64.

  Tokenizes ``texts``, runs the three models (:func:`run_models`) and
  compares their activations (:func:`agreement`).

  Args:
    texts: the sentences (tokenized with the model's ``vocab.txt``).
    length: tokens per sentence (``[CLS]``, ``[SEP]`` and padding included).
    model_dir: default: the installed all-MiniLM-L6-v2.
    diagnose: also run ``peat.analyze``/``peat.detect`` per activation
      (torch f32 as the kernel under test, JAX f32 as golden).
    models: ``(jax_model, torch_f32, torch_f64)`` already loaded (they are
      loaded from ``model_dir`` when None).

  Returns:
    One :class:`LayerAgreement` per activation, in forward order.

  Raises:
    PeatError: no texts, or a model directory that does not load.
  """
  if not texts:
    raise PeatError("compare_layers needs at least one text")
  model_dir = os.fspath(model_dir or minilm_lib.default_model_dir())
  tok = wordpiece.WordPiece.from_file(os.path.join(model_dir, "vocab.txt"))
  enc = tok.encode(list(texts), length)
  if models is None:
    models = (minilm_lib.load_model(model_dir),
              load_torch_model(model_dir, torch.float32),
              load_torch_model(model_dir, torch.float64))
  return agreement(*run_models(models, enc.ids), enc.mask.astype(bool),
                   diagnose=diagnose)


def run_models(models: tuple, ids: np.ndarray) -> tuple[dict, dict, dict]:
  """Named activations of ``(jax_model, torch_f32, torch_f64)`` on ``ids``.

  Raises:
    PeatError: the three do not produce the same activation names.
  """
  jax_model, torch32, torch64 = models
  outs = (jax_layer_outputs(jax_model, ids), torch_layer_outputs(torch32, ids),
          torch_layer_outputs(torch64, ids))
  names = minilm_lib.activation_names(jax_model.config.num_layers)
  if any(set(o) != set(names) for o in outs):
    raise PeatError(f"activation names differ: expected {names}, got "
                    f"{[sorted(o) for o in outs]}")
  return outs


def agreement(j32: dict, t32: dict, t64: dict, mask: np.ndarray, *,
              diagnose: bool = False) -> list[LayerAgreement]:
  """Agreement rows of named activations (see :func:`compare_layers`).

  Args:
    j32: JAX float32 activations (:func:`jax_layer_outputs`).
    t32: torch float32 activations.
    t64: torch float64 activations (the reference).
    mask: bool ``[B, T]``, True at real tokens; token-level activations are
      compared there only.
    diagnose: add peat_jax's diagnosis of t32 (KUT) vs j32 (golden).

  Returns:
    One :class:`LayerAgreement` per activation, in forward order.
  """
  rows = []
  layers = sum(name.endswith(".output") for name in j32)
  for name in minilm_lib.activation_names(layers):
    ref = _valid(t64[name], mask)
    j, t = _valid(j32[name], mask), _valid(t32[name], mask)
    jmax, jrms = _rel(j, ref)
    tmax, trms = _rel(t, ref)
    cross = float(np.max(np.abs(t.astype(np.float64) - j))
                  / np.max(np.abs(ref)))
    diagnosis = verdict = ""
    if diagnose:
      import peat_jax as peat  # pylint: disable=g-import-not-at-top

      diag = peat.detect(peat.analyze(t, j, reference=ref))
      diagnosis, verdict = diag.model, diag.verdict
    rows.append(LayerAgreement(name, int(ref.size), jmax, jrms, tmax, trms,
                               cross, diagnosis, verdict))
  return rows


def format_table(rows: Sequence[LayerAgreement]) -> str:
  """A Markdown table of :func:`compare_layers` rows."""
  diag = any(r.diagnosis for r in rows)
  head = ["activation", "elements", "JAX f32 max rel", "JAX f32 RMS rel",
          "torch f32 max rel", "torch f32 RMS rel", "torch vs JAX max rel"]
  if diag:
    head.append("diagnosis (torch vs JAX)")
  lines = ["| " + " | ".join(head) + " |",
           "|" + "|".join(" --- " for _ in head) + "|"]
  for r in rows:
    cells = [r.name, f"{r.elements:,}", f"{r.jax_max_rel:.2e}",
             f"{r.jax_rms_rel:.2e}", f"{r.torch_max_rel:.2e}",
             f"{r.torch_rms_rel:.2e}", f"{r.torch_vs_jax_max_rel:.2e}"]
    if diag:
      cells.append(f"{r.diagnosis} ({r.verdict})")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


# ------------------------------------ port for peat_jax.bridges.compare


def classifier_weight_map(config: minilm_lib.MiniLMConfig) -> list:
  """Flax ``MiniLMClassifier`` parameters -> :class:`TorchMiniLMClassifier`.

  The encoder's entries are :func:`peat_jax.models.minilm.weight_map`'s
  under ``encoder`` / ``bert.``; the head is ``head`` / ``classifier``.

  Returns:
    ``peat_jax.bridges.torch_models.WeightMap`` entries in forward order.
  """
  from peat_jax.bridges.torch_models import WeightMap  # pylint: disable=g-import-not-at-top

  out = [WeightMap(("encoder",) + w.path, (f"bert.{w.name}",),
                   "dense" if w.transpose else "same")
         for w in minilm_lib.weight_map(config)]
  return out + [WeightMap(("head", "kernel"), ("classifier.weight",), "dense"),
                WeightMap(("head", "bias"), ("classifier.bias",), "same")]


def classifier_points(jax_loss, params, batch, num_layers: int) -> list:
  """The activation name mapping of the classifier, from its JAX sites.

  The forward sites of ``jax_loss(params, batch)`` are found by
  ``peat.discover_sites`` and taken in order (names follow the site naming
  rules, so they are not spelled here): layer norm 0 is the embeddings',
  then two per layer; one attention and one GELU per layer; six dense
  ``dot_general`` per layer (query, key, value, attention output,
  intermediate, output), then the head.

  Points, per layer ``i`` (``L = bert.encoder.layer.i``):
  ``layer.i.query|key|value`` (dense + bias, ``L.attention.self.query``...),
  ``layer.i.core`` (attention ``[B, T, H, D]`` vs torch's ``[B, H, T, D]``,
  ``L.attention.self.core``), ``layer.i.attention`` (after its layer norm,
  ``L.attention.output.LayerNorm``), ``layer.i.intermediate`` (after GELU,
  ``L.intermediate``), ``layer.i.output`` (``L.output.LayerNorm``); before
  them ``embeddings`` (``bert.embeddings.LayerNorm``), after them
  ``head.in`` (the scaled sentence embedding) and ``head`` (logits).

  Returns:
    ``peat_jax.bridges.compare.Point`` entries in forward order.

  Raises:
    PeatError: the traced loss does not have the expected sites.
  """
  import peat_jax as peat  # pylint: disable=g-import-not-at-top
  from peat_jax.bridges.compare import Point  # pylint: disable=g-import-not-at-top

  table = peat.discover_sites(jax_loss, params, batch)
  fwd = lambda kernel: [s.name for s in table if s.phase == "fwd"
                        and s.kernel == kernel and "composite" not in s.where]
  ln, gelu, attn = fwd("layer_norm"), fwd("gelu"), fwd("attention")
  dense = fwd("dot_general")
  want = {"layer_norm": 2 * num_layers + 1, "gelu": num_layers,
          "attention": num_layers, "dot_general": 6 * num_layers + 1}
  got = {"layer_norm": len(ln), "gelu": len(gelu), "attention": len(attn),
         "dot_general": len(dense)}
  if got != want:
    raise PeatError(f"the JAX loss has forward sites {got}, expected {want} "
                    f"for a {num_layers}-layer MiniLM classifier")
  points = [Point("embeddings", ln[0], ("bert.embeddings.LayerNorm",))]
  for i in range(num_layers):
    t, f = f"bert.encoder.layer.{i}", ("encoder", "layers", i)
    for j, n in enumerate(("query", "key", "value")):
      points.append(Point(f"layer.{i}.{n}", dense[6 * i + j],
                          (f"{t}.attention.self.{n}",),
                          jax_bias=f + ("attention", n, "bias")))
    points += [
        Point(f"layer.{i}.core", attn[i], (f"{t}.attention.self.core",),
              layout="bhtd_bthd"),
        Point(f"layer.{i}.attention", ln[1 + 2 * i],
              (f"{t}.attention.output.LayerNorm",)),
        Point(f"layer.{i}.intermediate", gelu[i], (f"{t}.intermediate",)),
        Point(f"layer.{i}.output", ln[2 + 2 * i], (f"{t}.output.LayerNorm",)),
    ]
  return points + [
      Point("head.in", dense[-1], ("classifier",), jax_port="in0",
            torch_port="in0"),
      Point("head", dense[-1], ("classifier",), jax_bias=("head", "bias"))]


def build_port(task: Any):
  """The torch port of a ``minilm_finetune`` task, for ``bridges.compare``.

  ``compare.compare_port(build_port(task), params, batch)`` compares
  activations, activation gradients and parameter gradients layer by layer
  (float64 torch as the reference), and ``compare.compare_train_step(task,
  golden_dir, step, port=build_port(task))`` plays a golden training step
  back in torch.

  Args:
    task: a TrainTask of :mod:`peat_jax.models.minilm_task`.

  Returns:
    A ``peat_jax.bridges.torch_models.Port`` (``model="minilm"``).

  Raises:
    PeatError: a task that is not a MiniLM finetuning task.
  """
  from peat_jax.bridges import torch_models  # pylint: disable=g-import-not-at-top
  from peat_jax.models import layers  # pylint: disable=g-import-not-at-top

  config = dict(task.config)
  if config.get("model") != "minilm":
    raise PeatError(f"build_port needs a MiniLM finetuning task, got model "
                    f"{config.get('model')!r}")
  model_config = minilm_lib.read_config(config["model_dir"])
  classes = len(config["classes"])
  make = lambda: TorchMiniLMClassifier(classes, model_config)

  def inputs(batch):
    return torch.from_numpy(np.asarray(batch["x"]).astype(np.int64))

  def loss(module, batch):
    labels = torch.from_numpy(np.asarray(batch["y"]).astype(np.int64))
    return nn.functional.cross_entropy(module(inputs(batch)), labels)

  def jax_loss(params, batch):
    return layers.cross_entropy(task.model_fn(params, batch["x"]),
                                batch["y"])

  state = task.init_state(0)
  points = classifier_points(jax_loss, state.params, task.batch_at(0),
                             model_config.num_layers)
  return torch_models.Port("minilm", make(), classifier_weight_map(
      model_config), points, inputs, loss, make, jax_loss)
