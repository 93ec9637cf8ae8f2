"""The port probe's form hypotheses: a kernel's known variants.

A cross-framework port often computes its kernel with another constant (a
normalization epsilon, the unbiased variance, a softmax temperature, a
missing or doubled ``1/sqrt(d)``, a rotary base), another closed form
(GELU's tanh form) or another indexing (a grouped-query attention's
grouping, a rope's interleaved pairs, SwiGLU's swapped operands). Each
kind's function below lists its variants as :class:`Variant` records,
with the constant fitted to the KUT's output where one can be (the
epsilon of a layer norm, the temperature of a softmax); ``port_probe``
measures how close the KUT's output is to each.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.references import reference_gelu
from peat_jax.analyzer.references import reference_rms_norm
from peat_jax.analyzer.references import reference_rope
from peat_jax.analyzer.references import reference_silu
from peat_jax.injectors import round_nearest


class Variant(NamedTuple):
  """One hypothesis of the probe.

  Attributes:
    model: the error model it names (``parameter``, ``precision:bf16``).
    name: its name (``eps``, ``inputs_tf32_toward_zero``, ...).
    sentence: what it is, for the evidence.
    fn: ``fn() -> float64 output`` (evaluated lazily).
    estimate: the fitted constant, or None.
    extra: what the Detector's evidence takes from it (``rounding``,
      ``where``).
  """

  model: str
  name: str
  sentence: str
  fn: Callable[[], Any]
  estimate: float | None = None
  extra: Mapping[str, Any] = {}


def _f64(x) -> np.ndarray:
  return np.asarray(x, np.float64)


def _layer_norm(x, scale, bias, eps, unbiased=False):
  m = x.mean(-1, keepdims=True)
  n = x.shape[-1]
  v = np.square(x - m).sum(-1, keepdims=True) / (n - 1 if unbiased else n)
  return (x - m) / np.sqrt(v + eps) * scale + bias


#: A normalization epsilon regularizes the variance: one above this share
#: of the median row variance shrinks every output by more than 18% and is
#: no epsilon slip but a scale (an eps fitted to t = 0.5 r is 3x the
#: variance, to t = 0.125 r 63x).
EPS_MAX_SHARE = 0.5


def _row_var(x):
  """Biased variance of each row (last axis), kept as a column."""
  return np.square(x - x.mean(-1, keepdims=True)).mean(-1, keepdims=True)


def _fit_eps(x, scale, bias, t) -> float | None:
  """The epsilon that ``t`` was normalized with (median over elements)."""
  m = x.mean(-1, keepdims=True)
  v = _row_var(x)
  num = (x - m) * scale
  den = t - bias
  ok = (np.abs(x - m) > 0.5 * np.sqrt(v)) & (np.abs(den) > 1e-30)
  if not np.any(ok):
    return None
  eps = np.square(num / np.where(ok, den, 1.0)) - v
  return float(np.median(eps[np.broadcast_to(ok, eps.shape)]))


def _softmax(x, temperature=1.0):
  z = x / temperature
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _fit_temperature(x, t) -> float | None:
  """1 / slope of log t on x, per row (the median row)."""
  with np.errstate(divide="ignore", invalid="ignore"):
    lt = np.log(t)
  ok = np.isfinite(lt) & (t > 1e-30)
  xs = np.where(ok, x, 0.0)
  cnt = ok.sum(-1)
  mx = xs.sum(-1) / np.maximum(cnt, 1)
  my = np.where(ok, lt, 0.0).sum(-1) / np.maximum(cnt, 1)
  dx = np.where(ok, x - mx[..., None], 0.0)
  dy = np.where(ok, lt - my[..., None], 0.0)
  sxx = (dx * dx).sum(-1)
  good = (cnt >= 3) & (sxx > 0)
  if not np.any(good):
    return None
  slope = (dx * dy).sum(-1)[good] / sxx[good]
  a = float(np.median(slope))
  return 1.0 / a if a > 0 else None


def _attention(q, k, v, mask, scale):
  s = np.einsum("bthd,bshd->bhts", q, k) * scale
  if mask is not None:
    s = np.where(np.asarray(mask), s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  return np.einsum("bhts,bshd->bthd", w, v)


def _fit_attention_scale(q, k, v, mask, t) -> float | None:
  """The score scale ``c`` whose attention is closest to ``t`` (RMS):
  a log-spaced scan from ``1/d**1.5`` to ``d``, refined by golden-section
  search on ``log c``."""
  d = q.shape[-1]
  fin = np.isfinite(t)  # a NaN or Inf of the KUT's is no scale's doing
  if not fin.any():
    return None
  rms = lambda c: float(np.sqrt(np.mean(np.square(
      (_attention(q, k, v, mask, c) - t)[fin]))))
  grid = np.exp(np.linspace(np.log(d ** -1.5), np.log(float(d)), 25))
  with np.errstate(all="ignore"):
    errs = [rms(c) for c in grid]
    if not np.isfinite(errs).any():
      return None
    i = int(np.nanargmin(errs))
    lo, hi = np.log(grid[max(i - 1, 0)]), np.log(grid[min(i + 1, 24)])
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(40):
      a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
      if rms(math.exp(a)) < rms(math.exp(b)):
        hi = b
      else:
        lo = a
  c = math.exp((lo + hi) / 2)
  return c if math.isfinite(c) else None


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


def _fit_rms_eps(x, scale, t) -> float | None:
  """The epsilon ``t`` was RMS-normalized with (median over elements whose
  input is at least half the row's RMS)."""
  ms = np.mean(x * x, -1, keepdims=True)
  num = x if scale is None else x * scale
  ok = (np.abs(x) > 0.5 * np.sqrt(ms)) & (np.abs(t) > 1e-30)
  if not np.any(ok):
    return None
  eps = np.square(num / np.where(ok, t, 1.0)) - ms
  return float(np.median(eps[np.broadcast_to(ok, eps.shape)]))


def _rms_norm_centred(x, scale, eps):
  """A layer norm without bias where the model uses an RMS norm."""
  c = x - x.mean(-1, keepdims=True)
  y = c / np.sqrt(np.mean(c * c, -1, keepdims=True) + eps)
  return y if scale is None else y * scale


def _rms_norm_acc(x, scale, eps, fmt: str):
  """An RMS norm whose mean of squares is a running sum kept in ``fmt``
  (each square and each partial sum rounded to it, in order)."""
  f = _core.FORMATS[fmt]
  rnd = lambda a: np.asarray(round_nearest(jnp.asarray(a, jnp.float32), f),
                             np.float64)
  acc = np.zeros(x.shape[:-1], np.float64)
  sq = rnd(x * x)
  for i in range(x.shape[-1]):
    acc = rnd(acc + sq[..., i])
  y = x / np.sqrt(acc[..., None] / x.shape[-1] + eps)
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


def _fit_rope(x, positions, theta, t) -> tuple[str, float, Callable] | None:
  """The rotary base or position offset whose rope is closest to ``t``
  (the median absolute distance: a sparse fault on top, a few huge
  values, does not move it): bases 10^3..10^7 on a log scan refined by
  golden section, and position offsets -4..4; None when neither beats the
  model's own."""
  fin = np.isfinite(t)
  rms = lambda h: float(np.median(np.abs(h - t)[fin])) if fin.any() else 0.0
  pos = np.asarray(positions)
  own = rms(_f64(reference_rope(x, pos, theta)))
  best = None
  for k in (-4, -3, -2, -1, 1, 2, 3, 4):
    e = rms(_f64(reference_rope(x, pos + k, theta)))
    if e < own * 0.5 and (best is None or e < best[0]):
      best = (e, "offset", float(k))
  f = lambda lt: rms(_f64(reference_rope(x, pos, math.exp(lt))))
  grid = np.linspace(math.log(1e3), math.log(1e7), 25)
  errs = [f(v) for v in grid]
  i = int(np.argmin(errs))
  lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, 24)]
  phi = (math.sqrt(5) - 1) / 2
  for _ in range(40):
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    if f(a) < f(b):
      hi = b
    else:
      lo = a
  fit = math.exp((lo + hi) / 2)
  e = f(math.log(fit))
  if (abs(fit / theta - 1.0) > 1e-3 and e < own * 0.5
      and (best is None or e < best[0])):
    best = (e, "theta", fit)
  if best is None:
    return None
  _, name, val = best
  if name == "offset":
    return name, val, lambda: reference_rope(x, pos + int(val), theta)
  return name, val, lambda: reference_rope(x, pos, val)


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


