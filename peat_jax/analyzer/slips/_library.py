"""The library of known approximations, in float64 on the host.

An ``approximation`` names one of these, and only where it reproduces
the KUT's output in magnitude: another closed form of the same function
(GELU's tanh or sigmoid form, hard swish), or a fast routine in place of
an exact one inside the kernel (``exp`` by a bit trick, a cubic or a
table of ``2**f``; ``1/sqrt`` and ``1/x`` by a bit trick and a Newton
step). Each member replaces one place of a kind's computation
(:class:`Member.hook`): ``exp``, ``rsqrt``, ``rcp``, or the activation
``act`` as a whole. The bit tricks are emulated on float32 bit patterns,
as the kernels that use them compute.

Two *classes* cover the members' relatives with other constants: an
``exp`` whose relative error is a function of the fraction ``f`` of ``x
log2 e`` (any polynomial, table or bit trick of ``2**f``), and a
reciprocal or rsqrt whose relative error is a function of the
argument's significand (and, for rsqrt, its exponent's parity). Their
error function is fitted to the KUT's output (``._approx_fits``).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
from scipy import special

from peat_jax import core as _core
from peat_jax.analyzer.slips import _numerics as num


class Member(NamedTuple):
  """One known approximation.

  Attributes:
    name: its name (:data:`peat_jax.core.APPROXIMATIONS`).
    hook: the place it replaces: ``exp``, ``rsqrt``, ``rcp`` or ``act``.
    fn: the approximation (float64 array -> float64 array).
    kinds: the kinds it applies to.
    sentence: what it is.
  """

  name: str
  hook: str
  fn: Callable[[np.ndarray], np.ndarray]
  kinds: tuple[str, ...]
  sentence: str


def gelu_erf(x: np.ndarray) -> np.ndarray:
  """GELU, erf form: ``x Phi(x)``."""
  return 0.5 * x * (1.0 + special.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
  """GELU, tanh form (``jax.nn.gelu(approximate=True)``)."""
  c = math.sqrt(2.0 / math.pi)
  return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))


def gelu_sigmoid(x: np.ndarray) -> np.ndarray:
  """GELU as ``x sigmoid(1.702 x)``."""
  return x * special.expit(1.702 * x)


#: Abramowitz and Stegun 7.1.26: erf(x) ~ 1 - poly(t) exp(-x^2),
#: t = 1 / (1 + p x), |error| <= 1.5e-7.
AS_P = 0.3275911
AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf_poly(x: np.ndarray) -> np.ndarray:
  """erf by Abramowitz-Stegun 7.1.26 (odd extension)."""
  a = np.abs(x)
  t = 1.0 / (1.0 + AS_P * a)
  poly = t * (AS_A[0] + t * (AS_A[1] + t * (AS_A[2] + t * (
      AS_A[3] + t * AS_A[4]))))
  return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def gelu_erf_poly(x: np.ndarray) -> np.ndarray:
  """GELU's erf form with erf by :func:`erf_poly`."""
  return 0.5 * x * (1.0 + erf_poly(x / math.sqrt(2.0)))


def silu_hard(x: np.ndarray) -> np.ndarray:
  """Hard swish ``x relu6(x + 3) / 6``."""
  return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


#: Schraudolph's exp on float32 bits: 2**23 / ln 2 per unit of x, the
#: bias 127 * 2**23 less the shift that minimizes the RMS relative error.
SCHRAUDOLPH_SHIFT = 0.0579848


def exp_schraudolph(x: np.ndarray) -> np.ndarray:
  """exp by the bit trick: the float32 whose bits are ``2**23 (x log2 e +
  127 - shift)`` (truncated to an integer)."""
  t = np.clip(np.asarray(x, np.float64) * num.LOG2E, -126.0, 127.0)
  bits = np.floor((t + 127.0 - SCHRAUDOLPH_SHIFT) * 2.0 ** 23)
  return num.from_float32_bits(bits.astype(np.int64))


#: The cubic of exp_poly3: 2**f ~ 1 + f (c1 + f (c2 + f c3)), f in [0, 1).
POLY3 = (0.6960656, 0.2244012, 0.0795332)


