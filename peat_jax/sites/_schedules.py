"""When a kernel under test runs at a site: call schedules.

Schedules are decided inside the compiled step from the step counter and a
key, so later steps do not retrace."""

import zlib
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from peat_jax.core import PeatError


# ---------------------------------------------------------------------------
# Schedules


class EveryCall(NamedTuple):
  """The KUT runs at every call of every selected site."""

  def active(self, step: jax.Array, site_name: str, loop_indices: Sequence[jax.Array]):
    """Returns ``True`` (a Python bool: no ``cond`` is emitted)."""
    del step, site_name, loop_indices
    return True


class EveryNSteps(NamedTuple):
  """The KUT runs on steps where ``step % n == offset`` (golden otherwise).

  Attributes:
    n: period in steps (>= 1).
    offset: the step residue at which the KUT runs (0 <= offset < n).
  """

  n: int
  offset: int = 0

  def active(self, step, site_name, loop_indices):
    """Returns a traced bool: whether the KUT runs at this call."""
    del site_name, loop_indices
    return (jnp.asarray(step, jnp.int32) % self.n) == self.offset


class Fraction(NamedTuple):
  """The KUT runs at a seeded random fraction ``p`` of calls.

  The decision for one call is a Bernoulli draw from a key folded from
  ``seed``, the step, the site name and, under ``scan``, the iteration index:
  the same seed gives the same calls in every run.

  Attributes:
    p: probability that a call uses the KUT, in [0, 1].
    seed: seed of the decisions.
  """

  p: float
  seed: int = 0

  def active(self, step, site_name, loop_indices):
    """Returns a traced bool: whether the KUT runs at this call."""
    key = jax.random.fold_in(jax.random.key(self.seed), jnp.asarray(step, jnp.uint32))
    key = jax.random.fold_in(key, zlib.crc32(site_name.encode()) & 0x7FFFFFFF)
    for idx in loop_indices:
      key = jax.random.fold_in(key, jnp.asarray(idx, jnp.uint32))
    return jax.random.bernoulli(key, self.p)


Schedule = EveryCall | EveryNSteps | Fraction


def _check_schedule(s):
  if isinstance(s, EveryCall):
    return
  if isinstance(s, EveryNSteps):
    if not (isinstance(s.n, int) and s.n >= 1 and isinstance(s.offset, int) and 0 <= s.offset < s.n):
      raise PeatError(f"EveryNSteps needs an int n >= 1 and 0 <= offset < n; got {s}.")
    return
  if isinstance(s, Fraction):
    if not 0.0 <= float(s.p) <= 1.0:
      raise PeatError(f"Fraction.p must be in [0, 1]; got {s.p}.")
    return
  raise PeatError(
      f"schedule must be EveryCall(), EveryNSteps(n) or Fraction(p, seed); got {s!r}."
  )