def _gelu(x, approximate):
  return _f64(reference_gelu(x, approximate=approximate))


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


def _layer_norm_forms(args, kwargs, test, reference_fn, reference_args):
  """Another epsilon (fitted), the unbiased variance."""
  del reference_fn, reference_args
  x, scale, bias = (_f64(a) for a in args[:3])
  eps = _kwarg(kwargs, args, "eps", 3, 1e-6)
  out = []
  fit = _fit_eps(x, scale, bias, test)
  var = float(np.median(_row_var(x)))
  if (fit is not None and 0 < fit <= EPS_MAX_SHARE * var
      and abs(fit - eps) > 0.05 * max(eps, fit)):
    out.append(Variant("parameter", "eps", f"consistent with eps {fit:.3g} "
                       f"instead of the model's {eps:.3g}",
                       lambda: _layer_norm(x, scale, bias, fit), fit))
  out.append(Variant("parameter", "unbiased_var", "the unbiased variance "
                     "(divided by n - 1) where the model uses the biased one",
                     lambda: _layer_norm(x, scale, bias, eps, unbiased=True)))
  return out


def _softmax_forms(args, kwargs, test, reference_fn, reference_args):
  """A temperature (fitted)."""
  del kwargs, reference_fn, reference_args
  x = _f64(args[0])
  fit = _fit_temperature(x, _f64(test))
  if fit is None or abs(fit - 1.0) <= 1e-3:
    return []
  return [Variant("parameter", "temperature", f"consistent with a softmax "
                  f"temperature {fit:.4g} the model does not use",
                  lambda: _softmax(x, fit), fit)]


