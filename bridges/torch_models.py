"""torch ports of the reference models (cnn, vit, gpt) and their weight maps.

Each Flax model of ``peat_jax.models`` has a ``torch.nn`` port written the way
a PyTorch user would write it (``nn.Conv2d`` on NCHW, ``nn.Linear``,
``nn.LayerNorm``, separate q/k/v projections,
``F.scaled_dot_product_attention``), and an explicit :class:`WeightMap` from
the Flax parameters to the torch ``state_dict``:

| Flax | torch | layout |
| --- | --- | --- |
| ``nnx.Linear`` ``kernel`` ``(in, out)`` | ``nn.Linear.weight`` ``(out, in)`` | ``dense`` (transpose) |
| ``nnx.Conv`` ``kernel`` HWIO | ``nn.Conv2d.weight`` OIHW | ``conv`` (permute 3, 2, 0, 1) |
| fused ``attn.qkv.kernel`` ``(d, 3d)``, columns ``[q \\| k \\| v]``, heads inside | ``attn.q/k/v.weight`` ``(d, d)`` each | ``qkv_dense`` (split columns, transpose) |
| fused ``attn.qkv.bias`` ``(3d,)`` | ``attn.q/k/v.bias`` | ``qkv_bias`` (split) |
| ``LayerNorm`` ``scale``, ``bias`` | ``nn.LayerNorm`` ``weight``, ``bias`` | ``same`` (renamed) |
| ``nnx.Embed`` ``embedding`` ``(n, d)`` | ``nn.Embedding.weight`` ``(n, d)`` | ``same`` |
| ``cls``, ``pos`` (ViT) | ``cls``, ``pos`` parameters | ``same`` |

Loading checks both sides and lists every problem at once: Flax leaves the
map does not know or misses, torch keys missing or unexpected, shapes that
differ, and dtypes that differ (never cast silently: ask for a cast with
``cast=``).

>>> port = build_port(task)                       # doctest: +SKIP
>>> load_flax_params(port.module, state.params, port.weight_map)  # doctest: +SKIP
>>> logits = port.module(port.inputs(batch))      # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from peat_jax.core import PeatError
from peat_jax.bridges._torch import require_torch
from peat_jax.bridges._torch import to_numpy
from peat_jax.bridges._torch import torch_dtype
from peat_jax.bridges.compare import Point

torch = require_torch()
nn = torch.nn
F = torch.nn.functional

__all__ = ["Port", "TorchCnn", "TorchGpt", "TorchVit", "WeightMap",
           "LAYOUTS", "build_port", "check_state_dict", "flax_to_torch",
           "load_flax_params", "model_points", "torch_to_flax", "weight_map"]


# ---------------------------------------------------------------- models


class TorchCnn(nn.Module):
  """Port of ``models/cnn.py``: inputs ``[B, 8, 8, 1]`` NHWC like Flax."""

  def __init__(self, classes: int = 10, width: int = 16):
    super().__init__()
    self.conv1 = nn.Conv2d(1, width, 3, padding=1)
    self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
    self.conv3 = nn.Conv2d(2 * width, 4 * width, 3, padding=1)
    self.head = nn.Linear(4 * width, classes)

  def forward(self, x):
    x = x.permute(0, 3, 1, 2)  # NHWC -> NCHW
    x = F.relu(self.conv1(x))
    x = F.relu(self.conv2(x))
    x = F.avg_pool2d(x, 2)
    x = F.relu(self.conv3(x))
    return self.head(x.mean(dim=(2, 3)))


class Attention(nn.Module):
  """Scaled dot-product attention on ``[B, H, T, D]`` (a module for hooks)."""

  def forward(self, q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class SelfAttention(nn.Module):
  """Separate q, k, v projections (as most torch ports write it)."""

  def __init__(self, dim: int, heads: int):
    super().__init__()
    self.heads = heads
    self.q = nn.Linear(dim, dim)
    self.k = nn.Linear(dim, dim)
    self.v = nn.Linear(dim, dim)
    self.core = Attention()
    self.out = nn.Linear(dim, dim)

  def forward(self, x, mask=None):
    b, t, d = x.shape
    split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
    y = self.core(split(self.q(x)), split(self.k(x)), split(self.v(x)), mask)
    return self.out(y.transpose(1, 2).reshape(b, t, d))


class Mlp(nn.Module):
  """fc1, exact GELU, fc2."""

  def __init__(self, dim: int, hidden: int):
    super().__init__()
    self.fc1 = nn.Linear(dim, hidden)
    self.act = nn.GELU()
    self.fc2 = nn.Linear(hidden, dim)

  def forward(self, x):
    return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
  """Pre-LN block, layer norms with eps 1e-6 like ``models/layers.py``."""

  def __init__(self, dim: int, heads: int, mlp_ratio: int):
    super().__init__()
    self.ln1 = nn.LayerNorm(dim, eps=1e-6)
    self.attn = SelfAttention(dim, heads)
    self.ln2 = nn.LayerNorm(dim, eps=1e-6)
    self.mlp = Mlp(dim, mlp_ratio * dim)

  def forward(self, x, mask=None):
    x = x + self.attn(self.ln1(x), mask)
    return x + self.mlp(self.ln2(x))


class TorchVit(nn.Module):
  """Port of ``models/vit.py`` (2x2 patches of 8x8 digits, class token)."""

  def __init__(self, classes: int = 10, dim: int = 64, depth: int = 2,
               heads: int = 4, mlp_ratio: int = 2, patch: int = 2):
    super().__init__()
    self.patch = patch
    tokens = (8 // patch) ** 2
    self.embed = nn.Linear(patch * patch, dim)
    self.cls = nn.Parameter(torch.zeros(1, 1, dim))
    self.pos = nn.Parameter(torch.zeros(1, tokens + 1, dim))
    self.blocks = nn.ModuleList(
        [Block(dim, heads, mlp_ratio) for _ in range(depth)])
    self.ln = nn.LayerNorm(dim, eps=1e-6)
    self.head = nn.Linear(dim, classes)

  def forward(self, x):
    b, h, w, _ = x.shape
    p = self.patch
    x = x.reshape(b, h // p, p, w // p, p).permute(0, 1, 3, 2, 4)
    x = self.embed(x.reshape(b, (h // p) * (w // p), p * p))
    x = torch.cat([self.cls.expand(b, 1, x.shape[-1]), x], dim=1) + self.pos
    for block in self.blocks:
      x = block(x)
    return self.head(self.ln(x[:, 0]))


class TorchGpt(nn.Module):
  """Port of ``models/gpt.py`` (byte decoder, causal pre-LN blocks)."""

  def __init__(self, dim: int = 128, depth: int = 2, heads: int = 4,
               mlp_ratio: int = 4, context: int = 64, vocab: int = 256):
    super().__init__()
    self.context = context
    self.tok = nn.Embedding(vocab, dim)
    self.pos = nn.Embedding(context, dim)
    self.blocks = nn.ModuleList(
        [Block(dim, heads, mlp_ratio) for _ in range(depth)])
    self.ln = nn.LayerNorm(dim, eps=1e-6)
    self.head = nn.Linear(dim, vocab)

  def forward(self, tokens):
    t = tokens.shape[1]
    if t > self.context:
      raise PeatError(f"sequence length {t} exceeds context {self.context}")
    x = self.tok(tokens) + self.pos(torch.arange(t))[None]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))[None, None]
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.ln(x))


# ------------------------------------------------------------ weight maps


class WeightMap(NamedTuple):
  """One Flax parameter and the torch ``state_dict`` entries it becomes.

  Attributes:
    flax: path in the Flax parameter dict, e.g.
      ``("blocks", 0, "attn", "qkv", "kernel")``.
    torch: the torch key(s), e.g. ``("blocks.0.attn.q.weight",
      "blocks.0.attn.k.weight", "blocks.0.attn.v.weight")``.
    layout: a key of :data:`LAYOUTS`.
  """

  flax: tuple
  torch: tuple
  layout: str


def _split3(a, axis):
  n = a.shape[axis] // 3
  return [np.take(a, np.arange(i * n, (i + 1) * n), axis=axis)
          for i in range(3)]


#: layout -> (Flax array -> list of torch-layout arrays,
#:            list of torch-layout arrays -> Flax array)
LAYOUTS: dict[str, tuple[Callable, Callable]] = {
    "same": (lambda a: [a], lambda ts: ts[0]),
    "dense": (lambda a: [a.T], lambda ts: ts[0].T),
    "conv": (lambda a: [a.transpose(3, 2, 0, 1)],
             lambda ts: ts[0].transpose(2, 3, 1, 0)),
    "qkv_dense": (lambda a: [x.T for x in _split3(a, 1)],
                  lambda ts: np.concatenate([t.T for t in ts], axis=1)),
    "qkv_bias": (lambda a: _split3(a, 0), lambda ts: np.concatenate(ts, 0)),
}


def _dense(flax_prefix: tuple, torch_prefix: str) -> list[WeightMap]:
  return [WeightMap(flax_prefix + ("kernel",), (f"{torch_prefix}.weight",),
                    "dense"),
          WeightMap(flax_prefix + ("bias",), (f"{torch_prefix}.bias",),
                    "same")]


def _norm(flax_prefix: tuple, torch_prefix: str) -> list[WeightMap]:
  return [WeightMap(flax_prefix + ("scale",), (f"{torch_prefix}.weight",),
                    "same"),
          WeightMap(flax_prefix + ("bias",), (f"{torch_prefix}.bias",),
                    "same")]


def _blocks(depth: int) -> list[WeightMap]:
  out = []
  for i in range(depth):
    f, t = ("blocks", i), f"blocks.{i}"
    out += _norm(f + ("ln1",), f"{t}.ln1")
    out += [WeightMap(f + ("attn", "qkv", "kernel"),
                      tuple(f"{t}.attn.{n}.weight" for n in "qkv"),
                      "qkv_dense"),
            WeightMap(f + ("attn", "qkv", "bias"),
                      tuple(f"{t}.attn.{n}.bias" for n in "qkv"),
                      "qkv_bias")]
    out += _dense(f + ("attn", "out"), f"{t}.attn.out")
    out += _norm(f + ("ln2",), f"{t}.ln2")
    out += _dense(f + ("mlp", "fc1"), f"{t}.mlp.fc1")
    out += _dense(f + ("mlp", "fc2"), f"{t}.mlp.fc2")
  return out


def weight_map(model: str, depth: int = 2) -> list[WeightMap]:
  """The weight map of a reference model, in forward order.

  Args:
    model: ``"cnn"``, ``"vit"`` or ``"gpt"``.
    depth: number of transformer blocks (vit, gpt).

  Returns:
    One :class:`WeightMap` per Flax parameter.

  Raises:
    PeatError: an unknown model.
  """
  if model == "cnn":
    out = []
    for i in (1, 2, 3):
      out += [WeightMap((f"conv{i}", "kernel"), (f"conv{i}.weight",), "conv"),
              WeightMap((f"conv{i}", "bias"), (f"conv{i}.bias",), "same")]
    return out + _dense(("head",), "head")
  if model == "vit":
    return (_dense(("embed",), "embed")
            + [WeightMap(("cls",), ("cls",), "same"),
               WeightMap(("pos",), ("pos",), "same")]
            + _blocks(depth) + _norm(("ln",), "ln") + _dense(("head",), "head"))
  if model == "gpt":
    return ([WeightMap(("tok", "embedding"), ("tok.weight",), "same"),
             WeightMap(("pos", "embedding"), ("pos.weight",), "same")]
            + _blocks(depth) + _norm(("ln",), "ln") + _dense(("head",), "head"))
  raise PeatError(f"no torch port of model {model!r}; expected cnn, vit or "
                  "gpt")


def _flatten(tree: Mapping, prefix: tuple = ()) -> dict[tuple, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, prefix + (k,)))
    else:
      out[prefix + (k,)] = v
  return out


def _path(p: tuple) -> str:
  return "/".join(str(x) for x in p)


def _host(a) -> np.ndarray:
  return a if isinstance(a, np.ndarray) else np.asarray(a)


def flax_to_torch(params: Mapping, wmap: Sequence[WeightMap]
                  ) -> dict[str, np.ndarray]:
  """Flax parameters -> torch ``state_dict`` arrays (NumPy, same dtype).

  Args:
    params: the Flax parameter dict (``TrainState.params``).
    wmap: the weight map.

  Returns:
    ``{torch key: array in torch layout}``.

  Raises:
    PeatError: Flax parameters the map misses or lacks, or a parameter
      whose shape does not split as its layout needs, all listed.
  """
  flat = _flatten(params)
  known = {m.flax for m in wmap}
  missing = [_path(m.flax) for m in wmap if m.flax not in flat]
  extra = [_path(p) for p in flat if p not in known]
  bad = [f"{_path(m.flax)} {tuple(np.shape(flat[m.flax]))} cannot be split "
         "in 3" for m in wmap if m.flax in flat and m.layout.startswith("qkv")
         and np.shape(flat[m.flax])[-1] % 3]
  if missing or extra or bad:
    raise PeatError(
        "Flax parameters do not match the weight map: "
        + "; ".join(x for x in (
            f"missing {missing}" if missing else "",
            f"not in the map {extra}" if extra else "",
            f"bad shapes {bad}" if bad else "") if x)
        + ". Build the port with the model's config (build_port(task)) or "
        "fix the weight map.")
  out = {}
  for m in wmap:
    arrays = LAYOUTS[m.layout][0](_host(flat[m.flax]))
    for key, a in zip(m.torch, arrays):
      out[key] = a
  return out


def torch_to_flax(state: Mapping[str, Any], wmap: Sequence[WeightMap]
                  ) -> dict:
  """torch arrays (``state_dict`` or gradients) -> nested Flax dict (NumPy).

  Args:
    state: ``{torch key: tensor or array}``.
    wmap: the weight map.

  Returns:
    The Flax parameter dict layout, values as NumPy arrays.

  Raises:
    PeatError: torch keys the map needs that are missing.
  """
  missing = [k for m in wmap for k in m.torch if k not in state]
  if missing:
    raise PeatError(f"torch arrays missing for the weight map: {missing}")
  out: dict = {}
  for m in wmap:
    arrays = [to_numpy(state[k]) if not isinstance(state[k], np.ndarray)
              else state[k] for k in m.torch]
    node = out
    for k in m.flax[:-1]:
      node = node.setdefault(k, {})
    node[m.flax[-1]] = np.ascontiguousarray(LAYOUTS[m.layout][1](arrays))
  return out


def check_state_dict(module, state: Mapping[str, Any]) -> None:
  """Checks a state dict against a module: keys, shapes and dtypes.

  Args:
    module: the ``torch.nn.Module``.
    state: ``{key: tensor or NumPy array}``.

  Raises:
    PeatError: listing every missing key, unexpected key, shape mismatch
      and dtype mismatch (never cast silently).
  """
  want = module.state_dict()
  missing = sorted(set(want) - set(state))
  extra = sorted(set(state) - set(want))
  shapes, dtypes = [], []
  for k in sorted(set(want) & set(state)):
    got = state[k]
    gshape = tuple(got.shape)
    if gshape != tuple(want[k].shape):
      shapes.append(f"{k}: expected {tuple(want[k].shape)}, got {gshape}")
    gdt = got.dtype if isinstance(got, torch.Tensor) else torch_dtype(
        got.dtype)
    if gdt != want[k].dtype:
      dtypes.append(f"{k}: expected {want[k].dtype}, got {gdt}")
  if missing or extra or shapes or dtypes:
    parts = [f"missing keys {missing}" if missing else "",
             f"unexpected keys {extra}" if extra else "",
             f"shape mismatches [{'; '.join(shapes)}]" if shapes else "",
             f"dtype mismatches [{'; '.join(dtypes)}]" if dtypes else ""]
    raise PeatError(
        f"state dict does not fit {type(module).__name__}: "
        + ", ".join(p for p in parts if p)
        + ". Fix: build the port with the checkpoint's config, map every "
        "weight, and cast dtypes explicitly (load_flax_params(..., cast=))")


def _to_tensor(a: np.ndarray):
  """A torch tensor holding a copy of ``a`` (bfloat16 kept as bfloat16)."""
  a = np.array(a, order="C", copy=True)
  if a.dtype.name == "bfloat16":
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
  return torch.from_numpy(a)


def load_flax_params(module, params: Mapping, wmap: Sequence[WeightMap], *,
                     cast: Any = None) -> None:
  """Loads Flax parameters into a torch port (checked, no silent cast).

  Args:
    module: the torch port.
    params: the Flax parameter dict.
    wmap: its weight map.
    cast: a torch dtype to cast every parameter to on purpose (e.g.
      ``torch.float64`` for a reference port); None keeps the dtypes, which
      must then equal the module's.

  Raises:
    PeatError: as :func:`flax_to_torch` and :func:`check_state_dict`.
  """
  arrays = flax_to_torch(params, wmap)
  state = {k: _to_tensor(v) for k, v in arrays.items()}
  if cast is not None:
    state = {k: v.to(cast) for k, v in state.items()}
  check_state_dict(module, state)
  with torch.no_grad():
    module.load_state_dict(state, strict=True)


# ---------------------------------------------------------------- points


def _block_points(prefix: str, depth: int) -> list[Point]:
  mha = f"fwd/{prefix}/Block/MultiHeadAttention/Linear/dot_general"
  mlp = f"fwd/{prefix}/Block/Mlp/Linear/dot_general"
  out = []
  for i in range(depth):
    t, f = f"blocks.{i}", ("blocks", i)
    out += [
        Point(f"{t}.in", f"fwd/layer_norm:{2 * i}", (f"{t}.ln1",),
              jax_port="in0", torch_port="in0"),
        Point(f"{t}.ln1", f"fwd/layer_norm:{2 * i}", (f"{t}.ln1",)),
        Point(f"{t}.attn.qkv", f"{mha}:{2 * i}",
              tuple(f"{t}.attn.{n}" for n in "qkv"), layout="concat",
              jax_bias=f + ("attn", "qkv", "bias")),
        Point(f"{t}.attn.core", f"fwd/attention:{i}", (f"{t}.attn.core",),
              layout="bhtd_bthd"),
        Point(f"{t}.attn.out", f"{mha}:{2 * i + 1}", (f"{t}.attn.out",),
              jax_bias=f + ("attn", "out", "bias")),
        Point(f"{t}.ln2", f"fwd/layer_norm:{2 * i + 1}", (f"{t}.ln2",)),
        Point(f"{t}.mlp.fc1", f"{mlp}:{2 * i}", (f"{t}.mlp.fc1",),
              jax_bias=f + ("mlp", "fc1", "bias")),
        Point(f"{t}.mlp.act", f"fwd/gelu:{i}", (f"{t}.mlp.act",)),
        Point(f"{t}.mlp.fc2", f"{mlp}:{2 * i + 1}", (f"{t}.mlp.fc2",),
              jax_bias=f + ("mlp", "fc2", "bias")),
    ]
  out += [Point("ln.in", f"fwd/layer_norm:{2 * depth}", ("ln",),
                jax_port="in0", torch_port="in0"),
          Point("ln", f"fwd/layer_norm:{2 * depth}", ("ln",))]
  return out


def model_points(model: str, depth: int = 2) -> list[Point]:
  """The documented activation name mapping of a reference model.

  Each :class:`~peat_jax.bridges.compare.Point` pairs a JAX site (and
  port) with torch module(s): convolutions and dense layers are compared
  after the bias add (JAX sites compute ``x @ W``, the torch module adds the
  bias: ``jax_bias`` names it), the fused JAX qkv projection against the
  concatenated torch q, k, v outputs, attention ``[B, T, H, D]`` against
  torch's ``[B, H, T, D]``, convolutions NHWC against NCHW. ``*.in`` points
  compare the input of a layer norm (the residual stream).

  Args:
    model: ``"cnn"``, ``"vit"`` or ``"gpt"``.
    depth: number of blocks (vit, gpt).

  Returns:
    Points in forward order.

  Raises:
    PeatError: an unknown model.
  """
  if model == "cnn":
    return ([Point(f"conv{i + 1}", f"fwd/Cnn/Conv/conv_general_dilated:{i}",
                   (f"conv{i + 1}",), layout="nchw_nhwc",
                   jax_bias=(f"conv{i + 1}", "bias")) for i in range(3)]
            + [Point("head.in", "fwd/Cnn/Linear/dot_general:0", ("head",),
                     jax_port="in0", torch_port="in0"),
               Point("head", "fwd/Cnn/Linear/dot_general:0", ("head",),
                     jax_bias=("head", "bias"))])
  if model == "vit":
    return ([Point("embed", "fwd/Vit/Linear/dot_general:0", ("embed",),
                   jax_bias=("embed", "bias"))]
            + _block_points("Vit", depth)
            + [Point("head", "fwd/Vit/Linear/dot_general:1", ("head",),
                     jax_bias=("head", "bias"))])
  if model == "gpt":
    return (_block_points("Gpt", depth)
            + [Point("head", "fwd/Gpt/Linear/dot_general:0", ("head",),
                     jax_bias=("head", "bias"))])
  raise PeatError(f"no torch port of model {model!r}; expected cnn, vit or "
                  "gpt")


# ------------------------------------------------------------------ ports


class Port(NamedTuple):
  """A torch port of one reference model, ready to compare.

  Attributes:
    model: ``"cnn"``, ``"vit"`` or ``"gpt"``.
    module: the torch module (float32, parameters not loaded yet).
    weight_map: Flax -> torch parameter map.
    points: activation name mapping (forward order).
    inputs: ``batch -> torch input tensor`` (shares the batch's memory).
    loss: ``(module, batch) -> scalar torch loss`` (mean cross-entropy,
      as ``models/tasks.py``); float inputs are cast to the module's
      parameter dtype (float64 for a reference port: exact).
    make: ``() -> a fresh module of the same config``.
    jax_loss: ``(params, batch) -> loss`` of the JAX model (None when built
      from a config without a task).
  """

  model: str
  module: Any
  weight_map: list
  points: list
  inputs: Callable
  loss: Callable
  make: Callable
  jax_loss: Callable | None


_CLASSES = {"cnn": TorchCnn, "vit": TorchVit, "gpt": TorchGpt}


def build_port(task_or_config: Any) -> Port:
  """Builds the torch port of a task's model from its config.

  Args:
    task_or_config: a ``peat.TrainTask`` of a ``models`` scenario, or its
      ``config`` dict (``model`` and ``model_kwargs`` keys).

  Returns:
    A :class:`Port`.

  Raises:
    PeatError: a model without a port.
  """
  config = getattr(task_or_config, "config", task_or_config)
  model = config.get("model")
  if model not in _CLASSES:
    raise PeatError(f"no torch port of model {model!r}; expected one of "
                    f"{sorted(_CLASSES)}")
  kwargs = dict(config.get("model_kwargs", {}))
  make = lambda: _CLASSES[model](**kwargs)
  module = make()
  depth = int(kwargs.get("depth", 2))
  key = "x" if model in ("cnn", "vit") else "tokens"
  target = "y" if key == "x" else "targets"

  def inputs(batch):
    return _batch_tensor(batch[key])

  def loss(mod, batch):
    x = inputs(batch)
    if x.is_floating_point():
      x = x.to(next(mod.parameters()).dtype)
    logits = mod(x)
    labels = _batch_tensor(batch[target]).long()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           labels.reshape(-1))

  model_fn = getattr(task_or_config, "model_fn", None)
  jax_loss = None if model_fn is None else _jax_loss(model_fn, key, target)
  return Port(model, module, weight_map(model, depth),
              model_points(model, depth), inputs, loss, make, jax_loss)


def _jax_loss(model_fn: Callable, key: str, target: str) -> Callable:
  """``(params, batch) -> loss`` of a task's model, as ``models/tasks.py``."""
  from peat_jax.models import layers  # pylint: disable=g-import-not-at-top

  def jax_loss(params, batch):
    return layers.cross_entropy(model_fn(params, batch[key]), batch[target])

  return jax_loss


def _batch_tensor(a):
  a = np.asarray(a)
  if not (a.flags.writeable and a.flags.c_contiguous):
    a = np.array(a, order="C", copy=True)
  return torch.from_numpy(a)
