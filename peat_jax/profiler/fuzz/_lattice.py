"""The lengths an axis takes, and the axes a site's kernel has.

Kernels tile and vectorize on powers of two: a tail of one element, a
tile exactly full, one past it, and half a tile past it are where their
bugs live. :func:`lattice` gives an axis 1, 2, 3 and, for
``8 <= 2^j <= 2^16``, ``2^j - 1``, ``2^j``, ``2^j + 1`` and
``2^j + 2^(j-1)`` (192, 320, ... are ``len % 128 == 64``), plus seeded
lengths drawn log-uniformly. Tile widths come first (128, 8, 4096, 32,
2^14, ...), so that a small budget sees every class of length before the
rarer ones.

An :class:`Axis` is one axis of a call, coupled across the operands that
share it (a GEMM's contraction axis is in both), with the function that
sets it to a length; other axes are cut to keep the variant within
:data:`peat_jax.profiler.fuzz._calls.MAX_ELEMENTS` (the length axis last).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import numpy as np

from peat_jax.profiler.fuzz._calls import Call, MAX_ELEMENTS, Plan, set_axis

#: The exponents j of 2^j, in the order an axis takes them.
J_ORDER = (7, 3, 12, 5, 14, 4, 10, 6, 16, 8, 9, 11, 13, 15)
#: Lengths drawn log-uniformly per axis (seeded), after the tile widths
#: of the first four exponents.
RANDOM_DRAWS = 2
#: The longest length any axis takes (2^16 + 2^15, the last lattice
#: length; one row of 2^20 is the ``length`` family's own extra).
LONGEST = (1 << 16) + (1 << 15)
#: The families, in the order a site's plans interleave them.
FAMILIES = ("batch", "rows", "length", "features", "heads", "head_dim",
            "spatial", "mask", "attention", "magnitude", "denormal")


def _tiles(j: int) -> list[int]:
  p = 1 << j
  return [p - 1, p, p + 1, p + p // 2]


def lattice(current: int, longest: int = LONGEST,
            rng: np.random.Generator | None = None) -> list[int]:
  """The lengths an axis of length ``current`` takes, in budget order.

  Args:
    current: the axis' captured length (left out).
    longest: the longest length.
    rng: draws :data:`RANDOM_DRAWS` lengths log-uniformly in
      ``[4, longest]`` (None: none).

  Returns:
    Distinct lengths in ``[1, longest]``, without ``current``.
  """
  drawn = []
  if rng is not None and longest > 4:
    drawn = [int(round(math.exp(rng.uniform(math.log(4), math.log(longest)))))
             for _ in range(RANDOM_DRAWS)]
  sizes = [1] + _tiles(7) + [2] + _tiles(3) + [3] + _tiles(12) + drawn
  for j in J_ORDER[3:]:
    sizes += _tiles(j)
  return [s for s in dict.fromkeys(sizes) if 1 <= s <= longest
          and s != current]


def ladder_set(longest: int = LONGEST) -> list[int]:
  """Every lattice length up to ``longest``, ascending (no draws)."""
  return sorted(set(lattice(0, longest)))


class Axis(NamedTuple):
  """One axis of a call, coupled across the operands that share it.

  Attributes:
    name: the variant name's stem (``len``, ``n``, ``batch``, ``heads``).
    family: the family of its variants.
    size: its length in the call it was read from.
    set: ``set(call, n, rng) -> Call``: the call with the axis at ``n``.
    longest: the longest length it takes.
    valid: which lengths the kernel's contract admits (None: all).
    choices: the lengths it takes instead of the lattice (an attention's
      kv heads: the divisors of its heads).
  """

  name: str
  family: str
  size: int
  set: Callable[[Call, int, np.random.Generator], Call]
  longest: int = LONGEST
  valid: Callable[[int], bool] | None = None
  choices: tuple[int, ...] | None = None

  def sizes(self, rng: np.random.Generator | None = None) -> list[int]:
    """Its lattice lengths (or choices) the contract admits."""
    every = (lattice(self.size, self.longest, rng) if self.choices is None
             else [n for n in self.choices if n != self.size])
    return [n for n in every if self.valid is None or self.valid(n)]


Where = Sequence[tuple[int, int]]


def fit(call: Call, where: Where, n: int, others: Sequence[Where],
        rng) -> Call:
  """Cuts the axes ``others`` (first first) of the inputs holding
  ``where`` so that each fits :data:`MAX_ELEMENTS` once ``where`` is n."""
  for group in others:
    for i, a in where:
      x = call.args[i]
      after = x.size // max(x.shape[a], 1) * n
      mine = [(j, b) for j, b in group if j == i]
      if after <= MAX_ELEMENTS or not mine or x.shape[mine[0][1]] <= 1:
        continue
      size = x.shape[mine[0][1]]
      call = set_axis(call, group, max(1, size // -(-after // MAX_ELEMENTS)),
                      rng)
  return call


def coupled(name: str, family: str, call: Call, where: Where,
            others: Sequence[Where], longest: int = LONGEST,
            valid: Callable[[int], bool] | None = None) -> Axis:
  """An axis ``where`` of ``call``, ``others`` cut to fit."""
  i, a = where[0]

  def set_(c: Call, n: int, rng) -> Call:
    return set_axis(fit(c, where, n, others, rng), where, n, rng)
  return Axis(name, family, call.args[i].shape[a], set_, longest, valid)


def axis_plans(base: Call, axes: Sequence[Axis], draws) -> list[Plan]:
  """``<axis>=<n>`` plans of every axis on its lattice.

  Args:
    base: the captured call.
    axes: its axes.
    draws: ``draws(axis_name) -> Generator`` of the random lengths.
  """
  plans = []
  for ax in axes:
    for n in ax.sizes(draws(ax.name)):
      plans.append(Plan(f"{ax.name}={n}", ax.family,
                        lambda rng, ax=ax, n=n: ax.set(base, n, rng)))
  return plans


def stem(name: str) -> str:
  """The axis (or kind) a variant name varies: ``len`` of ``len=64``."""
  return name.split("=", 1)[0]


def _round_robin(lists: Sequence[list]) -> list:
  out, lists = [], [list(x) for x in lists]
  while any(lists):
    for x in lists:
      if x:
        out.append(x.pop(0))
  return out


def interleave(plans: Sequence[Plan], start: int = 0) -> list[Plan]:
  """Plans ordered so that a small budget covers every family first, and
  within a family every axis: round robin over families (from the
  ``start``-th of those the plans have), and within each over its axes
  (each axis in lattice order)."""
  per_family = []
  for f in FAMILIES:
    axes: dict[str, list] = {}
    for p in plans:
      if p.family == f:
        axes.setdefault(stem(p.name), []).append(p)
    if axes:
      per_family.append(_round_robin(list(axes.values())))
  k = start % len(per_family) if per_family else 0
  return _round_robin(per_family[k:] + per_family[:k])
