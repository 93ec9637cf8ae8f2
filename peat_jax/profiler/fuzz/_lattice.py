"""The lengths an axis takes, and the axes a site's kernel has.

Kernels tile and vectorize on powers of two: a tail of one element, a
tile exactly full, one past it, and half a tile past it are where their
bugs live. :func:`lattice` gives an axis 1, 2, 3 and, for
``8 <= 2^j <= 2^16``, ``2^j - 1``, ``2^j``, ``2^j + 1`` and
``2^j + 2^(j-1)`` (192, 320, ... are ``len % 128 == 64``), plus seeded
lengths drawn log-uniformly. After 1 come one past 128 and one past each
edge where a kernel's path changes (129, 4,097, 65,537, 192, 1,025,
32,769, 16,385), then the tile classes of 128 and 8, then the rest: a
small budget sees every large band and every class of tail before the
rarer lengths.

An :class:`Axis` is one axis of a call, coupled across the operands that
share it (a GEMM's contraction axis is in both), with the function that
sets it to a length; other axes are cut to keep the variant within
:data:`peat_jax.profiler.fuzz._calls.MAX_ELEMENTS` (the length axis
last). A row axis (``batch``, ``rows``) keeps the kernel's width: the
other row axes go to one first, and the cap bends up to
:data:`BENT_ELEMENTS` before the width is cut.

Joint variants (:func:`joint_plans`, family ``joint``) set every axis at
once: one axis on its lattice with every other at one, or one other at an
odd length (:data:`ODD`: the element count then takes the varied length's
residues times an odd number, so a kernel that works on the flattened
input in vectors meets a tail of every residue modulo 8 and 16), and
seeded draws of every axis from its lattice under the cap. The ``tail``
family sweeps the kernel's length axis over 128..255 with every other at
one: the element count takes every residue modulo 128, those modulo 8,
16 and 32 first.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import numpy as np

from peat_jax.profiler.fuzz._calls import (
    Call, MAX_ELEMENTS, Plan, rng_of, set_axis)

#: The exponents j of 2^j, in the order an axis takes them.
J_ORDER = (7, 3, 12, 5, 14, 4, 10, 6, 16, 8, 9, 11, 13, 15)
#: The lengths an axis takes first, after 1: one past a tile of 128, one
#: past each edge where a kernel's path changes (a block of 4,096, a
#: 16-bit grid or index at 65,536, 1,024 threads, 32,768, 2^14), and half
#: a tile past 128 (``% 128 == 64``) among them. A budget of a few
#: variants of an axis reaches every large band; sites of the same kernel
#: start at different ones of them (:func:`interleave`'s ``turn``).
FIRST = (129, 4097, 65537, 192, 1025, 32769, 16385)
#: The tile widths whose four lengths an axis takes next (128, 8).
FIRST_TILES = (7, 3)
#: Lengths drawn log-uniformly per axis (seeded), after the tile widths
#: of the first four exponents.
RANDOM_DRAWS = 2
#: The longest length any axis takes (2^16 + 2^15, the last lattice
#: length; one row of 2^20 is the ``length`` family's own extra).
LONGEST = (1 << 16) + (1 << 15)
#: The families, in the order a site's plans interleave them.
FAMILIES = ("batch", "rows", "length", "joint", "tail", "features",
            "heads", "head_dim", "spatial", "mask", "attention",
            "magnitude", "denormal")
#: The most elements an input of a row variant may hold when the cap
#: would otherwise cut the kernel's width (8x the cap: 65,537 rows of a
#: width of 384).
BENT_ELEMENTS = 8 * MAX_ELEMENTS
#: The lengths one other axis takes in a joint variant, every other at
#: one: the element count takes the varied length's residues times each
#: odd factor (every residue modulo 8 and 16 from the lattice's lengths).
ODD = (1, 3, 5, 7)
#: The lengths of the sweep of the kernel's length axis, every other axis
#: at one: the element count takes every residue modulo 128 (every one
#: modulo 8, 16, 32 in the first 8, 16, 32).
SWEEP = tuple(range(128, 256))
#: Seeded joint draws of every axis, per site.
JOINT_DRAWS = 8
#: Draws tried for one joint draw under the cap before it is given up.
DRAW_TRIES = 32


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
  first, second = FIRST_TILES
  sizes = [1] + list(FIRST) + _tiles(first) + [2] + _tiles(second) + [3]
  sizes += drawn
  for j in J_ORDER:
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
    where: the ``(input, axis)`` pairs it sets (empty: unknown, and the
      axis takes no part in joint draws).
  """

  name: str
  family: str
  size: int
  set: Callable[[Call, int, np.random.Generator], Call]
  longest: int = LONGEST
  valid: Callable[[int], bool] | None = None
  choices: tuple[int, ...] | None = None
  where: tuple[tuple[int, int], ...] = ()

  def sizes(self, rng: np.random.Generator | None = None) -> list[int]:
    """Its lattice lengths (or choices) the contract admits."""
    every = (lattice(self.size, self.longest, rng) if self.choices is None
             else [n for n in self.choices if n != self.size])
    return [n for n in every if self.valid is None or self.valid(n)]


