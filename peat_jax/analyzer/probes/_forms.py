"""The port probe's form hypotheses: a kind's own variants beyond the
grammar.

The slip grammar (``peat_jax.analyzer.slips``) makes a kind's constants,
operand slips, reduction slips and approximations. A few port variants
are a kind's own layouts and forms, no one slip of the grammar: a
grouped-query attention's other grouping, a rope's interleaved pairs and
its tables computed in a narrow format, an RMS norm that subtracts the
row mean. Each kind's function lists them as :class:`Variant` records;
``port_probe`` tries them beside the grammar's. The row order
(:func:`_row_order`) reads whether a per-row factor follows the row
statistic a normalization divides by.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.slips import Variant, f64
from peat_jax.injectors import round_nearest


def _f64(x) -> np.ndarray:
  return f64(x)


def _row_statistic(kind: str, args: Sequence[Any]) -> np.ndarray | None:
  """The row statistic a normalizing kernel divides by: a layer norm's
  variance, a softmax's sum of exponentials (of the max-shifted row)."""
  x = _f64(args[0])
  if kind == "layer_norm":
    return x.var(-1).reshape(-1)
  if kind == "softmax":
    z = x - np.max(x, -1, keepdims=True)
    return np.sum(np.exp(z), -1).reshape(-1)
  return None


def _rank_corr(a: np.ndarray, b: np.ndarray) -> float:
  ra = np.argsort(np.argsort(a)).astype(np.float64)
  rb = np.argsort(np.argsort(b)).astype(np.float64)
  ra -= ra.mean()
  rb -= rb.mean()
  den = math.sqrt(float(np.sum(ra * ra) * np.sum(rb * rb)))
  return float(np.sum(ra * rb) / den) if den > 0 else 0.0


def _row_order(kind: str, args: Sequence[Any], t: np.ndarray,
               r: np.ndarray) -> float | None:
  """Rank correlation of each row's relative factor ``t / r - 1`` (least
  squares) with the row statistic the kernel divides by. A constant of the
  computation (an epsilon, a temperature) changes rows smoothly with that
  statistic (|rho| near 1); an approximate reciprocal or rsqrt's error
  follows the statistic's significand bits, not its size."""
  stat = _row_statistic(kind, args)
  if stat is None or t.ndim == 0:
    return None
  t2, r2 = t.reshape(-1, t.shape[-1]), r.reshape(-1, r.shape[-1])
  if t2.shape[0] != stat.shape[0] or t2.shape[0] < 8:
    return None
  den = np.sum(r2 * r2, -1)
  ok = den > 0
  delta = np.sum((t2 - r2) * r2, -1)[ok] / den[ok]
  if delta.size < 8 or np.ptp(delta) == 0:
    return None
  return _rank_corr(delta, stat[ok])


def _rms_norm_centred(x, scale, eps):
  """A layer norm without bias where the model uses an RMS norm."""
  c = x - x.mean(-1, keepdims=True)
  y = c / np.sqrt(np.mean(c * c, -1, keepdims=True) + eps)
  return y if scale is None else y * scale


def _rope_interleaved(x, positions, theta):
  """The GPT-J / Meta-original layout: pairs ``(2i, 2i+1)`` rotated."""
  d = x.shape[-1]
  inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
  ang = np.asarray(positions, np.float64)[:, None] * inv
  cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
  a, b = x[..., 0::2], x[..., 1::2]
  out = np.empty_like(x)
  out[..., 0::2] = a * cos - b * sin
  out[..., 1::2] = b * cos + a * sin
  return out