def _pow2_split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``(n, f)`` with ``x log2 e = n + f``, ``n`` an integer, ``f`` in
  [0, 1) (clipped to float32's normal range)."""
  t = np.clip(np.asarray(x, np.float64) * num.LOG2E, -126.0, 127.0)
  n = np.floor(t)
  return n, t - n


def exp_poly3(x: np.ndarray) -> np.ndarray:
  """exp as ``2**n`` times a cubic of the fraction."""
  n, f = _pow2_split(x)
  return np.ldexp(1.0 + f * (POLY3[0] + f * (POLY3[1] + f * POLY3[2])),
                  n.astype(np.int64))


#: Entries per octave of exp_table64's table.
TABLE_STEPS = 64
_TABLE = np.exp2(np.arange(TABLE_STEPS + 1) / TABLE_STEPS)


def exp_table64(x: np.ndarray) -> np.ndarray:
  """exp as ``2**n`` times ``2**(k/64)`` from a table, interpolated
  linearly between entries."""
  n, f = _pow2_split(x)
  s = f * TABLE_STEPS
  k = np.minimum(np.floor(s).astype(np.int64), TABLE_STEPS - 1)
  w = s - k
  return np.ldexp(_TABLE[k] + w * (_TABLE[k + 1] - _TABLE[k]),
                  n.astype(np.int64))


RSQRT_MAGIC = 0x5F3759DF
RCP_MAGIC = 0x7EF311C7


def rsqrt_newton1(v: np.ndarray) -> np.ndarray:
  """``1/sqrt(v)`` by the bit trick and one Newton step (float32)."""
  v32 = np.asarray(v, np.float32).astype(np.float64)
  y = num.from_float32_bits(RSQRT_MAGIC - (num.as_float32_bits(v32) >> 1))
  return y * (1.5 - 0.5 * v32 * y * y)


def rcp_newton1(s: np.ndarray) -> np.ndarray:
  """``1/s`` by the bit trick and one Newton step (float32)."""
  s32 = np.asarray(s, np.float32).astype(np.float64)
  y = num.from_float32_bits(RCP_MAGIC - num.as_float32_bits(s32))
  return y * (2.0 - s32 * y)


_FNS = {"gelu_tanh": ("act", gelu_tanh), "gelu_erf": ("act", gelu_erf),
        "gelu_sigmoid": ("act", gelu_sigmoid),
        "erf_poly": ("act", gelu_erf_poly),
        "silu_hard": ("act", silu_hard),
        "exp_schraudolph": ("exp", exp_schraudolph),
        "exp_poly3": ("exp", exp_poly3),
        "exp_table64": ("exp", exp_table64),
        "rsqrt_newton1": ("rsqrt", rsqrt_newton1),
        "rcp_newton1": ("rcp", rcp_newton1)}

#: Every member, by name (kinds and sentences from the grammar's
#: vocabulary).
MEMBERS = {name: Member(name, hook, fn, *_core.APPROXIMATIONS[name])
           for name, (hook, fn) in _FNS.items()}


def members_of(kind: str, approximate: bool = False) -> list[Member]:
  """The members that apply to a kind (a tanh-form GELU site: the erf
  form is its other form, not the tanh one)."""
  out = [m for m in MEMBERS.values() if kind in m.kinds]
  if kind == "gelu":
    skip = "gelu_tanh" if approximate else "gelu_erf"
    out = [m for m in out if m.name != skip]
  return out


def _rel_error(fn, exact, x) -> float:
  with np.errstate(all="ignore"):
    return float(np.max(np.abs(fn(x) / exact(x) - 1.0)))


def _act_error(fn, exact, x) -> float:
  scale = float(np.sqrt(np.mean(exact(x) ** 2)))
  return float(np.max(np.abs(fn(x) - exact(x)))) / scale


def _library_bound() -> float:
  """The largest error of a member against the function it replaces:
  relative for exp, rsqrt and rcp over their arguments' ranges, and
  against the activation's RMS over [-6, 6] for the activations (the
  errors a ``value_function`` or per-row factor can show)."""
  x = np.linspace(-30.0, 0.0, 20001)
  v = np.exp(np.linspace(-20.0, 20.0, 20001))
  a = np.linspace(-6.0, 6.0, 20001)
  errs = [_rel_error(m.fn, np.exp, x) for m in MEMBERS.values()
          if m.hook == "exp"]
  errs += [_rel_error(rsqrt_newton1, lambda u: 1.0 / np.sqrt(u), v),
           _rel_error(rcp_newton1, lambda u: 1.0 / u, v)]
  errs += [_act_error(gelu_tanh, gelu_erf, a),
           _act_error(gelu_sigmoid, gelu_erf, a),
           _act_error(gelu_erf_poly, gelu_erf, a),
           _act_error(silu_hard, lambda u: u * special.expit(u), a)]
  return max(errs)


#: A known approximation errs by at most this much of its function (the
#: library's largest member error, measured at import on fixed grids): a
#: dense error beyond it is no approximation of the library's.
LIBRARY_BOUND = _library_bound()