def _attention_forms(args, kwargs, test, reference_fn, reference_args):
  """Grouped-query attention's other grouping; another score scale
  (fitted): none, doubled, or another."""
  q, k, v = (_f64(a) for a in args[:3])
  mask = args[3] if len(args) > 3 else kwargs.get("mask")
  h, hk = q.shape[2], k.shape[2]
  out = []
  if hk != h and hk and h % hk == 0:  # grouped-query: kv head j // (H/Hk)
    k, v = np.repeat(k, h // hk, axis=2), np.repeat(v, h // hk, axis=2)
    if reference_fn is not None and reference_args is not None:
      ra = list(reference_args)
      out.append(Variant(
          "indexing", "kv_group", f"query head j attends with key/value "
          f"head j % {hk} (tiled) where the model uses j // {h // hk} "
          "(grouped-query attention's grouping)",
          lambda: _kv_group_swap(ra, h, hk, reference_fn)))
  d = q.shape[-1]
  fit = _fit_attention_scale(q, k, v, mask, _f64(test))
  if fit is not None and abs(fit * math.sqrt(d) - 1.0) > 1e-3:
    name = ("no_scale" if abs(fit - 1.0) <= 0.01 else
            "double_scale" if abs(fit * d - 1.0) <= 0.01 else "scale")
    why = {"no_scale": ": the 1/sqrt(d) is missing",
           "double_scale": ": 1/sqrt(d) applied twice"}.get(name, "")
    out.append(Variant(
        "parameter", name, f"attention scores scaled by {fit:.4g} "
        f"(1/sqrt(d) = {1 / math.sqrt(d):.4g}, d = {d}){why}",
        lambda: _attention(q, k, v, mask, fit), fit))
  return out


def _rms_norm_forms(args, kwargs, test, reference_fn, reference_args):
  """Another epsilon (fitted), the row mean subtracted first, the mean of
  squares summed in bf16 (16-bit inputs)."""
  del reference_fn, reference_args
  x = _f64(args[0])
  scale = None if len(args) < 2 or args[1] is None else _f64(args[1])
  eps = _kwarg(kwargs, args, "eps", 2, 1e-6)
  out = []
  fit = _fit_rms_eps(x, scale, _f64(test))
  ms = float(np.median(np.mean(x * x, -1)))
  if (fit is not None and 0 < fit <= EPS_MAX_SHARE * ms
      and abs(fit - eps) > 0.05 * max(eps, fit)):
    out.append(Variant("parameter", "eps", f"consistent with eps {fit:.3g} "
                       f"instead of the model's {eps:.3g}",
                       lambda: reference_rms_norm(x, scale, fit), fit))
  out.append(Variant("parameter", "mean_subtracted", "the row mean "
                     "subtracted first (a layer norm without bias where the "
                     "model uses an RMS norm)",
                     lambda: _rms_norm_centred(x, scale, eps)))
  if np.dtype(np.asarray(args[0]).dtype).itemsize <= 2:
    out.append(Variant("accumulation:bf16", "acc_bf16", "the mean of "
                       "squares summed in bf16 (each square and partial sum "
                       "rounded, in order: no float32 upcast)",
                       lambda: _rms_norm_acc(x, scale, eps, "bf16"),
                       extra={"where": "accumulator",
                              "rounding": "nearest_even"}))
  return out


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
  """The interleaved layout; another rotary base or a position offset
  (fitted); the tables (frequencies, angles, cos, sin) in bf16 or fp16."""
  del reference_fn, reference_args
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
  fitted = _fit_rope(x, pos, theta, _f64(test))
  if fitted is not None:
    name, val, fn = fitted
    sentence = (f"consistent with positions offset by {int(val):+d}"
                if name == "offset" else
                f"consistent with a rotary base {val:.4g} instead of the "
                f"model's {theta:.4g}")
    out.append(Variant("parameter", name, sentence, fn, val))
  return out


def _silu_forms(args, kwargs, test, reference_fn, reference_args):
  """SwiGLU's gate and up operands swapped."""
  del kwargs, test, reference_fn, reference_args
  if len(args) < 2 or args[1] is None:
    return []
  x, up = _f64(args[0]), _f64(args[1])
  return [Variant("indexing", "swapped_operands", "SwiGLU's gate and up "
                  "operands swapped (silu(up) * gate)",
                  lambda: reference_silu(up, x))]


def _gelu_forms(args, kwargs, test, reference_fn, reference_args):
  """GELU's other closed form (tanh for erf, or erf for tanh)."""
  del test, reference_fn, reference_args
  x = _f64(args[0])
  approximate = bool(kwargs.get("approximate", False))
  return [Variant("approximation", "gelu_form",
                  f"GELU's {'erf' if approximate else 'tanh'} form where the "
                  f"model uses the {'tanh' if approximate else 'erf'} one",
                  lambda: _gelu(x, not approximate))]


_FORMS = {"layer_norm": _layer_norm_forms, "softmax": _softmax_forms,
          "attention": _attention_forms, "rms_norm": _rms_norm_forms,
          "rope": _rope_forms, "silu": _silu_forms, "gelu": _gelu_forms}


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
