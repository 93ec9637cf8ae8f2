"""The port probe of playback's primitive sites, on the device.

The probe of a primitive site (a kind whose probe tries the
input-precision hypotheses alone: ``peat.analyzer.precision_only``) runs on
the device: every hypothesis (``inputs_bf16``, ``inputs_tf32``...) at the
site's first record, and at its later records the one it found best
(``ProbeCache``, carried). One x64 executable for every such try of a step
reads the screen's float64 reference and the hypotheses
(``DeviceReferences``, ``ProbeReferences``: an executable per site and
format, so a carried try reads the values the whole probe read) and
computes the KUT's and golden's RMS distances to the reference and the
KUT's to the hypothesis, the ratio ``|t - h| / |t - r|`` of every element
where ``t != r``, and the hypothesis rounded to the output's dtype and
split into float32 halves for its re-based Signature
(``peat.analyzer.probe_signatures``), and the median of every ratio
array, exactly ``np.median``'s (``analyzer.signature.medians_kept``: on
CPU a native kernel over all the tries' ratios at once): only scalars
come to the host.

The answer is the host probe's (``port_probe``) on the same hypotheses:
the median ratio bit for bit, the RMS distances up to the order of their
sums (tests/profiler/playback_fi/test_carried_probe.py).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.analyzer.signature import medians_kept as _medians_kept

_F64 = jnp.float64
#: bf16's smallest normal, and the spacing of its subnormals.
_BF16_TINY = 2.0 ** -126
_BF16_SUB_ULP = 2.0 ** -133
#: float64 fraction bits below bf16's 7.
_DROP = 52 - 7


def nearest(h: jax.Array, dtype) -> jax.Array:
  """A float64 array rounded once to ``dtype`` (to nearest, ties to even),
  traced with x64: as NumPy's ``h.astype(dtype)``.

  XLA converts float64 to bfloat16 by way of float32 (two roundings,
  which differ from one where the first lands on a bf16 tie); bfloat16 is
  rounded here on the float64 bits instead. Other dtypes convert directly
  (one rounding).

  Args:
    h: float64 array.
    dtype: the output dtype.

  Returns:
    ``h`` in ``dtype``.
  """
  if np.dtype(dtype) != jnp.bfloat16:
    return h.astype(dtype)
  bits = jax.lax.bitcast_convert_type(h, jnp.uint64)
  lsb = (bits >> _DROP) & jnp.uint64(1)
  mask = jnp.uint64((1 << _DROP) - 1)
  up = (bits + (mask >> jnp.uint64(1)) + lsb) & ~mask
  normal = jax.lax.bitcast_convert_type(up, _F64)
  sub = jnp.round(h / _BF16_SUB_ULP) * _BF16_SUB_ULP  # exact scalings
  out = jnp.where(jnp.abs(h) < _BF16_TINY, sub, normal)
  out = jnp.where(jnp.isfinite(h), out, h)
  # Exact in float32 (8 significant bits, or a bf16 subnormal), then in
  # bf16; beyond bf16's range float32 gives the infinity bf16 rounds to.
  return out.astype(jnp.float32).astype(jnp.bfloat16)


class Carried(NamedTuple):
  """One site's carried try of an input-precision hypothesis.

  Attributes:
    d_ref: the KUT's RMS distance to the float64 reference (host float).
    d_gold: golden's (host float).
    ratio: the median of ``|t - h| / |t - r|`` where ``t != r`` (inf when
      there is no such element; host float).
    distance: the KUT's RMS distance to the hypothesis (host float).
    split: the hypothesis in the output's dtype and its float32 (hi, lo)
      halves, device arrays (``probe_signatures``' ``hypothesis_split``).
  """

  d_ref: float
  d_gold: float
  ratio: float
  distance: float
  split: tuple


def _try(t, g, r, h):
  """The carried try's figures and arrays of one record (traced, x64):
  ``((d_ref, d_gold, distance), ratios, (h in t's dtype, hi, lo))``."""
  t64, g64 = t.astype(_F64), g.astype(_F64)
  fin = jnp.isfinite(t64) & jnp.isfinite(r)
  # The three sums of squares and the count in one variadic reduction: one
  # read of the operands (separate sums each materialize their input).
  sq = lambda a: jnp.where(fin, a * a, 0.0)
  parts = (sq(t64 - r), sq(g64 - r), sq(t64 - h), fin.astype(_F64))
  ss_ref, ss_gold, ss_h, n = jax.lax.reduce(
      parts, tuple(jnp.zeros((), _F64) for _ in parts),
      lambda x, y: tuple(a + b for a, b in zip(x, y)), tuple(range(t.ndim)))
  rms = lambda ss: jnp.sqrt(ss / jnp.maximum(n, 1.0))
  d_r = jnp.abs(jnp.where(fin, t64, 0.0) - jnp.where(fin, r, 0.0))
  keep = d_r > 0  # implies finite: elsewhere both are 0
  q = jnp.abs(t64 - h) / jnp.where(keep, d_r, 1.0)
  q = jnp.where(keep, jnp.where(jnp.isnan(q), jnp.inf, q), jnp.nan)
  hi, lo = _analyzer.split_on_device(h)
  return ((rms(ss_ref), rms(ss_gold), rms(ss_h)), q,
          (nearest(h, t.dtype), hi, lo))


class CarriedProbes:
  """The carried tries of a Player's primitive sites, one executable."""

  def __init__(self):
    def run(keys, tests, goldens, refs, hyps):
      del keys  # the executable's identity (sites and formats) only
      got = [_try(t, g, r, h)
             for t, g, r, h in zip(tests, goldens, refs, hyps)]
      return ([(f, split) for f, _, split in got],
              _medians_kept([q for _, q, _ in got]))

    self._jit = jax.jit(run, static_argnums=0)
    self._compiled: dict = {}  # keys -> ahead-of-time executable

  def prepare(self, keys: tuple[tuple[int, str], ...], tests: list,
              goldens: list) -> None:
    """Compiles (does not run) the tries of ``keys`` for outputs of these
    shapes and dtypes: playback calls it at the checkpoint whose whole
    probes find the hypotheses, so the later checkpoints that carry them
    run compiled code only (the first checkpoint pays the compilation,
    as it does the others')."""
    if not keys or keys in self._compiled:
      return
    f64 = [jax.ShapeDtypeStruct(np.shape(t), _F64) for t in tests]
    with jax.enable_x64(True):
      self._compiled[keys] = self._jit.lower(
          keys, tests, goldens, f64, f64).compile()

  def __call__(self, keys: tuple[tuple[int, str], ...], tests: list,
               goldens: list, refs: list, hyps: list) -> list[Carried]:
    """The tries of the sites ``keys`` (``(site index, format)`` each):
    their KUT and golden outputs, float64 references and hypotheses
    (device arrays); one dispatch, one transfer of the scalars."""
    if not keys:
      return []
    with jax.enable_x64(True):
      if keys in self._compiled:
        got = self._compiled[keys](tests, goldens, refs, hyps)
      else:
        got = self._jit(keys, tests, goldens, refs, hyps)
      tries, medians = got
      # The figures come to the host; the re-based halves stay on the
      # device.
      figures, medians = jax.device_get(([f for f, _ in tries], medians))
    return [Carried(float(d_ref), float(d_gold), float(ratio), float(dist),
                    split)
            for (d_ref, d_gold, dist), ratio, (_, split)
            in zip(figures, medians, tries)]