def _kv_group_swap(q_first: Sequence[Any], h: int, hk: int,
                   reference_fn: Callable[..., Any]):
  """Grouped-query attention with query head ``j`` on key/value head ``j %
  Hk`` (the tiled grouping) where the model uses ``j // (H / Hk)``: the
  reference on queries whose heads are placed so that the model's grouping
  meets the tiled one, its output heads put back."""
  g = h // hk
  place = np.array([(j % hk) * g + j // hk for j in range(h)])
  q = _f64(q_first[0])
  q2 = np.empty_like(q)
  q2[:, :, place] = q
  out = _f64(reference_fn(q2, *q_first[1:]))
  return out[:, :, place]


#: The kinds whose probe tries known variants of their own (another
#: constant, form or indexing) besides the input-precision hypotheses.
FORM_KINDS = ("layer_norm", "softmax", "attention", "rms_norm", "rope",
              "silu", "gelu")


def precision_only(kind: str) -> bool:
  """Whether the probe of a kind tries the input-precision hypotheses
  alone (``probe_formats``), and reads no row order: its whole answer is
  then the best of those, which playback tries on the device."""
  return kind not in FORM_KINDS


def _kwarg(kwargs: Mapping[str, Any], args: Sequence[Any], key: str,
           index: int, default: float) -> float:
  """A scalar argument given by keyword or position."""
  return float(kwargs.get(key, args[index] if len(args) > index else default))


def _attention_forms(args, kwargs, test, reference_fn, reference_args):
  """Grouped-query attention's other grouping (the score scale and the
  mask fill are the grammar's constants)."""
  del test
  q, k = args[0], args[1]
  h, hk = np.shape(q)[2], np.shape(k)[2]
  if not (hk != h and hk and h % hk == 0) or reference_fn is None or (
      reference_args is None):
    return []
  ra = list(reference_args)
  return [Variant(
      "indexing", "kv_group", f"query head j attends with key/value "
      f"head j % {hk} (tiled) where the model uses j // {h // hk} "
      "(grouped-query attention's grouping)",
      lambda: _kv_group_swap(ra, h, hk, reference_fn))]


def _rms_norm_forms(args, kwargs, test, reference_fn, reference_args):
  """The row mean subtracted first (the epsilon, the divisor and a narrow
  accumulator are the grammar's)."""
  del test, reference_fn, reference_args
  x = _f64(args[0])
  scale = None if len(args) < 2 or args[1] is None else _f64(args[1])
  eps = _kwarg(kwargs, args, "eps", 2, 1e-6)
  return [Variant("parameter", "mean_subtracted", "the row mean "
                  "subtracted first (a layer norm without bias where the "
                  "model uses an RMS norm)",
                  lambda: _rms_norm_centred(x, scale, eps))]


def _rope_low(x, positions, theta, fmt: str):
  """A rope whose inverse frequencies, angles, cos and sin are each
  rounded to ``fmt`` (a port computing its tables in bf16), the rotation
  in float64 (the half-rotation layout)."""
  f = _core.FORMATS[fmt]
  rnd = lambda a: np.asarray(round_nearest(jnp.asarray(a, jnp.float32), f),
                             np.float64)
  d = x.shape[-1]
  h = d // 2
  inv = rnd(theta ** (-np.arange(h, dtype=np.float64) * (2.0 / d)))
  ang = rnd(np.asarray(positions, np.float64)[:, None] * inv[None, :])
  cos, sin = rnd(np.cos(ang))[None, :, None], rnd(np.sin(ang))[None, :, None]
  x1, x2 = x[..., :h], x[..., h:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _rope_forms(args, kwargs, test, reference_fn, reference_args):
  """The interleaved layout; the tables (frequencies, angles, cos, sin) in
  bf16 or fp16 (the base and a position offset are the grammar's)."""
  del test, reference_fn, reference_args
  x = _f64(args[0])
  pos = np.asarray(args[1])
  theta = _kwarg(kwargs, args, "theta", 2, 1e4)
  out = [Variant("indexing", "interleaved", "pairs (2i, 2i+1) rotated "
                 "(GPT-J layout) where the model rotates the two halves "
                 "(GPT-NeoX / Llama layout)",
                 lambda: _rope_interleaved(x, pos, theta))]
  for fmt in ("bf16", "fp16"):
    out.append(Variant(
        f"precision:{fmt}", f"tables_{fmt}", f"the rotary tables "
        f"(frequencies, angles, cos and sin) computed in {fmt}",
        lambda fmt=fmt: _rope_low(x, pos, theta, fmt),
        extra={"where": "angles", "rounding": "nearest_even"}))
  return out


_FORMS = {"attention": _attention_forms, "rms_norm": _rms_norm_forms,
          "rope": _rope_forms}


def form_hypotheses(kind: str, args: Sequence[Any],
                    kwargs: Mapping[str, Any], test: np.ndarray,
                    reference_fn: Callable[..., Any] | None = None,
                    reference_args: Sequence[Any] | None = None
                    ) -> list[Variant]:
  """A kind's known variants (none outside ``FORM_KINDS``).

  Args:
    kind: the site kind.
    args, kwargs: the site's arguments.
    test: the KUT's output (float64), for the fitted constants.
    reference_fn: the kernel's float64 reference function, if any.
    reference_args: what ``reference_fn`` takes.

  Returns:
    The :class:`Variant` list.
  """
  forms = _FORMS.get(kind)
  return [] if forms is None else forms(args, kwargs, test, reference_fn,
                                        reference_args)
