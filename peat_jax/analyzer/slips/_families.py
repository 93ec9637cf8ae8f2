"""Each composite kind's computation in float64, with the places a slip
changes.

A *family* is a kind's golden computation written so that every place a
port can slip is a parameter (:class:`Hooks`): its constants
(:data:`peat_jax.core.PARAMETERS`), its reduction (an exact sum, a block
dropped or counted twice, a narrow accumulator), an online softmax that
does not rescale, its ``exp``, ``1/sqrt``, ``1/x`` or activation (the
library's approximations), and attention's mask one key off. With the
default hooks each family is the kind's float64 reference
(``peat.REFERENCES``; tests/analyzer/test_slip_families.py checks it).

Operands arrive as the call's structured arguments (float64 arrays,
integer labels and positions, boolean masks, Python constants).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
from scipy import special

from peat_jax.analyzer.slips import _numerics as num


def _rsqrt(v: np.ndarray) -> np.ndarray:
  return 1.0 / np.sqrt(v)


def _rcp(s: np.ndarray) -> np.ndarray:
  return 1.0 / s


class Hooks(NamedTuple):
  """The places a slip changes (defaults: the golden computation).

  Attributes:
    params: constants set to other values (name -> value).
    reduce: the kernel's reduction ``(x, axis) -> sum kept as a length-1
      axis``.
    online: an online softmax that does not rescale, or None.
    exp: the exponential.
    rsqrt: ``1/sqrt``.
    rcp: ``1/x``.
    act: the activation (gelu, silu) in place of the exact one, or None.
    mask_shift: attention's mask read at query ``i + mask_shift``.
    weights: attention's per-key weights (a block of keys dropped: 0, or
      counted twice: 2) in both of its sums, or None.
  """

  params: Mapping[str, float] = {}
  reduce: num.Reduce = num.plain_sum
  online: num.Online | None = None
  exp: Callable[[np.ndarray], np.ndarray] = np.exp
  rsqrt: Callable[[np.ndarray], np.ndarray] = _rsqrt
  rcp: Callable[[np.ndarray], np.ndarray] = _rcp
  act: Callable[[np.ndarray], np.ndarray] | None = None
  mask_shift: int = 0
  weights: np.ndarray | None = None


def _param(h: Hooks, name: str, default: float) -> float:
  return float(h.params.get(name, default))


def _axis(args, kwargs, index: int = 1) -> int:
  return int(kwargs.get("axis", args[index] if len(args) > index else -1))


def _sum_exp(z: np.ndarray, h: Hooks, axis: int
             ) -> tuple[np.ndarray, np.ndarray]:
  """``(m, l)``: the max along ``axis`` and the sum of ``exp(z - m)``
  (by the hooks' reduction, or the online softmax's running sum)."""
  if h.online is not None:
    zz = np.moveaxis(z, axis, -1)
    m, l, _ = num.online_softmax(zz, h.online, h.exp)
    return np.moveaxis(m, -1, axis), np.moveaxis(l, -1, axis)
  m = np.max(z, axis=axis, keepdims=True)
  return m, h.reduce(h.exp(z - m), axis)


def softmax(args, kwargs, h: Hooks) -> np.ndarray:
  """``exp(z - m) / sum``, ``z = x / temperature``."""
  axis = _axis(args, kwargs)
  z = np.asarray(args[0], np.float64) / _param(h, "temperature", 1.0)
  m, l = _sum_exp(z, h, axis)
  return h.exp(z - m) * h.rcp(l)


def log_softmax(args, kwargs, h: Hooks) -> np.ndarray:
  """``z - m - log(sum)``."""
  axis = _axis(args, kwargs)
  z = np.asarray(args[0], np.float64) / _param(h, "temperature", 1.0)
  m, l = _sum_exp(z, h, axis)
  return z - m - np.log(l)


def cross_entropy(args, kwargs, h: Hooks) -> np.ndarray:
  """Softmax cross-entropy over the last axis, with label smoothing
  ``alpha``: ``(1 - alpha) nll + alpha mean_c(-log p_c)``; the mean
  over examples unless ``reduction="none"``."""
  z = np.asarray(args[0], np.float64) / _param(h, "temperature", 1.0)
  y = np.asarray(args[1])
  reduction = kwargs.get("reduction", args[2] if len(args) > 2 else "mean")
  m, l = _sum_exp(z, h, -1)
  logp = z - m - np.log(l)
  if np.issubdtype(y.dtype, np.integer):
    nll = -np.take_along_axis(logp, y[..., None].astype(np.int64), -1)[..., 0]
  else:
    nll = -np.sum(y.astype(np.float64) * logp, -1)
  alpha = _param(h, "smoothing", 0.0)
  out = (1.0 - alpha) * nll - alpha * np.mean(logp, -1)
  return np.asarray(np.mean(out)) if reduction == "mean" else out


def _moments(x: np.ndarray, h: Hooks, centred: bool
             ) -> tuple[np.ndarray, np.ndarray]:
  """The row mean (0 uncentred) and the mean of squares about it, each
  by the hooks' reduction over the last axis, divided by ``n - ddof``."""
  n = x.shape[-1]
  mu = h.reduce(x, -1) / n if centred else np.zeros(x.shape[:-1] + (1,))
  c = x - mu
  return mu, h.reduce(c * c, -1) / (n - _param(h, "ddof", 0.0))


