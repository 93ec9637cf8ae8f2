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
cut or grown with q and k.

Axes on the lattice (``_lattice``): ``batch``, ``len`` (q and kv
together), ``q_len`` and ``kv_len`` (length), ``heads`` (q's heads, k's and
v's with them unless they are fewer: then a multiple of theirs) and
``kv_heads`` (the divisors of H), ``head_dim`` (q, k and v); each length
keeps ``H * T * S`` within :data:`SCORES` (batch cut first). Beside them:
``q_len<kv_len`` and ``q_len>kv_len`` at half the length and two packed
sequences per row with a block-diagonal mask (``attention``), fully masked
query rows (about one in eight, at least one) and a key padding mask
(``mask``), and the ``magnitude``/``denormal`` ones of q.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from peat_jax.profiler.fuzz import _lattice as L
from peat_jax.profiler.fuzz import _variants as V

#: The most attention scores (``H * T * S`` of one batch row) a variant
#: may make the golden kernel hold.
SCORES = 1 << 24


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


def _padding(p: _Parts, rng) -> V.Call:
  """Each batch row attends to the first ``L_b`` keys (``L_b`` seeded, one
  row ``S - 1``), on top of the mask it had."""
  b, t = p.q.shape[:2]
  s = p.k.shape[1]
  if p.mask is not None:
    m = np.broadcast_to(np.asarray(p.mask, bool), np.broadcast_shapes(
        p.mask.shape, (b, 1, t, s))).copy()
  else:
    core = causal(t, s) if p.kind == "implicit" else np.ones((t, s), bool)
    m = np.broadcast_to(core, (b, 1, t, s)).copy()
  keep = rng.integers(1, s + 1, size=(b, 1, 1, 1))
  keep.reshape(-1)[0] = max(1, s - 1)
  m &= np.arange(s) < keep
  return p.call(p.q, p.k, p.v, m)


def _heads(p: _Parts, hk: int, rng) -> V.Call:
  q, k, v = p.q, p.k, p.v
  k, v = V.resize([k, v], [2, 2], hk, rng)
  return p.call(q, k, v, p.mask)


def _q_heads(p: _Parts, h: int, rng) -> V.Call:
  """q with ``h`` heads; k and v with it when they had as many as q."""
  b, t = p.q.shape[:2]
  s, hk = p.k.shape[1], p.k.shape[2]
  q, k, v = p.q, p.k, p.v
  if b * h * t * s > SCORES and b > 1:
    q, k, v = V.resize([q, k, v], [0, 0, 0], max(1, SCORES // (h * t * s)),
                       rng)
  if hk == q.shape[2]:
    q, k, v = V.resize([q, k, v], [2, 2, 2], h, rng)
  else:
    q = V.resize([q], [2], h, rng)[0]
  return p.call(q, k, v, _fit_mask(p.mask, q.shape[0], h, rng))


def _fit_mask(mask, b: int, h: int, rng):
  """A mask whose batch and head axes fit ``b`` and ``h``."""
  if mask is None or np.ndim(mask) < 4:
    return mask
  m = mask
  for axis, n in ((0, b), (1, h)):
    if m.shape[axis] not in (1, n):
      m = V.resize([m], [axis], n, rng)[0]
  return m


def _head_dim(p: _Parts, d: int, rng) -> V.Call:
  q, k = V.resize([p.q, p.k], [3, 3], d, rng)
  v = V.resize([p.v], [3], d, rng)[0]
  b = q.shape[0]
  per = int(np.prod(q.shape[1:]))
  if b > 1 and b * per > V.MAX_ELEMENTS:
    n = max(1, V.MAX_ELEMENTS // per)
    q, k, v = V.resize([q, k, v], [0, 0, 0], n, rng)
  return p.call(q, k, v, _fit_mask(p.mask, q.shape[0], q.shape[2], rng))


def _fit_lengths(p: _Parts, t: int, s: int) -> int | None:
  """The batch that keeps ``B * H * t * s`` within :data:`SCORES`
  (None: the call's own)."""
  b, h = p.q.shape[0], p.q.shape[2]
  if b * h * t * s <= SCORES:
    return None
  return max(1, SCORES // (h * t * s))


def _length_axis(call: V.Call, name: str) -> L.Axis:
  """``len`` (q and kv), ``q_len`` or ``kv_len``."""
  p0 = _Parts(call)
  t0, s0, h = p0.q.shape[1], p0.k.shape[1], p0.q.shape[2]

  def set_(c: V.Call, n: int, rng) -> V.Call:
    p = _Parts(c)
    t, s = p.q.shape[1], p.k.shape[1]
    t = n if name in ("len", "q_len") else t
    s = n if name in ("len", "kv_len") else s
    return _lengths(p, t, s, rng, b=_fit_lengths(p, t, s))
  size = {"len": t0, "q_len": t0, "kv_len": s0}[name]
  other = {"len": 1, "q_len": s0, "kv_len": t0}[name]
  longest = int(np.sqrt(SCORES // h)) if name == "len" else SCORES // (
      h * other)
  return L.Axis(name, "length", size, set_, min(longest, L.LONGEST))


def axes(call: V.Call) -> list[L.Axis]:
  """The lattice axes of an attention call (module docstring)."""
  p = _Parts(call)
  b, t, h, d = p.q.shape
  s, hk = p.k.shape[1], p.k.shape[2]

  def set_batch(c, n, rng):
    pc = _Parts(c)
    return _lengths(pc, pc.q.shape[1], pc.k.shape[1], rng, b=n)
  out = [L.Axis("batch", "batch", b, set_batch,
                max(1, min(L.LONGEST, SCORES // (h * t * s))))]
  if t == s:
    out.append(_length_axis(call, "len"))
  out += [_length_axis(call, "q_len"), _length_axis(call, "kv_len")]
  gqa = hk != h
  out.append(L.Axis("heads", "heads", h,
                    lambda c, n, rng: _q_heads(_Parts(c), n, rng),
                    max(1, min(L.LONGEST, SCORES // (t * s))),
                    (lambda n: n % hk == 0) if gqa else None))
  out.append(L.Axis("kv_heads", "heads", hk,
                    lambda c, n, rng: _heads(_Parts(c), n, rng), h,
                    choices=tuple(n for n in range(1, h + 1) if h % n == 0)))
  out.append(L.Axis("head_dim", "head_dim", d,
                    lambda c, n, rng: _head_dim(_Parts(c), n, rng), 1 << 12))
  return out


def plans(base: V.Call, golden, seed: int = 0) -> list[V.Plan]:
  """The plans of an attention call (module docstring)."""
  p = _Parts(base)
  t, s = p.q.shape[1], p.k.shape[1]
  ax = axes(base)
  out = L.axis_plans(base, ax, lambda name: V.rng_of(
      seed, f"{name}:{next(a.size for a in ax if a.name == name)}",
      "lattice"))
  if t > 1:
    out.append(V.Plan("q_len<kv_len", "attention",
                      lambda rng: _lengths(p, max(1, t // 2), s, rng)))
  if s > 1:
    out.append(V.Plan("q_len>kv_len", "attention",
                      lambda rng: _lengths(p, t, max(1, s // 2), rng)))
  if t == s and t >= 4:
    out.append(V.Plan("packed=2", "attention", lambda rng: _packed(p, rng)))
  out.append(V.Plan("masked_rows", "mask", lambda rng: _masked_rows(p, rng)))
  if s > 1:
    out.append(V.Plan("mask=padding", "mask", lambda rng: _padding(p, rng)))
  return out + V.magnitude_plans(base, golden, linear=False)


__all__: Sequence[str] = ["axes", "causal", "mask_kind", "plans"]
