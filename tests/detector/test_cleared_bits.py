"""Round toward zero into a significand width no named format has: a KUT
that clears the low k bits of its float32 results (``x & ~(2**k - 1)``)
truncates to 23 - k bits, one-sided and bounded by 2**-(23 - k), which
the Detector names ``truncation`` whatever the record's size (the value
rule, which a truncation's sign-following error also meets, is not the
cause). A bit forced to 0 above the lowest ones is no truncation.

Fresh seeded inputs, float64 references.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access
import types

from peat_jax.detector import CONFIG
from peat_jax.detector.hypotheses import _h_base  # pylint: disable=protected-access


def _clear(x, mask):
  bits = jax.lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(mask)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _diagnose(shape, seed, mask):
  m, k, n = shape
  rng = np.random.default_rng(seed)
  a = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
  b = jnp.asarray((0.1 * rng.standard_normal((k, n))).astype(np.float32))
  case = cal.CalibrationCase("matmul", "random", jnp.matmul, (a, b),
                             reduction=k)
  g = jax.jit(jnp.matmul)(a, b)
  r = cal.reference_of(case, (a, b))
  t = _clear(g, mask)
  ctx = {"kernel": "dot_general", "reduction": k}
  return cal.diagnose(t, g, r, ctx, probe=cal.probe_of(case, (a, b)),
                      dtype=t.dtype)


@pytest.mark.parametrize("cleared", [6, 8, 12])
@pytest.mark.parametrize("shape,seed", [((8, 64, 10), 1), ((96, 128, 80), 2)])
def test_cleared_low_bits_are_truncation(cleared, shape, seed):
  diag = _diagnose(shape, seed, 0xFFFFFFFF ^ ((1 << cleared) - 1))
  assert diag.model == "truncation", diag.evidence
  assert diag.verdict == "warn"


def test_cleared_bits_need_the_lowest_run():
  """Bit 5 forced to 0 (bits 0-4 kept): not a truncation of the width."""
  diag = _diagnose((96, 128, 80), 3, 0xFFFFFFFF ^ (1 << 5))
  assert diag.model != "truncation", diag.evidence


def test_cleared_low_bits_counts_the_run():
  sig = types.SimpleNamespace(
      bits_up=np.zeros(32, np.int32),
      bits_down=np.array([50] * 8 + [0] * 24, np.int32))
  f = types.SimpleNamespace(sig=sig, mant=23, ndiff=100, cfg=CONFIG)
  assert _h_base.cleared_low_bits(f) == 8
  sig.bits_up[3] = 1  # a bit gained: the run stops below it
  assert _h_base.cleared_low_bits(f) == 3
  sig.bits_down[0] = 10  # too few lost at bit 0: no run
  assert _h_base.cleared_low_bits(f) == 0