def layer_norm(args, kwargs, h: Hooks) -> np.ndarray:
  """``(x - mean) rsqrt(var + eps) scale + bias``."""
  x = np.asarray(args[0], np.float64)
  scale = args[1] if len(args) > 1 else kwargs.get("scale")
  bias = args[2] if len(args) > 2 else kwargs.get("bias")
  eps = float(kwargs.get("eps", args[3] if len(args) > 3 else 1e-6))
  mu, var = _moments(x, h, centred=True)
  y = (x - mu) * h.rsqrt(var + _param(h, "eps", eps))
  if scale is not None:
    y = y * np.asarray(scale, np.float64)
  if bias is not None:
    y = y + np.asarray(bias, np.float64)
  return y


def rms_norm(args, kwargs, h: Hooks) -> np.ndarray:
  """``x rsqrt(mean(x^2) + eps) (offset + scale)``."""
  x = np.asarray(args[0], np.float64)
  scale = args[1] if len(args) > 1 else kwargs.get("scale")
  eps = float(kwargs.get("eps", args[2] if len(args) > 2 else 1e-6))
  _, ms = _moments(x, h, centred=False)
  y = x * h.rsqrt(ms + _param(h, "eps", eps))
  offset = _param(h, "offset", 0.0)
  if scale is not None:
    return y * (offset + np.asarray(scale, np.float64))
  return y * (1.0 + offset) if offset else y


def _shifted_mask(mask: np.ndarray, shift: int) -> np.ndarray:
  """A mask [..., T, S] read at query ``i + shift``, clamped."""
  t = mask.shape[-2]
  rows = np.clip(np.arange(t) + shift, 0, t - 1)
  return np.take(mask, rows, axis=-2)


def _attention_mask(q, k, mask, is_causal: bool, shift: int):
  """The boolean mask [.., T, S] (None: none), one key off by ``shift``."""
  t, s = q.shape[1], k.shape[1]
  if is_causal:
    causal = np.tril(np.ones((t, s), bool), shift)
    mask = causal if mask is None else np.logical_and(
        _shifted_mask(np.asarray(mask, bool), shift), causal)
  elif mask is not None:
    mask = np.asarray(mask, bool)
    mask = _shifted_mask(np.broadcast_to(mask, mask.shape), shift) if (
        shift) else mask
  return mask


