"""Approximation slips: the library's members, and its two classes fitted.

Each member of the library (``._library``) replaces one place of a kind's
family (its ``exp``, ``1/sqrt``, ``1/x`` or activation) and predicts the
output exactly. The classes cover a member's relatives with other
constants, where the KUT's output shows the class's signature and the
call has the elements to fit it without fitting noise:

* ``exp_fitted`` (softmax, log_softmax): the relative error of ``exp`` is
  a function of the fraction ``f`` of ``(x - max) log2 e`` (any
  polynomial, table or bit trick of ``2**f``); read from
  ``log(t / r)`` less each row's constant, fitted as a piecewise-linear
  function of ``f``;
* ``rsqrt_fitted`` (layer_norm, rms_norm) and ``rcp_fitted`` (softmax):
  each row's factor ``t / r`` is a function of the significand (and,
  for rsqrt, the exponent's parity) of the statistic the kernel inverts.

A fitted error must stay within the library's bound
(``._library.LIBRARY_BOUND``) to be an approximation.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.slips import _families as fam
from peat_jax.analyzer.slips import _library as lib
from peat_jax.analyzer.slips import _numerics as num
from peat_jax.analyzer.slips._call import Call

#: Knots of a fitted error function over [0, 1] (piecewise linear).
KNOTS = 16
#: Knots of a per-row factor's function of the significand (per parity):
#: few, as rows are few.
ROW_KNOTS = 4
#: A fit reads at least this many observations per parameter.
PER_PARAMETER = 8

Fn = Callable[[np.ndarray], np.ndarray]


def _hats(u: np.ndarray, knots: int) -> np.ndarray:
  """Piecewise-linear basis (hat functions) at ``u`` in [0, 1]:
  (..., knots + 1)."""
  s = np.clip(u, 0.0, 1.0) * knots
  k = np.minimum(np.floor(s).astype(np.int64), knots - 1)
  w = s - k
  out = np.zeros(u.shape + (knots + 1,))
  np.put_along_axis(out, k[..., None], (1.0 - w)[..., None], -1)
  np.put_along_axis(out, (k + 1)[..., None], w[..., None], -1)
  return out


def _hook(name: str, args, kwargs) -> fam.Hooks:
  member = lib.MEMBERS[name]
  return fam.Hooks(**{member.hook: member.fn})


def member_slips(call: Call) -> list[tuple[_core.Slip, str, Fn]]:
  """Each library member that applies: ``(slip, sentence, fn(arrays))``."""
  if call.kind not in fam.FAMILIES:
    return []
  kwargs = call.kwargs
  approx = bool(kwargs.get("approximate", False))
  out = []
  for m in lib.members_of(call.kind, approx):
    def fn(arrays, m=m):
      args, kw = call.structured(arrays)
      return fam.evaluate(call.kind, args, kw, _hook(m.name, args, kw))
    out.append((_core.Slip("approximation", m.name), m.sentence, fn))
  return out


def _exp_error(call: Call, t: np.ndarray) -> Fn | None:
  """The fitted relative error of ``exp`` as a function of its argument
  (softmax, log_softmax on the last axis), or None."""
  args, kwargs = call.structured()
  if kwargs.get("axis", -1) not in (-1, np.ndim(call.arrays[0]) - 1):
    return None
  x = call.arrays[0]
  z = x - np.max(x, -1, keepdims=True)
  r = fam.evaluate(call.kind, args, kwargs)
  with np.errstate(all="ignore"):
    d = np.log(t / r) if call.kind == "softmax" else t - r
  ok = np.isfinite(d) & (np.exp(z) > 1e-30)
  if call.kind == "softmax":
    ok &= (t > 0) & (r > 0)
  rows = ok.sum(-1)
  if ok.sum() < PER_PARAMETER * (KNOTS + 1) or np.any(rows < 2):
    return None
  frac = np.mod(z * num.LOG2E, 1.0)
  basis = _hats(frac, KNOTS)
  w = ok[..., None]
  # Each row's constant is eliminated by taking deviations from the row
  # means (over its kept elements).
  cnt = np.maximum(rows, 1)[..., None]
  bm = (basis * w).sum(-2, keepdims=True) / cnt[..., None]
  dm = np.where(ok, d, 0.0).sum(-1, keepdims=True) / cnt
  a = ((basis - bm) * w).reshape(-1, KNOTS + 1)
  y = np.where(ok, d - dm, 0.0).reshape(-1)
  coef, *_ = np.linalg.lstsq(a, y, rcond=None)
  coef -= coef.mean()

  def rel(u):
    return np.exp(_hats(np.mod(u * num.LOG2E, 1.0), KNOTS) @ coef)
  return rel


def _row_factor(call: Call, t: np.ndarray, stat: np.ndarray,
                parity: bool) -> Fn | None:
  """The fitted per-row factor as a function of the inverted statistic's
  significand (and exponent parity), as a multiplier of the exact
  inverse; None where there are too few rows."""
  args, kwargs = call.structured()
  r = fam.evaluate(call.kind, args, kwargs)
  base = 0.0
  if call.kind == "layer_norm" and len(args) > 2 and args[2] is not None:
    base = np.asarray(args[2], np.float64)
  tt, rr = (t - base).reshape(-1, t.shape[-1]), (r - base).reshape(
      -1, r.shape[-1])
  fin = np.isfinite(tt).all(-1) & (np.sum(rr * rr, -1) > 0)
  params = (ROW_KNOTS + 1) * (2 if parity else 1)
  if fin.sum() < PER_PARAMETER * params:
    return None
  delta = np.sum(tt * rr, -1)[fin] / np.sum(rr * rr, -1)[fin] - 1.0
  f, e = num.significand(stat.reshape(-1)[fin])
  feats = _row_features(f, e, parity)
  coef, *_ = np.linalg.lstsq(feats, delta, rcond=None)

  def factor(v):
    ff, ee = num.significand(v)
    return 1.0 + _row_features(ff.reshape(-1), ee.reshape(-1),
                               parity).reshape(np.shape(v) + (-1,)) @ coef
  return factor


def _row_features(f: np.ndarray, e: np.ndarray, parity: bool) -> np.ndarray:
  h = _hats(f, ROW_KNOTS)
  if not parity:
    return h
  odd = (np.mod(e, 2) == 1)[..., None].astype(np.float64)
  return np.concatenate([h * (1.0 - odd), h * odd], -1)


def _stat(call: Call) -> np.ndarray | None:
  """The statistic the kind inverts, one per row."""
  args, kwargs = call.structured()
  x = call.arrays[0]
  if call.kind == "layer_norm":
    eps = float(kwargs.get("eps", args[3] if len(args) > 3 else 1e-6))
    return x.var(-1) + eps
  if call.kind == "rms_norm":
    eps = float(kwargs.get("eps", args[2] if len(args) > 2 else 1e-6))
    return np.mean(x * x, -1) + eps
  if call.kind == "softmax":
    return np.sum(np.exp(x - np.max(x, -1, keepdims=True)), -1)
  return None


def fitted_slips(call: Call, t: np.ndarray
                 ) -> list[tuple[_core.Slip, str, Fn, float]]:
  """The library's classes fitted to ``t``: ``(slip, sentence,
  fn(arrays), largest fitted error)``, within the library's bound."""
  out = []
  if call.kind in ("softmax", "log_softmax"):
    rel = _exp_error(call, t)
    if rel is not None:
      grid = np.linspace(-1.0, 0.0, 257)
      worst = float(np.max(np.abs(rel(grid) - 1.0)))
      hook = lambda u, rel=rel: np.exp(u) * rel(u)
      out.append((_core.Slip("approximation", "exp_fitted"),
                  f"an approximate exp: 2^n times an approximation of 2^f "
                  f"(a polynomial, table or bit trick of the fraction), "
                  f"relative error up to {worst:.2g} (fitted)",
                  _with(call, fam.Hooks(exp=hook)), worst))
  stat = _stat(call)
  if stat is not None:
    rsqrt = call.kind in ("layer_norm", "rms_norm")
    factor = _row_factor(call, t, stat, parity=rsqrt)
    if factor is not None:
      v = np.exp(np.linspace(-20.0, 20.0, 401))
      worst = float(np.max(np.abs(factor(v) - 1.0)))
      if rsqrt:
        hook = fam.Hooks(rsqrt=lambda u, fc=factor: fc(u) / np.sqrt(u))
        what = "an approximate 1/sqrt (a bit trick or table and Newton "
        name = "rsqrt_fitted"
      else:
        hook = fam.Hooks(rcp=lambda u, fc=factor: fc(u) / u)
        what = "an approximate reciprocal (a bit trick or table and Newton "
        name = "rcp_fitted"
      out.append((_core.Slip("approximation", name),
                  f"{what}steps): each row's factor a function of the "
                  f"inverted statistic's significand, relative error up to "
                  f"{worst:.2g} (fitted)", _with(call, hook), worst))
  return [x for x in out if x[3] <= lib.LIBRARY_BOUND]


def _with(call: Call, hooks: fam.Hooks) -> Fn:
  def fn(arrays):
    args, kwargs = call.structured(arrays)
    return fam.evaluate(call.kind, args, kwargs, hooks)
  return fn
