"""Validation of error-model names and injector parameters, before tracing.

Every check raises ``PeatError`` with the parameter, what was expected and
what was given. Validated parameters are normalized (lists to tuples, numbers
to Python ``int``/``float``) so that they hash: they are static arguments of
the compiled injectors.
"""

import numbers
from typing import Any, Callable, Mapping

from peat_jax.core import PeatError

REQUIRED = object()
"""Marks a parameter without a default."""


class Param:
  """One injector parameter: its default and a normalizing check."""

  def __init__(self, default: Any, check: Callable[[Any], Any],
               expected: str, doc: str = ""):
    self.default = default
    self.check = check
    self.expected = expected
    self.doc = doc


def _fail(what: str, p: str, expected: str, got: Any) -> PeatError:
  return PeatError(f"{what}: parameter {p!r} expected {expected}, got {got!r}.")


def integer(lo: int | None = None, hi: int | None = None, *,
            none_ok: bool = False, doc: str = "", default: Any = REQUIRED
            ) -> Param:
  """An integer parameter in ``[lo, hi]`` (None bounds are open)."""
  rng = ("an integer" + (f" >= {lo}" if lo is not None else "")
         + (f" and <= {hi}" if hi is not None else ""))
  if none_ok:
    rng += " or None"

  def check(v):
    if v is None and none_ok:
      return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
      raise ValueError
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
      raise ValueError
    return v

  return Param(default, check, rng, doc)


def real(lo: float | None = None, hi: float | None = None, *,
         lo_open: bool = False, none_ok: bool = False, finite: bool = True,
         doc: str = "", default: Any = REQUIRED) -> Param:
  """A real parameter in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
  rng = "a real number"
  if lo is not None:
    rng += f" {'>' if lo_open else '>='} {lo}"
  if hi is not None:
    rng += f" and <= {hi}"
  if none_ok:
    rng += " or None"

  def check(v):
    if v is None and none_ok:
      return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
      raise ValueError
    v = float(v)
    if finite and v != v or (finite and abs(v) == float("inf")):
      raise ValueError
    if lo is not None and (v <= lo if lo_open else v < lo):
      raise ValueError
    if hi is not None and v > hi:
      raise ValueError
    return v

  return Param(default, check, rng, doc)


def choice(options: tuple, *, doc: str = "", default: Any = REQUIRED) -> Param:
  """A parameter that is one of ``options``."""

  def check(v):
    if v not in options:
      raise ValueError
    return v

  return Param(default, check, f"one of {list(options)}", doc)


def int_tuple(length: int | None = None, lo: int | None = None, *,
              none_ok: bool = False, doc: str = "", default: Any = REQUIRED
              ) -> Param:
  """A tuple of integers (an int is a 1-tuple), optionally of ``length``."""
  exp = (f"a tuple of {length} integers" if length else
         "an integer or a tuple of distinct integers")
  if lo is not None:
    exp += f" >= {lo}"
  if none_ok:
    exp += " or None"

  def check(v):
    if v is None and none_ok:
      return None
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and (
        length in (None, 1)):
      v = (v,)
    if not isinstance(v, (tuple, list)) or not v:
      raise ValueError
    out = []
    for e in v:
      if isinstance(e, bool) or not isinstance(e, numbers.Integral):
        raise ValueError
      if lo is not None and e < lo:
        raise ValueError
      out.append(int(e))
    if length is not None and len(out) != length:
      raise ValueError
    if length is None and len(set(out)) != len(out):
      raise ValueError
    return tuple(out)

  return Param(default, check, exp, doc)


def weights3(*, doc: str = "", default: Any = REQUIRED) -> Param:
  """Three non-negative weights (sign, exponent, mantissa), not all zero."""

  def check(v):
    if v is None:
      return None
    if not isinstance(v, (tuple, list)) or len(v) != 3:
      raise ValueError
    out = []
    for e in v:
      if isinstance(e, bool) or not isinstance(e, numbers.Real) or e < 0:
        raise ValueError
      out.append(float(e))
    if sum(out) <= 0:
      raise ValueError
    return tuple(out)

  return Param(default, check,
               "None or (sign, exponent, mantissa) non-negative weights, not "
               "all zero", doc)


def validate(what: str, spec: Mapping[str, Param], given: Mapping[str, Any]
             ) -> dict[str, Any]:
  """Checks ``given`` against ``spec``; returns all params with defaults.

  Args:
    what: how the caller is named in messages, e.g. ``"inject('bitflip')"``.
    spec: parameter name to Param.
    given: the keyword arguments the user passed.

  Returns:
    A dict with one normalized value per parameter in ``spec``.

  Raises:
    PeatError: an unknown or missing parameter, or a value out of range.
  """
  unknown = sorted(set(given) - set(spec))
  if unknown:
    raise PeatError(
        f"{what}: unknown parameter(s) {unknown}; expected parameters: "
        f"{sorted(spec) or 'none'}.")
  out = {}
  for p, s in spec.items():
    if p in given:
      try:
        out[p] = s.check(given[p])
      except (ValueError, TypeError):
        raise _fail(what, p, s.expected, given[p]) from None
    elif s.default is REQUIRED:
      raise PeatError(f"{what}: missing required parameter {p!r} "
                      f"(expected {s.expected}).")
    else:
      out[p] = s.default
  return out
