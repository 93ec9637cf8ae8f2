"""Masks at a softmax site: padding, fully masked rows, causal q != kv.

A softmax site sees its mask as fills: the masked scores hold a value far
below every real one (``jnp.finfo(dtype).min`` in the reference models, as
in flax's attention). A mask variant takes the site's real input, puts
back real values where it held fills (drawn from the same row's real
values) and masks it again: a padding mask (each leading index keeps the
first ``L`` of its columns, ``L`` seeded, on top of the mask it had), one
row in eight fully masked (every weight equal: the golden kernel gives
``1 / S``, a kernel that subtracts the row's maximum of the real values
or skips masked rows does not), and causal masks over the last two axes
with fewer queries than keys (aligned bottom-right: the queries are the
last of the key positions, as in decoding with a cache) and more queries
than keys (aligned top-left), as :func:`peat_jax.profiler.fuzz._attention`
aligns them. The fill is the input's own when it has one, else the
format's lowest finite value.
"""

from __future__ import annotations

import numpy as np

from peat_jax.profiler.fuzz._calls import Call, Plan, cut_index, finfo


def fill_of(x: np.ndarray) -> float:
  """The input's mask fill: its lowest value when that is below half the
  format's lowest, else the format's lowest finite value."""
  low = float(finfo(x.dtype).min)
  v = np.asarray(x, np.float64)
  fills = v[np.isfinite(v) & (v <= low / 2)]
  return float(fills.min()) if fills.size else low


def _is_fill(x: np.ndarray) -> np.ndarray:
  v = np.asarray(x, np.float64)
  return ~np.isfinite(v) | (v <= float(finfo(x.dtype).min) / 2)


def unmasked(x: np.ndarray, rng) -> np.ndarray:
  """``x`` with real values where it held fills (drawn from its real
  values; ``x`` itself when it has none)."""
  fill = _is_fill(x)
  if not fill.any() or fill.all():
    return x
  real = x[~fill]
  out = x.copy()
  out[fill] = real[rng.integers(0, real.size, int(fill.sum()))]
  return out


def _with(base: Call, x: np.ndarray) -> Call:
  return Call((x,) + tuple(base.args[1:]), base.kwargs)


def _padding(base: Call, rng) -> Call:
  x = base.args[0]
  s = x.shape[-1]
  lead = (x.shape[:1] + (1,) * (x.ndim - 2)) if x.ndim >= 2 else ()
  keep = rng.integers(1, s + 1, size=lead + (1,))
  if s > 1:
    keep.reshape(-1)[0] = max(1, s - 1)  # one index pads a single column
  out = x.copy()
  out[np.broadcast_to(np.arange(s) >= keep, x.shape)] = fill_of(x)
  return _with(base, out)


def _masked_rows(base: Call, rng) -> Call:
  x = base.args[0]
  rows = x.reshape(-1, x.shape[-1]).copy()
  idx = rng.choice(rows.shape[0], size=max(1, rows.shape[0] // 8),
                   replace=False)
  rows[idx] = fill_of(x)
  return _with(base, rows.reshape(x.shape))


def _causal(base: Call, rng, fewer_queries: bool) -> Call:
  x = base.args[0]
  t, s = x.shape[-2:]
  fill = fill_of(x)
  y = unmasked(x, rng)
  if fewer_queries:  # the last t' of s positions query
    t2 = max(1, t // 2) if t > 1 else 1
    y = np.take(y, cut_index(t, t2, rng), axis=-2)
    keep = np.arange(s)[None, :] <= np.arange(t2)[:, None] + (s - t2)
  else:
    s2 = max(1, s // 2) if s > 1 else 1
    y = np.take(y, cut_index(s, s2, rng), axis=-1)
    keep = np.arange(s2)[None, :] <= np.arange(t)[:, None]
  y = np.where(np.broadcast_to(keep, y.shape), y,
               np.asarray(fill, y.dtype)).astype(x.dtype)
  return _with(base, y)


def plans(base: Call) -> list[Plan]:
  """The ``mask`` plans of a softmax call (input 0, rows on its last
  axis)."""
  x = base.args[0]
  if not isinstance(x, np.ndarray) or x.ndim < 1 or x.shape[-1] < 2:
    return []
  out = [Plan("mask=padding", "mask", lambda rng: _padding(base, rng)),
         Plan("mask=rows", "mask", lambda rng: _masked_rows(base, rng))]
  if x.ndim >= 2 and x.shape[-2] > 1:
    out.append(Plan("mask=causal_q<kv", "mask",
                    lambda rng: _causal(base, rng, True)))
    out.append(Plan("mask=causal_q>kv", "mask",
                    lambda rng: _causal(base, rng, False)))
  return out
