"""Typed evidence: what a hypothesis found, in numbers.

Each accepted hypothesis returns a :class:`Found`: its typed evidence (one
NamedTuple per kind of cause below), the sentence a user reads, and how
closely its statistic fitted (the candidate's confidence). ``covers`` is
how many elements the cause explains: the ranking reads it.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Flips(NamedTuple):
  """Bit flips: elements back inside the base after 1-3 flips."""

  count: int
  bits: tuple[int, ...]
  flips: int  # the most flips an element needed
  tail: float  # binomial tail of as many by chance (the flip null)
  covers: int


class Stuck(NamedTuple):
  """One bit forced one way in every element it changed."""

  bit: int
  polarity: int
  count: int
  covers: int


class Replaced(NamedTuple):
  """Sparse elements holding values unrelated to golden."""

  count: int
  max_error_rms: float  # the largest error / the golden RMS
  covers: int


class Zeroed(NamedTuple):
  """Elements (rows, tiles) left zero where golden is not."""

  count: int
  rows: int
  tiles: int
  tile: int
  covers: int


class NonFinite(NamedTuple):
  """NaN or Inf where golden is finite."""

  count: int
  nan: int
  inf: int
  covers: int


class Saturated(NamedTuple):
  """Values clipped at a format's maximum, or overflowed to Inf."""

  format: str
  to: str  # "max" or "inf"
  count: int
  covers: int


class Lane(NamedTuple):
  """Errors confined to one lane (column mod stride) or to whole tiles."""

  kind: str  # "stride" or "tile"
  stride: int
  lane: int
  tile: int
  tiles: int
  what: str
  covers: int


class Moved(NamedTuple):
  """Golden values in other places: a shift, transpose, permutation or a
  trailing band (a tile edge)."""

  kind: str  # shift, transpose, permutation, tile_edge, kv_group, ...
  axis: str
  shift: int
  share: float
  first: int
  band: int
  covers: int


class Scaled(NamedTuple):
  """The output is a constant multiple of golden."""

  factor: float
  residual: float
  spread: float
  covers: int


class Flushed(NamedTuple):
  """Values below a format's smallest normal (or far below the output's
  scale) returned as zero."""

  format: str
  flushed: int
  largest: float
  covers: int


class Rounded(NamedTuple):
  """A rounding of the computation: its format, where, and how."""

  format: str
  where: str  # inputs, output, accumulator, working
  rounding: str  # nearest_even, nearest_away, nearest, toward_zero
  level: float  # the observed median relative error
  predicted: float  # the hypothesis's prediction of it
  octaves: float  # their distance
  alternatives: tuple[str, ...]  # formats with the same prediction
  covers: int
  shrink_u: float = float("nan")  # a truncation's fitted shrink, in u


class Noise(NamedTuple):
  """Rounding noise of another order at working precision."""

  level_u: float  # median relative error in units of u
  noise_ratio: float
  envelope: float  # the envelope the elements stay in, units of u x scale
  covers: int


class Form(NamedTuple):
  """Another constant or closed form of the same function."""

  kind: str  # eps, variance, temperature, value_function, row_scale, ...
  estimate: float  # the fitted constant where one is (NaN otherwise)
  level: float  # RMS error over the scale
  noise_ratio: float
  detail: str
  covers: int


class Slipped(NamedTuple):
  """The slip of the grammar (or a kind's own form) whose emulation
  reproduces the KUT's output."""

  slip: str  # its name (peat.core.Slip.name, a base joined by "+")
  category: str  # operand, constant, blocked, accumulate, approximation
  estimate: float  # the fitted constant (NaN where none)
  ratio: float  # median |t - h| / |t - r| over the differing elements
  runners_up: tuple[str, ...]  # "name (ratio)" of the next best
  equivalent: tuple[str, ...]  # slips with the same output (another name)
  level: float  # RMS error over the scale
  noise_ratio: float
  covers: int


class Unexplained(NamedTuple):
  """A real difference that no hypothesis explains."""

  ndiff: int
  noise_ratio: float
  covers: int


class Repeat(NamedTuple):
  """Two KUT calls on identical inputs differ."""

  differing: int
  covers: int


class Found(NamedTuple):
  """One accepted hypothesis: its model name, typed evidence, sentence and
  fit (in (0, 1])."""

  model: str
  evidence: Any
  sentence: str
  fit: float
