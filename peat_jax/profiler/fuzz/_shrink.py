"""The smallest input that still fails the same way.

A failing variant is often large (``[16, 4, 192, 192]`` for a softmax
that drops the tail of rows 64 past a multiple of 128); its regression
test is clearer and faster at the smallest shape that still fails.
:func:`shrink` searches the axes of the failing call one after the
other (each try a cut of the failing call: real slices, in order):
length one, then the lengths below with the same remainder modulo each
tile width (:func:`residues`: a tail bug at ``L % 128 == 64`` fails at
192 whatever L it was found at), then a bisection over the lattice
lengths below the smallest failing one, then a bisection over single
lengths between the largest that passed and the smallest that failed
(a threshold bug at L > 100 shrinks to 101). A try counts when it fails
*the same way* (:func:`same_failure`): the same verdict (or worse) and
the same kind of failure (:func:`failure_kind`: wrong values, rounding
beyond the envelope, non-finite values), or, for a KUT that raised, the
same error.
Axes are searched largest first, once each, within ``max_tries``.

The shrunk variant is named ``min:<original>:<axis>=<n>,...`` (the cuts
in the order they were made); :func:`rebuild` replays it from the
original (each cut with its own generator), so ``peat.export_repro``
rebuilds it from the captures like any variant.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple, Sequence

from peat_jax import detector as _detector
from peat_jax.core import PeatError
from peat_jax.profiler.fuzz import _attention
from peat_jax.profiler.fuzz import _lattice as L
from peat_jax.profiler.fuzz import _variants as V

PREFIX = "min:"
#: Variant runs one shrink may make (per axis: one, the remainders, a
#: bisection over ~60 lattice lengths (6), one over single lengths).
MAX_TRIES = 64


def axes_of(kernel: str, composite: bool, call: V.Call) -> list[L.Axis]:
  """The lattice axes of a site's call (its kernel's axes)."""
  if composite and kernel == "attention":
    return _attention.axes(call)
  if composite:
    return V.composite_axes(kernel, call).axes()
  if kernel == "dot_general" or kernel == "conv_general_dilated" or (
      call.args and getattr(call.args[0], "ndim", 0)):
    return V.primitive_axes(kernel, call).axes()
  return []


def name_of(original: str, steps: Sequence[tuple[str, int]]) -> str:
  """The shrunk variant's name."""
  return f"{PREFIX}{original}:" + ",".join(f"{a}={n}" for a, n in steps)


def parse(name: str) -> tuple[str, list[tuple[str, int]]]:
  """``(original, steps)`` of a shrunk variant's name.

  Raises:
    PeatError: not a shrunk variant's name.
  """
  body = name[len(PREFIX):] if name.startswith(PREFIX) else None
  if body is None or ":" not in body:
    raise PeatError(f"{name!r} is not a shrunk variant's name; expected "
                    f"{PREFIX}<variant>:<axis>=<n>,...")
  original, _, tail = body.rpartition(":")
  steps = []
  for part in tail.split(","):
    axis, _, n = part.partition("=")
    if not axis or not n.isdigit() or int(n) < 1:
      raise PeatError(f"bad cut {part!r} in shrunk variant {name!r}; "
                      "expected <axis>=<positive length>")
    steps.append((axis, int(n)))
  return original, steps


def _cut(kernel: str, composite: bool, call: V.Call, axis: str, n: int,
         rng) -> V.Call:
  named = {a.name: a for a in axes_of(kernel, composite, call)}
  if axis not in named:
    raise PeatError(f"the call has no axis {axis!r} to cut; it has "
                    f"{sorted(named)}")
  return named[axis].set(call, n, rng)


def rebuild(kernel: str, composite: bool, site: str, original: V.Call,
            name: str, seed: int) -> V.Call:
  """The call of a shrunk variant: its cuts replayed on the original."""
  base, steps = parse(name)
  call = original
  for k, (axis, n) in enumerate(steps):
    rng = V.rng_of(seed, site, name_of(base, steps[:k + 1]))
    call = _cut(kernel, composite, call, axis, n, rng)
  return call


def residues(n: int) -> list[int]:
  """Lengths below ``n`` with its remainder modulo each tile width
  ``2^j`` (8 <= 2^j <= 2^16): the remainder itself and one tile past it,
  ascending (a tail bug fails on all of them past its threshold)."""
  out = set()
  for j in range(3, 17):
    p = 1 << j
    r = n % p
    out.update(c for c in (r, r + p) if 1 <= c < n)
  return sorted(out)