Where = Sequence[tuple[int, int]]


def _cut_to(call: Call, where: Where, n: int, group: Where, cap: int,
           rng) -> Call:
  """Cuts ``group`` of the inputs holding ``where`` so that each fits
  ``cap`` once ``where`` is n."""
  for i, a in where:
    x = call.args[i]
    after = x.size // max(x.shape[a], 1) * n
    mine = [(j, b) for j, b in group if j == i]
    if after <= cap or not mine or x.shape[mine[0][1]] <= 1:
      continue
    size = x.shape[mine[0][1]]
    call = set_axis(call, group, max(1, size // -(-after // cap)), rng)
  return call


def fit(call: Call, where: Where, n: int, others: Sequence[Where],
        rng, bend: bool = False) -> Call:
  """Cuts the axes ``others`` (first first) of the inputs holding
  ``where`` so that each fits :data:`MAX_ELEMENTS` once ``where`` is n.

  With ``bend`` the last of ``others`` (the kernel's width) is cut only
  where the input would pass :data:`BENT_ELEMENTS` with every other at
  one: the cap bends for the length rather than the width."""
  keep = list(others[-1:]) if bend else []
  for group in others[:len(others) - len(keep)]:
    call = _cut_to(call, where, n, group, MAX_ELEMENTS, rng)
  for group in keep:
    call = _cut_to(call, where, n, group, BENT_ELEMENTS, rng)
  return call


def coupled(name: str, family: str, call: Call, where: Where,
            others: Sequence[Where], longest: int = LONGEST,
            valid: Callable[[int], bool] | None = None,
            bend: bool = False) -> Axis:
  """An axis ``where`` of ``call``, ``others`` cut to fit (``bend``: as
  :func:`fit`)."""
  i, a = where[0]

  def set_(c: Call, n: int, rng) -> Call:
    return set_axis(fit(c, where, n, others, rng, bend), where, n, rng)
  return Axis(name, family, call.args[i].shape[a], set_, longest, valid,
              where=tuple(where))


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


def rest_length(ax: Axis, s: int) -> int | None:
  """The length ``ax`` takes as one of the others of a joint variant:
  ``s``, or the nearest above it its contract admits (None: none within
  8)."""
  if ax.choices is not None:
    ok = sorted(c for c in set(ax.choices) | {ax.size} if c >= s)
    return ok[0] if ok else None
  return next((m for m in range(s, s + 8) if m <= ax.longest and (
      ax.valid is None or ax.valid(m))), None)


def _length(call: Call, ax: Axis) -> int:
  i, a = ax.where[0]
  return int(call.args[i].shape[a])


def set_all(base: Call, lengths: Sequence[tuple[Axis, int]], rng) -> Call:
  """``base`` with every axis of ``lengths`` at its length: cuts first,
  then growths, then again any a growth cut to fit (none is once the
  lengths fit the cap together)."""
  call = base
  order = sorted(lengths, key=lambda p: p[1] / max(p[0].size, 1))
  for _ in range(2):
    for ax, n in order:
      if _length(call, ax) != n:
        call = ax.set(call, n, rng)
  return call


def fits(base: Call, lengths: Sequence[tuple[Axis, int]]) -> bool:
  """Whether every input holds at most :data:`MAX_ELEMENTS` elements with
  the axes of ``lengths`` at their lengths."""
  shapes = [list(np.shape(x)) for x in base.args]
  for ax, n in lengths:
    for i, a in ax.where:
      shapes[i][a] = n
  return all(math.prod(sh) <= MAX_ELEMENTS for sh, x in zip(
      shapes, base.args) if isinstance(x, np.ndarray))


def _joint_plan(name: str, base: Call, lengths, family: str = "joint"
                ) -> Plan:
  return Plan(name, family, lambda rng: set_all(base, lengths, rng))


def _odd_plans(base: Call, ax: Axis, known: Sequence[Axis],
               lengths: Sequence[int], odds: Sequence[int] = ODD,
               family: str = "joint") -> list[Plan]:
  """``<axis>=<n>,rest=1`` and ``<axis>=<n>,<other>=<m>,rest=1`` plans:
  ``ax`` at each of ``lengths``, the first other that admits it at each
  odd factor ``m`` of ``odds``, every other at one."""
  others = [o for o in known if o is not ax]
  ones = [(o, rest_length(o, 1)) for o in others]
  if any(n is None for _, n in ones):
    return []
  plans = []
  for n in lengths:
    for m in odds:
      odd = next((o for o in others if rest_length(o, m) == m), None)
      if m > 1 and odd is None:
        continue
      rest = [(o, m if o is odd and m > 1 else k) for o, k in ones]
      name = f"{ax.name}={n}" + (f",{odd.name}={m}" if m > 1 else "")
      if fits(base, [(ax, n)] + rest):
        plans.append(_joint_plan(name + ",rest=1", base,
                                 [(ax, n)] + rest, family))
  return plans


def joint_plans(base: Call, axes: Sequence[Axis], seed: int) -> list[Plan]:
  """The ``joint`` and ``tail`` plans of a call's axes (module docstring).

  ``joint``: ``<axis>=<n>[,<other>=<m>],rest=1``, each axis at each
  length of its lattice (then its own), one other axis at each odd factor
  of :data:`ODD` and every other at one; and ``draw=<k>(<axis>=<n>,...)``,
  :data:`JOINT_DRAWS` seeded draws of every axis from its lattice (its own
  length included) under the cap. ``tail``: ``<axis>=<n>,rest=1``, the
  kernel's length axis (``len``, else the last) at each length of the
  :data:`SWEEP` not on its lattice, every other at one: the element
  count's residues in order. Axes of unknown ``where`` take no part; a
  call with fewer than two such axes has none.

  Args:
    base: the captured call.
    axes: its axes.
    seed: the seed of the draws (with the call's shapes).
  """
  known = [ax for ax in axes if ax.where]
  if len(known) < 2:
    return []
  sweep = next((ax for ax in known if ax.name == "len"), known[-1])
  plans = []
  for ax in known:
    plans += _odd_plans(base, ax, known, ax.sizes() + [ax.size])
  seen = {sweep.size, *sweep.sizes()}
  plans += _odd_plans(base, sweep, known, [
      n for n in SWEEP if n not in seen and n <= sweep.longest and (
          sweep.valid is None or sweep.valid(n))], odds=(1,),
                      family="tail")
  rng = rng_of(seed, f"joint:{[np.shape(x) for x in base.args]}", "draws")
  for k in range(JOINT_DRAWS):
    for _ in range(DRAW_TRIES):
      lengths = [(ax, int(rng.choice([ax.size] + ax.sizes())))
                 for ax in known]
      if fits(base, lengths):
        body = ",".join(f"{ax.name}={n}" for ax, n in lengths)
        plans.append(_joint_plan(f"draw={k}({body})", base, lengths))
        break
  return plans


def stem(name: str) -> str:
  """The axis (or kind) a variant name varies: ``len`` of ``len=64`` and
  of ``len=64,rest=1``, ``draw`` of a joint draw."""
  return name.split("=", 1)[0]


def _round_robin(lists: Sequence[list]) -> list:
  out, lists = [], [list(x) for x in lists]
  while any(lists):
    for x in lists:
      if x:
        out.append(x.pop(0))
  return out


def _turned(xs: list, turn: int) -> list:
  k = turn % len(xs) if xs else 0
  return xs[k:] + xs[:k]


def interleave(plans: Sequence[Plan], start: int = 0,
               turn: int = 0) -> list[Plan]:
  """Plans ordered so that a small budget covers every family first, and
  within a family every axis: round robin over families (from the
  ``start``-th of those the plans have), and within each over its axes
  (each axis in lattice order, from its ``turn``-th length: sites of one
  kernel turned apart take different lengths first)."""
  per_family = []
  for f in FAMILIES:
    axes: dict[str, list] = {}
    for p in plans:
      if p.family == f:
        axes.setdefault(stem(p.name), []).append(p)
    if axes:
      per_family.append(_round_robin([_turned(x, turn)
                                      for x in axes.values()]))
  k = start % len(per_family) if per_family else 0
  return _round_robin(per_family[k:] + per_family[:k])