def attention(args, kwargs, h: Hooks) -> np.ndarray:
  """Dot-product attention in Flax's layout (``_attention64``): grouped
  kv heads repeated, scores times ``scale`` plus bias, masked scores
  filled with ``fill`` (the lowest float), softmax over keys (by the
  hooks), weighted sum of values."""
  q, k, v = (np.asarray(a, np.float64) for a in args[:3])
  mask = args[3] if len(args) > 3 else kwargs.get("mask")
  bias = kwargs.get("bias")
  scale = kwargs.get("scale")
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
  groups = q.shape[2] // k.shape[2]
  if groups > 1:
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  # Batched matmuls (BLAS) in Flax's layout: [b, h, t, d] @ [b, h, d, s].
  # (contiguous: a strided batched matmul leaves BLAS).
  z = np.matmul(np.ascontiguousarray(np.moveaxis(q, 1, 2)),
                np.ascontiguousarray(np.moveaxis(k, 1, 3))) * _param(
                    h, "scale", scale)
  if bias is not None:
    z = z + np.asarray(bias, np.float64)
  m = _attention_mask(q, k, mask, bool(kwargs.get("is_causal", False)),
                      h.mask_shift)
  if m is not None:
    z = np.where(m, z, _param(h, "fill", np.finfo(np.float64).min))
  vv = np.ascontiguousarray(np.moveaxis(v, 1, 2))  # b h s d
  if h.online is not None:
    _, l, acc = num.online_softmax(z, h.online, h.exp, vv)
    return np.moveaxis(acc * h.rcp(l), 1, 2)
  if h.weights is not None:  # a block of keys dropped or counted twice:
    # a loop that skips a block never sees its scores (its max is over
    # the kept keys: a query whose visible keys are all dropped averages
    # the kept ones, as their masked scores are equal).
    kept = np.where(h.weights > 0, z, -np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
      e = np.where(h.weights > 0, h.exp(kept - np.max(kept, -1,
                                                      keepdims=True)), 0.0)
    e = e * h.weights
    return np.moveaxis(np.matmul(e * h.rcp(np.sum(e, -1, keepdims=True)),
                                 vv), 1, 2)
  e = h.exp(z - np.max(z, -1, keepdims=True))
  if h.reduce is not num.plain_sum:  # both sums over keys in order
    acc = h.reduce(e[..., None] * vv[:, :, None, :, :], -2)[..., 0, :]
    return np.moveaxis(acc * h.rcp(h.reduce(e, -1)), 1, 2)
  w = e * h.rcp(np.sum(e, -1, keepdims=True))
  return np.moveaxis(np.matmul(w, vv), 1, 2)


def gelu(args, kwargs, h: Hooks) -> np.ndarray:
  """GELU, erf form (tanh form with ``approximate=True``)."""
  x = np.asarray(args[0], np.float64)
  if h.act is not None:
    return h.act(x)
  if kwargs.get("approximate", args[1] if len(args) > 1 else False):
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))
  return 0.5 * x * (1.0 + special.erf(x / math.sqrt(2.0)))


def silu(args, kwargs, h: Hooks) -> np.ndarray:
  """``x sigmoid(beta x)`` (times ``up``: SwiGLU)."""
  x = np.asarray(args[0], np.float64)
  up = args[1] if len(args) > 1 else kwargs.get("up")
  if h.act is not None:
    y = h.act(x)
  else:
    with np.errstate(over="ignore"):
      y = x * h.rcp(1.0 + h.exp(-_param(h, "beta", 1.0) * x))
  return y if up is None else y * np.asarray(up, np.float64)


def rope(args, kwargs, h: Hooks) -> np.ndarray:
  """Rotary embedding of the two halves (NeoX / Llama layout)."""
  x = np.asarray(args[0], np.float64)
  pos = np.asarray(args[1]).astype(np.float64) + _param(h, "offset", 0.0)
  theta = float(kwargs.get("theta", args[2] if len(args) > 2 else 1e4))
  theta = _param(h, "theta", theta)
  d = x.shape[-1]
  half = d // 2
  inv = theta ** (-np.arange(half, dtype=np.float64) * (2.0 / d))
  ang = pos[:, None] * inv[None, :]
  cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


#: Kind -> its family ``f(args, kwargs, hooks) -> float64 output``.
FAMILIES: dict[str, Callable[[Any, Mapping[str, Any], Hooks], np.ndarray]] = {
    "softmax": softmax, "log_softmax": log_softmax,
    "cross_entropy": cross_entropy, "layer_norm": layer_norm,
    "rms_norm": rms_norm, "attention": attention, "gelu": gelu,
    "silu": silu, "rope": rope,
}


def evaluate(kind: str, args, kwargs: Mapping[str, Any],
             hooks: Hooks = Hooks()) -> np.ndarray:
  """A kind's family on a call's arguments under ``hooks``.

  Raises:
    KeyError: a kind without a family.
  """
  return FAMILIES[kind](args, kwargs, hooks)