def same_failure(first: dict, other: dict | None) -> bool:
  """Whether ``other`` (a record or finding, None when not applicable)
  fails the way ``first`` does."""
  if other is None:
    return False
  if first.get("kind") == "fuzz_error":
    return (other.get("kind") == "fuzz_error"
            and _error_kind(other["error"]) == _error_kind(first["error"]))
  if other.get("kind") != "site":
    return False
  a, b = first["diagnosis"], other["diagnosis"]
  return (_detector.severity(b["verdict"]) >= _detector.severity(
      a["verdict"]) > 0
          and failure_kind(b["model"]) == failure_kind(a["model"]))


def failure_kind(model: str) -> str:
  """What a failing model says went wrong: ``nan`` (non-finite values),
  ``precision`` (rounding beyond the envelope: a narrower format,
  accumulation, truncation, flushing, nondeterminism) or ``values``
  (wrong values: every fault and port model). The Detector may name one
  bug differently at two shapes (a doubled vector is ``scale`` on one row
  and ``approximation`` over rows of different masks); a shrink keeps
  the kind of failure, never turns wrong values into a rounding warning."""
  fam = _detector.family(model)
  if fam == "nan":
    return "nan"
  return "precision" if fam in _detector.PRECISION_MODELS else "values"


def _error_kind(error: str) -> str:
  """``the KUT raised ValueError`` / ``the KUT returned`` of a finding."""
  return error.split(":")[0].split(";")[0]


class Shrunk(NamedTuple):
  """A shrink's outcome.

  Attributes:
    name: the shrunk variant's name (the original's when nothing shrank).
    outcome: its record or finding.
    tries: variant runs made.
    seconds: wall time.
  """

  name: str
  outcome: dict
  tries: int
  seconds: float


def shrink(kernel: str, composite: bool, site: str, original: V.Call,
           name: str, first: dict, run: Callable[[str, V.Call], dict | None],
           seed: int, max_tries: int = MAX_TRIES,
           max_seconds: float | None = None) -> Shrunk:
  """Searches the axes of a failing call for the smallest one that fails
  the same way.

  Args:
    kernel: the site's kernel; composite: whether it is a composite.
    site: the site's name (seeds the cuts).
    original: the failing variant's call.
    name: its variant name.
    first: its record or finding.
    run: ``run(variant_name, call) -> record | finding | None`` (None:
      not applicable).
    seed: the fuzz seed.
    max_tries: at most this many runs.
    max_seconds: no run starts after this many seconds.

  Returns:
    A :class:`Shrunk` (``name`` is the original's when nothing shrank).
  """
  t0 = time.perf_counter()
  steps: list[tuple[str, int]] = []
  call, best, tries = original, first, 0

  def left() -> bool:
    return tries < max_tries and (
        max_seconds is None or time.perf_counter() - t0 < max_seconds)

  def attempt(axis, n) -> dict | None:
    nonlocal tries
    trial = steps + [(axis, n)]
    vname = name_of(name, trial)
    rng = V.rng_of(seed, site, vname)
    try:
      c = _cut(kernel, composite, call, axis, n, rng)
    except (PeatError, ValueError, IndexError):
      return None
    tries += 1
    out = run(vname, c)
    return (c, out) if same_failure(first, out) else None

  order = sorted(axes_of(kernel, composite, call), key=lambda a: -a.size)
  for axis in [a.name for a in order]:
    ax = {a.name: a for a in axes_of(kernel, composite, call)}.get(axis)
    if ax is None or ax.size <= 1 or not left():
      continue
    ok = ax.valid or (lambda n: True)
    found, passed = None, set()

    def probe(n, axis=axis):
      got = attempt(axis, n)
      if got is None:
        passed.add(n)
      return got
    got = probe(1) if ok(1) else None  # most axes fail at one
    if got is not None:
      found = (1, got)
    for n in residues(ax.size) if found is None else ():
      if not left():
        break
      if ok(n) and (got := probe(n)) is not None:
        found = (n, got)
        break
    top = found[0] if found else ax.size
    every = (L.ladder_set(top) if ax.choices is None
             else sorted(ax.choices))
    below = [n for n in every if n < top and ok(n) and n not in passed]
    lo, hi = 0, len(below)
    while lo < hi and left():  # bisection over the lattice
      mid = (lo + hi) // 2
      got = probe(below[mid])
      if got is not None:
        hi, found = mid, (below[mid], got)
      else:
        lo = mid + 1
    if found:  # then single lengths, between the last that passed and it
      lo_n = max([p for p in passed if p < found[0]], default=0)
      hi_n = found[0]
      while hi_n - lo_n > 1 and left():
        mid = (lo_n + hi_n) // 2
        got = probe(mid) if ok(mid) else None
        if got is not None:
          hi_n, found = mid, (mid, got)
        else:
          lo_n = mid
    if found:
      steps.append((axis, found[0]))
      call, best = found[1]
  final = name_of(name, steps) if steps else name
  return Shrunk(final, best, tries, round(time.perf_counter() - t0, 3))
