"""Variants of an attention site's real q, k, v and mask.

The call is the KUT convention of the ``attention`` kind,
``(q, k, v[, mask], *, [bias=], [scale=], [is_causal=])`` with q
``[B, T, H, D]``, k and v ``[B, S, Hk, D]`` and a boolean mask
broadcastable to ``[B, H, T, S]`` (True keeps). A captured mask is read
as one of ``full`` (all True), ``causal`` (``s <= t``, or aligned
bottom-right ``s <= t + S - T``) or ``other``; a variant of other lengths
gets a mask of the same structure: causal masks of q_len < kv_len are
aligned bottom-right (the queries are the last T of S positions, as in
decoding with a cache), of q_len > kv_len top-left; an ``other`` mask is
cut or grown with q and k. Variants: ``batch``, q_len != kv_len both ways,
``len=64`` or ``len=192`` (len % 128 == 64), lengths 127/128/129 (batch
1), fully masked query rows (about one in eight, at least one), two packed
sequences per row with a block-diagonal mask, fewer KV heads (H/2 and 1),
head dims 64/128/256, and the ``magnitude``/``denormal`` ones of q.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from peat_jax.profiler.fuzz import _variants as V

_LENGTHS = (127, 128, 129)


def mask_kind(mask: np.ndarray | None) -> str:
  """``none``, ``full``, ``causal`` or ``other``."""
  if mask is None:
    return "none"
  m = np.asarray(mask, bool)
  if m.all():
    return "full"
  t, s = m.shape[-2:]
  flat = m.reshape(-1, t, s)
  if not (flat == flat[:1]).all():
    return "other"
  for off in (0, s - t):
    if np.array_equal(flat[0], causal(t, s, off)):
      return "causal"
  return "other"


def causal(t: int, s: int, offset: int = 0) -> np.ndarray:
  """``[T, S]`` keep-mask ``s <= t + offset``."""
  return np.arange(s)[None, :] <= np.arange(t)[:, None] + offset


def _aligned(t: int, s: int) -> np.ndarray:
  return causal(t, s, s - t if t <= s else 0)


def _new_mask(mask: np.ndarray, kind: str, b: int, t: int, s: int
              ) -> np.ndarray:
  """A mask of ``mask``'s structure and leading shape for lengths t, s."""
  lead = list(mask.shape[:-2])
  if lead and lead[0] != 1:
    lead[0] = b
  core = np.ones((t, s), bool) if kind == "full" else _aligned(t, s)
  return np.broadcast_to(core, tuple(lead) + (t, s)).copy()


class _Parts:
  """The call split into q, k, v, mask and the rest."""

  def __init__(self, base: V.Call):
    self.base = base
    self.q, self.k, self.v = base.args[:3]
    self.mask = base.args[3] if len(base.args) > 3 else None
    self.kind = mask_kind(self.mask)
    if self.kind == "none" and base.kwargs.get("is_causal"):
      self.kind = "implicit"

  def call(self, q, k, v, mask) -> V.Call:
    args = (q, k, v) + (() if mask is None else (mask,))
    return V.Call(args + tuple(self.base.args[4:]), self.base.kwargs)

  def remask(self, b, t, s, rng, t_idx=None, s_idx=None):
    """The mask for lengths t, s (None when the call has none)."""
    if self.mask is None:
      return None
    if self.kind in ("full", "causal"):
      return _new_mask(self.mask, self.kind, b, t, s)
    m = self.mask
    if m.shape[0] not in (1, b):
      m = V.resize([m], [0], b, rng)[0]
    if t != m.shape[-2]:
      m = (np.take(m, t_idx, axis=-2) if t_idx is not None
           else V.resize([m], [m.ndim - 2], t, rng)[0])
    if s != m.shape[-1]:
      m = (np.take(m, s_idx, axis=-1) if s_idx is not None
           else V.resize([m], [m.ndim - 1], s, rng)[0])
    return m


