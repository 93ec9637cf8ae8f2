"""The port probe: which constant or closed form a KUT's output matches.

A cross-framework port often computes its kernel with another constant (a
normalization epsilon, the unbiased variance, a softmax temperature, a
missing or doubled ``1/sqrt(d)``) or another closed form (GELU's tanh
form). Where the site's inputs are known (playback, op-level playback,
calibration), the probe computes, in float64 on the host, the kernel's
known variants of those kinds, estimates the constant where one can be
fitted (the epsilon of a layer norm, the temperature of a softmax), and
says which hypothesis explains the KUT's output: its RMS distance to the
KUT's output is at most a quarter of the distance to the model's own
float64 reference, which must itself be beyond the golden kernel's noise.

Given the site's float64 reference function, the probe also tries the
*input precision* hypotheses: the reference on the inputs rounded to bf16,
fp16 or tf32 (a port that casts its operands down and computes in float32).
For a nonlinear kernel the error such rounding leaves is not a fixed
multiple of u(fmt) (a softmax's grows with its logits), so the level of the
error alone cannot name it; the probe can.

A hypothesis *explains* the output when, over the elements that differ
from the reference, the median of ``|t - h| / |t - r|`` is at most
``EXPLAINS``: a median, so a sparse fault on top of the port (up to half of
the elements) does not hide the port's own cause. The probe then also
returns the Signature of the output against the hypothesis (``h`` rounded
to the output dtype as golden, ``h`` as reference): its outliers are what
the hypothesis does not explain, the Detector's primary cause.

The result is a small dict the Detector reads from its context
(``context["port"]``, peat.detector rules ``parameter`` /
``approximation`` / ``precision``) and playback stores in the site record
(without its ``signature``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.signature import analyze_split_many
from peat_jax.analyzer.signature import decompose_split_many
from peat_jax.analyzer.signature import screen_split_many
from peat_jax.analyzer.signature import with_decomposition
from peat_jax.analyzer.signature import split_reference
from peat_jax.analyzer.references import reference_gelu
from peat_jax.analyzer.references import reference_rms_norm
from peat_jax.analyzer.references import reference_rope
from peat_jax.analyzer.references import reference_silu
from peat_jax.analyzer.signature import median
from peat_jax.injectors import round_nearest

#: A hypothesis explains the output when the median ratio of the distance
#: to it over the distance to the model's own float64 reference is at most
#: this (over the elements that differ from the reference).
EXPLAINS = 0.25
#: Input formats of the precision hypotheses; tf32 only for GEMM kinds
#: (tensor-core inputs), fp16 for the others (same u, fp16's range).
_GEMM_KINDS = ("dot_general", "matmul", "conv", "conv2d",
               "conv_general_dilated", "attention")
#: ... and that distance is this many times the golden kernel's own.
BEYOND_GOLDEN = 4.0


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


def _hypotheses(kind: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                test: np.ndarray,
                reference_fn: Callable[..., Any] | None = None,
                reference_args: Sequence[Any] | None = None) -> list[tuple]:
  """(model, name, sentence, float64 fn, fitted constant or None) of a
  kind's known variants (none outside ``FORM_KINDS``)."""
  out = []
  if kind not in FORM_KINDS:
    return out
  if kind == "layer_norm":
    x, scale, bias = (_f64(a) for a in args[:3])
    eps = float(kwargs.get("eps", args[3] if len(args) > 3 else 1e-6))
    fit = _fit_eps(x, scale, bias, test)
    var = float(np.median(_row_var(x)))
    if (fit is not None and 0 < fit <= EPS_MAX_SHARE * var
        and abs(fit - eps) > 0.05 * max(eps, fit)):
      out.append(("parameter", "eps", f"consistent with eps {fit:.3g} "
                  f"instead of the model's {eps:.3g}",
                  lambda fit=fit: _layer_norm(x, scale, bias, fit), fit))
    out.append(("parameter", "unbiased_var", "the unbiased variance (divided "
                "by n - 1) where the model uses the biased one",
                lambda: _layer_norm(x, scale, bias, eps, unbiased=True), None))
  elif kind == "softmax":
    x = _f64(args[0])
    fit = _fit_temperature(x, _f64(test))
    if fit is not None and abs(fit - 1.0) > 1e-3:
      out.append(("parameter", "temperature", f"consistent with a softmax "
                  f"temperature {fit:.4g} the model does not use",
                  lambda fit=fit: _softmax(x, fit), fit))
  elif kind == "attention":
    q, k, v = (_f64(a) for a in args[:3])
    mask = args[3] if len(args) > 3 else kwargs.get("mask")
    h, hk = q.shape[2], k.shape[2]
    if hk != h and hk and h % hk == 0:  # grouped-query: kv head j // (H/Hk)
      k, v = np.repeat(k, h // hk, axis=2), np.repeat(v, h // hk, axis=2)
      if reference_fn is not None and reference_args is not None:
        ra = list(reference_args)
        out.append(("indexing", "kv_group", f"query head j attends with "
                    f"key/value head j % {hk} (tiled) where the model uses "
                    f"j // {h // hk} (grouped-query attention's grouping)",
                    lambda ra=ra: _kv_group_swap(ra, h, hk, reference_fn),
                    None))
    d = q.shape[-1]
    fit = _fit_attention_scale(q, k, v, mask, _f64(test))
    if fit is not None and abs(fit * math.sqrt(d) - 1.0) > 1e-3:
      name = ("no_scale" if abs(fit - 1.0) <= 0.01 else
              "double_scale" if abs(fit * d - 1.0) <= 0.01 else "scale")
      out.append(("parameter", name, f"attention scores scaled by "
                  f"{fit:.4g} (1/sqrt(d) = {1 / math.sqrt(d):.4g}, d = {d})"
                  + {"no_scale": ": the 1/sqrt(d) is missing",
                     "double_scale": ": 1/sqrt(d) applied twice"}.get(
                         name, ""),
                  lambda fit=fit: _attention(q, k, v, mask, fit), fit))
  elif kind == "rms_norm":
    x = _f64(args[0])
    scale = None if len(args) < 2 or args[1] is None else _f64(args[1])
    eps = float(kwargs.get("eps", args[2] if len(args) > 2 else 1e-6))
    fit = _fit_rms_eps(x, scale, _f64(test))
    ms = float(np.median(np.mean(x * x, -1)))
    if (fit is not None and 0 < fit <= EPS_MAX_SHARE * ms
        and abs(fit - eps) > 0.05 * max(eps, fit)):
      out.append(("parameter", "eps", f"consistent with eps {fit:.3g} "
                  f"instead of the model's {eps:.3g}",
                  lambda fit=fit: reference_rms_norm(x, scale, fit), fit))
    out.append(("parameter", "mean_subtracted", "the row mean subtracted "
                "first (a layer norm without bias where the model uses an "
                "RMS norm)", lambda: _rms_norm_centred(x, scale, eps), None))
    if np.dtype(np.asarray(args[0]).dtype).itemsize <= 2:
      out.append(("accumulation:bf16", "acc_bf16", "the mean of squares "
                  "summed in bf16 (each square and partial sum rounded, in "
                  "order: no float32 upcast)",
                  lambda: _rms_norm_acc(x, scale, eps, "bf16"), None))
  elif kind == "rope":
    x = _f64(args[0])
    pos = np.asarray(args[1])
    theta = float(kwargs.get("theta", args[2] if len(args) > 2 else 1e4))
    out.append(("indexing", "interleaved", "pairs (2i, 2i+1) rotated "
                "(GPT-J layout) where the model rotates the two halves "
                "(GPT-NeoX / Llama layout)",
                lambda: _rope_interleaved(x, pos, theta), None))
    fitted = _fit_rope(x, pos, theta, _f64(test))
    if fitted is not None:
      name, val, fn = fitted
      sentence = (f"consistent with positions offset by {int(val):+d}"
                  if name == "offset" else
                  f"consistent with a rotary base {val:.4g} instead of the "
                  f"model's {theta:.4g}")
      out.append(("parameter", name, sentence, fn, val))
  elif kind == "silu" and len(args) > 1 and args[1] is not None:
    x, up = _f64(args[0]), _f64(args[1])
    out.append(("indexing", "swapped_operands", "SwiGLU's gate and up "
                "operands swapped (silu(up) * gate)",
                lambda: reference_silu(up, x), None))
  elif kind == "gelu":
    x = _f64(args[0])
    approximate = bool(kwargs.get("approximate", False))
    out.append(("approximation", "gelu_form",
                f"GELU's {'erf' if approximate else 'tanh'} form where the "
                f"model uses the {'tanh' if approximate else 'erf'} one",
                lambda: _gelu(x, not approximate), None))
  return out


#: A record is probed when this share of its elements (and at least
#: PROBE_MIN of them) is beyond the golden kernel's rounding envelope.
PROBE_SHARE = 0.01
PROBE_MIN = 16
#: ... or when its RMS error vs float64 is this many times golden's even
#: inside the envelope (tens of ulps everywhere: another constant, e.g. an
#: epsilon 1e-5 for 1e-6, moves every element a little).
PROBE_DENSE_RATIO = 16.0


def needs_probe(sig, *, screened: bool = False) -> bool:
  """Whether a Signature's dense error calls for the port probe: it has a
  decomposition against a reference, the KUT's RMS error vs float64 is
  beyond ``BEYOND_GOLDEN`` times golden's, and at least ``PROBE_SHARE`` of
  the elements are beyond the golden envelope (not a sparse fault alone),
  or the RMS error is beyond ``PROBE_DENSE_RATIO`` times golden's, or the
  output is 16-bit (bf16, fp16).

  Args:
    sig: a single-record Signature (device or host fields).
    screened: ``sig`` comes from the triage screen
      (``peat.analyzer.screen``): its ``n_beyond`` is the decomposition's
      though ``decomposed`` is False.

  Returns:
    True when a probe may explain the record.
  """
  if not (screened or bool(np.asarray(sig.decomposed))) or not bool(
      np.asarray(sig.has_reference)):
    return False
  n = int(np.asarray(sig.n))
  beyond = int(np.asarray(sig.n_beyond))
  ratio = float(np.asarray(sig.noise_ratio))
  # A 16-bit output hides a port's dense error inside a few of its own
  # units (a bf16-accumulated norm: 2-5 u(bf16)); beyond the benign
  # envelope that is already the probe's question.
  narrow = int(np.asarray(getattr(sig, "dtype_code", 0))) in (1, 2)
  return ratio > BEYOND_GOLDEN and (
      narrow or beyond >= max(PROBE_MIN, PROBE_SHARE * n)
      or ratio > PROBE_DENSE_RATIO)


def _rounded(x, fmt: str):
  if not hasattr(x, "dtype") or not np.ndim(x):
    return x  # a constant of the call (an epsilon), not an operand
  a = np.asarray(x)
  if not np.issubdtype(a.dtype, np.floating) and a.dtype.name not in (
      "bfloat16", "float16"):
    return a
  y = round_nearest(jnp.asarray(a, jnp.float32),
                               _core.FORMATS[fmt])
  return np.asarray(y, np.float64)


def probe_formats(kind: str) -> tuple[str, str]:
  """The formats of the probe's input-precision hypotheses for a kernel:
  its hypothesis ``inputs_<fmt>`` is the kernel's float64 reference on its
  floating inputs rounded to ``<fmt>`` (to nearest, in float32)."""
  return ("bf16", "tf32") if kind in _GEMM_KINDS else ("bf16", "fp16")


def _precision_hypotheses(kind: str, args: Sequence[Any],
                          reference_fn: Callable[..., Any],
                          given: Mapping[str, Any] | None = None
                          ) -> list[tuple]:
  out = []
  for fmt in probe_formats(kind):
    name = f"inputs_{fmt}"
    if given is not None and name in given:
      fn = lambda name=name: given[name]
    else:
      fn = lambda fmt=fmt: reference_fn(*[_rounded(a, fmt) for a in args])
    out.append((f"precision:{fmt}", name, precision_sentence(fmt), fn,
                None))
  return out


class _RatioBase(NamedTuple):
  """What every hypothesis's median ratio shares: the elements where the
  KUT's output differs from the reference, the output there, and that
  distance."""
  keep: np.ndarray  # bool, the record's shape: finite pairs with t != r
  t: np.ndarray  # float64 t[keep]
  d_r: np.ndarray  # float64 |t - r|[keep], all > 0


def _ratio_base(t, r, fin) -> _RatioBase:
  d_r = np.abs(np.where(fin, t, 0.0) - np.where(fin, r, 0.0))
  keep = d_r > 0  # implies finite: elsewhere both are 0
  return _RatioBase(keep, t[keep], d_r[keep])


def _where_moved(base: _RatioBase, h, r, g, fin) -> _RatioBase:
  """A structural hypothesis (values in other places) leaves some places
  as they were (the heads a wrong grouping maps right, a rope's first
  position): its ratio is read where it moves the output beyond the golden
  kernel's own error, when at least PROBE_MIN such elements differ."""
  with np.errstate(invalid="ignore"):
    moved = fin & (np.abs(h - r) > np.abs(g - r))
  keep = base.keep & moved
  if int(keep.sum()) < PROBE_MIN:
    return base
  sub = moved[base.keep]
  return _RatioBase(keep, base.t[sub], base.d_r[sub])


def _median_ratio(base: _RatioBase, h) -> float:
  """Median of |t - h| / |t - r| over the elements where t != r (h
  non-finite there: an infinite ratio)."""
  if not base.t.size:
    return np.inf
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    ratio = np.abs(base.t - h[base.keep]) / base.d_r
  ratio[np.isnan(ratio)] = np.inf
  return median(ratio)


def probe_answer(model: str, name: str, sentence: str, tried: list[str],
                 ratio: float, distance: float, d_ref: float, d_gold: float,
                 fit: float | None = None) -> dict:
  """The probe's answer for its best hypothesis (``port_probe``'s dict
  without ``row_order`` and ``signature``), from its figures.

  Args:
    model, name, sentence: the hypothesis (error model, name, what it is).
    tried: the names of the hypotheses tried.
    ratio: its median ratio (``|t - h| / |t - r|`` over ``t != r``).
    distance: the KUT's RMS distance to it.
    d_ref, d_gold: the KUT's and the golden kernel's RMS distance to the
      float64 reference.
    fit: the fitted constant, if any.

  Returns:
    ``{"model", "name", "explains", "tried", "ratio", "distance",
    "reference_distance", "evidence", "estimate"?}``.
  """
  out = {"model": model, "name": name, "explains": bool(ratio <= EXPLAINS),
         "tried": list(tried),
         "ratio": float(ratio), "distance": float(distance),
         "reference_distance": float(d_ref),
         "evidence": (f"{sentence}: the KUT's median distance to that "
                      f"variant is {ratio:.3g} of its distance to the "
                      f"model's kernel in float64 ({d_ref:.3g} RMS, "
                      f"{d_ref / max(d_gold, 1e-300):.3g}x the golden "
                      "kernel's)")}
  if fit is not None:
    out["estimate"] = float(fit)
  return out


def precision_sentence(fmt: str) -> str:
  """What the input-precision hypothesis ``inputs_<fmt>`` is."""
  return f"the kernel on its inputs rounded to {fmt}"


def port_probe(kind: str, args: Sequence[Any], kwargs: Mapping[str, Any],
               test, golden, reference, *,
               reference_fn: Callable[..., Any] | None = None,
               reference_args: Sequence[Any] | None = None,
               signature: bool | str = True,
               hypotheses: Mapping[str, Any] | None = None,
               only: str | None = None) -> dict | None:
  """Which port variant of a composite kernel the KUT's output matches.

  Args:
    kind: the composite kind (``layer_norm``, ``softmax``, ``attention``,
      ``gelu``; others give None).
    args: the site's positional arguments (the reference composites'
      signatures, models/layers.py).
    kwargs: its keyword arguments.
    test: the KUT's output.
    golden: the golden kernel's output.
    reference: the float64 reference of the model's own kernel.
    reference_fn: the kernel's float64 reference function on ``args``
      (peat.analyzer.reference_fn); adds the input precision hypotheses.
    reference_args: what ``reference_fn`` takes, when not ``args`` (a
      composite site's flat input arrays).
    signature: with an explaining hypothesis, add the Signature of
      ``test`` against it (``"signature"``); ``"defer"``: add the
      hypothesis's float64 output instead (``"hypothesis"``), for
      :func:`probe_signatures` to analyze with other records' at once.
    hypotheses: input-precision hypotheses computed already (name ->
      float64 output, e.g. ``{"inputs_bf16": ...}``: the same values
      ``reference_fn`` gives on the rounded inputs; playback computes them
      on the device for all sites at once).
    only: try this hypothesis alone (its ``name``, e.g. ``inputs_bf16`` or
      ``eps``): playback carries a site's probe to its later records, each
      with its own magnitudes (and fitted constant), without the others.

  Returns:
    None when no hypothesis applies or the output is within the golden
    kernel's noise; else ``{"model", "name", "explains", "evidence",
    "estimate"?, "ratio", "distance", "reference_distance",
    "signature"?}`` for the best hypothesis (lowest median ratio).
  """
  t, g, r = _f64(test), _f64(golden), _f64(reference)
  if t.shape != r.shape:
    return None
  fin = np.isfinite(t) & np.isfinite(r)
  flat = bool(np.all(fin))  # a[fin] is then a.reshape(-1): the same sum
  some = flat or bool(np.any(fin))
  rms = lambda a: float(np.sqrt(np.mean(np.square(
      a.reshape(-1) if flat else a[fin])))) if some else 0.0
  d_ref, d_gold = rms(t - r), rms(g - r)
  if not d_ref > BEYOND_GOLDEN * d_gold:
    return None
  hyps = _hypotheses(kind, args, kwargs, t, reference_fn,
                     args if reference_args is None else reference_args)
  if reference_fn is not None:
    hyps += _precision_hypotheses(
        kind, args if reference_args is None else reference_args,
        reference_fn, hypotheses)
  if only is not None:
    hyps = [h for h in hyps if h[1] == only]
  base = _ratio_base(t, r, fin)
  best = None
  for model, name, sentence, fn, fit in hyps:
    try:
      with np.errstate(all="ignore"):
        h = _f64(fn())
    except (ValueError, FloatingPointError, ImportError, TypeError):
      continue
    if np.shape(h) != t.shape:
      continue
    ratio = _median_ratio(_where_moved(base, h, r, g, fin) if
                          model == "indexing" else base, h)
    if best is None or ratio < best[0]:
      best = (ratio, model, name, sentence, fit, h)
  if best is None:
    return None
  ratio, model, name, sentence, fit, h = best
  out = probe_answer(model, name, sentence, [hy[1] for hy in hyps], ratio,
                     rms(t - h), d_ref, d_gold, fit)
  explains = out["explains"]
  if not explains:
    order = _row_order(kind, args, np.where(fin, t, 0.0),
                       np.where(fin, r, 0.0))
    if order is not None:
      out["row_order"] = order
  if explains and signature:
    out["hypothesis"] = h
    if signature != "defer":
      probe_signatures([out], [test])
  return out


def probe_signatures(probes: Sequence[dict | None],
                     tests: Sequence[Any],
                     cleared: Callable[[Any, Any], bool] | None = None
                     ) -> None:
  """The re-based Signatures of many deferred probes, in one executable.

  For each probe made with ``signature="defer"`` whose hypothesis explains
  the output, replaces its ``"hypothesis"`` (the float64 output; or
  ``"hypothesis_split"``: that output already rounded to the test's dtype
  and split into float32 halves, device arrays) by the
  ``"signature"`` ``port_probe`` would have added (``test`` against the
  hypothesis rounded to the output's dtype, the hypothesis as reference:
  the same values, one dispatch and one transfer for all, NumPy fields).
  One probe or many, each record runs at its own shape
  (`analyze_split_many`): a deferred probe's Signature is bitwise the one
  ``port_probe(signature=True)`` adds (tests/analyzer/test_ports.py), and
  a campaign's sites compile once.

  Args:
    probes: ``port_probe`` results (None where no probe ran); modified in
      place.
    tests: the KUT output of each probe's record, in the same order.
    cleared: triage (playback): given a re-based record's screen
      (``screen_split_many``: its Signature without the decomposition, and
      its Screen), whether it is inside the hypothesis's rounding envelope
      with nothing left to explain; such a record keeps the screened
      Signature (``decomposed`` False), the others are decomposed. None:
      every one is decomposed.

  Raises:
    PeatError: as ``analyze_split_many``.
  """
  todo = [(p, t) for p, t in zip(probes, tests)
          if p is not None and ("hypothesis" in p or "hypothesis_split" in p)]
  if not todo:
    return
  golds, his, los = [], [], []
  for p, t in todo:
    if "hypothesis_split" in p:  # the output's dtype and halves, on device
      gold, hi, lo = p["hypothesis_split"]
    else:
      hi, lo = split_reference(p["hypothesis"], np.shape(t), batched=False)
      gold = p["hypothesis"].astype(
          t.dtype if hasattr(t, "dtype") else np.asarray(t).dtype)
    golds.append(gold)
    his.append(hi)
    los.append(lo)
  args = ([t for _, t in todo], golds, his, los)
  if cleared is None:
    sigs = analyze_split_many(*args, to_host=True)
  else:
    screens = screen_split_many(*args, to_host=True)
    flagged = [i for i, (sig, scr) in enumerate(screens)
               if not cleared(sig, scr)]
    decs = decompose_split_many(*[[a[i] for i in flagged] for a in args],
                                to_host=True)
    sigs = [sig for sig, _ in screens]
    for i, dec in zip(flagged, decs):
      sigs[i] = with_decomposition(sigs[i], dec)
  for (p, _), sig in zip(todo, sigs):
    p.pop("hypothesis", None)
    p.pop("hypothesis_split", None)
    p["signature"] = sig