def _lengths(p: _Parts, t: int, s: int, rng, b: int | None = None
             ) -> V.Call:
  q, k, v = p.q, p.k, p.v
  if b is not None and b != q.shape[0]:
    q, k, v = V.resize([q, k, v], [0, 0, 0], b, rng)
  b = q.shape[0]
  t_idx = s_idx = None
  if t != q.shape[1]:
    if t < q.shape[1]:
      t_idx = V.cut_index(q.shape[1], t, rng)
      q = np.take(q, t_idx, axis=1)
    else:
      q = V.resize([q], [1], t, rng)[0]
  if s != k.shape[1]:
    if s < k.shape[1]:
      s_idx = V.cut_index(k.shape[1], s, rng)
      k, v = np.take(k, s_idx, axis=1), np.take(v, s_idx, axis=1)
    else:
      k, v = V.resize([k, v], [1, 1], s, rng)
  return p.call(q, k, v, p.remask(b, t, s, rng, t_idx, s_idx))


def _masked_rows(p: _Parts, rng) -> V.Call:
  b, t, h = p.q.shape[:3]
  s = p.k.shape[1]
  if p.mask is not None:
    m = np.broadcast_to(np.asarray(p.mask, bool),
                        np.broadcast_shapes(p.mask.shape, (1, 1, t, s))).copy()
  else:
    core = causal(t, s) if p.kind == "implicit" else np.ones((t, s), bool)
    m = np.broadcast_to(core, (1, 1, t, s)).copy()
  rows = rng.choice(t, size=max(1, t // 8), replace=False)
  m[..., rows, :] = False
  return p.call(p.q, p.k, p.v, m)


def _packed(p: _Parts, rng) -> V.Call:
  del rng
  t, s = p.q.shape[1], p.k.shape[1]
  seg_q = (np.arange(t) >= t // 2).astype(int)
  seg_k = (np.arange(s) >= s // 2).astype(int)
  core = seg_q[:, None] == seg_k[None, :]
  if p.kind in ("causal", "implicit"):
    core &= causal(t, s)
  lead = (p.mask.shape[:-2] if p.mask is not None and p.mask.ndim >= 2
          else (1, 1))
  return p.call(p.q, p.k, p.v,
                np.broadcast_to(core, tuple(lead) + (t, s)).copy())


def _heads(p: _Parts, hk: int, rng) -> V.Call:
  idx = V.cut_index(p.k.shape[2], hk, rng)
  return p.call(p.q, np.take(p.k, idx, axis=2), np.take(p.v, idx, axis=2),
                p.mask)


def _head_dim(p: _Parts, d: int, rng) -> V.Call:
  q, k = V.resize([p.q, p.k], [3, 3], d, rng)
  v = V.resize([p.v], [3], d, rng)[0]
  return p.call(q, k, v, p.mask)


def plans(base: V.Call, golden) -> list[V.Plan]:
  """The plans of an attention call (module docstring)."""
  p = _Parts(base)
  b, t, h, _ = p.q.shape
  s, hk = p.k.shape[1], p.k.shape[2]
  out: list[V.Plan] = []
  for n in (1, 3, 7):
    if n != b:
      out.append(V.Plan(f"batch={n}", "batch",
                        lambda rng, n=n: _lengths(p, t, s, rng, b=n)))
  if t > 1:
    out.append(V.Plan("q_len<kv_len", "attention",
                      lambda rng: _lengths(p, max(1, t // 2), s, rng)))
  if s > 1:
    out.append(V.Plan("q_len>kv_len", "attention",
                      lambda rng: _lengths(p, t, max(1, s // 2), rng)))
  n64 = 64 if t != 64 else 192
  out.append(V.Plan(f"len={n64}", "attention",
                    lambda rng: _lengths(p, n64, n64, rng)))
  out.append(V.Plan("masked_rows", "attention",
                    lambda rng: _masked_rows(p, rng)))
  if t == s and t >= 4:
    out.append(V.Plan("packed=2", "attention", lambda rng: _packed(p, rng)))
  for n in sorted({hk // 2, 1}, reverse=True):
    if 1 <= n < hk and h % n == 0:
      out.append(V.Plan(f"kv_heads={n}", "attention",
                        lambda rng, n=n: _heads(p, n, rng)))
  for d in (64, 128, 256):
    if d != p.q.shape[3]:
      out.append(V.Plan(f"head_dim={d}", "attention",
                        lambda rng, d=d: _head_dim(p, d, rng)))
  for n in _LENGTHS:
    if n not in (t, s):
      out.append(V.Plan(f"len={n}", "length",
                        lambda rng, n=n: _lengths(p, n, n, rng, b=1)))
  return out + V.magnitude_plans(base, golden, linear=False)


__all__: Sequence[str] = ["causal", "mask_kind", "plans"]
