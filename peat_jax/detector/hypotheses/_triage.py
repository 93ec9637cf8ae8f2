"""Triage: the records the screen alone decides, before any decomposition.

Playback screens every record (``peat.analyzer.screen_split_many``: the
statistics pass, and the decomposition's envelope facts) and runs the
noise-aware decomposition and the port probe only on the records the
screen flags. :func:`triage` decides the rest, and only where the full
Detector could not answer otherwise: a record is cleared as ``reordering``
(pass) when every one of the Detector's routes to another answer is shut
by a number the screen has:

* no element beyond the golden kernel's rounding envelope and no NaN/Inf
  that golden does not have (``n_beyond`` 0: no outlier, no fault rule on
  the outliers, no dense fault that moves elements beyond the envelope);
* the KUT's RMS error against float64 at most ``BENIGN_NOISE_RATIO`` times
  golden's (the reordering verdict's pass, and no port probe, which needs
  more than ``BEYOND_GOLDEN``);
* no exact trace that rounding inside the envelope could hide: golden's
  bit patterns moved (transpose, shift, permutation), one bit forced one
  way in every differing element (a stuck low bit), a few elements each
  one bit off with the rest bitwise golden (a sparse flip);
* not one-sided (round toward zero) and not confined to a narrower format
  (``precision``): the rounding rules' triggers, with a margin;
* no zero where golden is nonzero (values flushed to zero, ``ftz``, are
  tiny at their row's scale and stay inside the envelope).

Bitwise-equal records are ``exact``. Everything else is flagged
(``None``): the decomposition runs and :func:`~peat_jax.detector.detect`
decides. tests/detector/test_triage.py checks that every record the
screen clears gets the same model and verdict from the full path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from peat_jax.detector.hypotheses import _h_whole as whole
from peat_jax.detector.facts import CONFIG, DetectorConfig
from peat_jax.detector.hypotheses._detect import detect
from peat_jax.detector.facts import (
    Candidate, Diagnosis, Facts, NARROW_FORMATS, checked_signature,
    working_format)

#: A record is cleared only when neither direction holds fewer than this
#: share of its changed magnitudes (the truncation rules fire at
#: one_sided, 1%: five times that is a margin).
ONE_SIDED_SHARE = 5 * CONFIG.one_sided
#: ... and no narrow format holds this share of its outputs (the precision
#: rule fires at repr_share, 99%: a margin of ten times its complement).
NARROW_SHARE = 1.0 - 10 * (1.0 - CONFIG.repr_share)


def triage(sig, screen, *, dtype=None,
           config: DetectorConfig = CONFIG) -> Diagnosis | None:
  """The diagnosis of a screened record, or None where it is flagged.

  Args:
    sig: the record's Signature from the screen (no decomposition needed;
      ``peat.analyzer.screen``).
    screen: its :class:`~peat_jax.analyzer.Screen` facts.
    dtype: the compared arrays' dtype when the signature cannot tell (as
      :func:`~peat_jax.detector.detect`).
    config: the Detector's thresholds.

  Returns:
    ``exact`` (bitwise equal) or ``reordering`` (pass) decided by the
    screen (``params["path"] == "screen"``), or None: the record needs
    the decomposition (and the full Detector).
  """
  s = checked_signature(sig)
  if int(s.n_bit_equal) == int(s.n):
    exact = detect(sig, dtype=dtype, config=config)
    return exact._replace(params={**exact.params, "path": "screen"})
  f = Facts(s, working_format(s, dtype), config=config)
  c = {k: np.asarray(v) for k, v in screen._asdict().items()}
  if not _cleared(f, c):
    return None
  level = f.rel_med
  cand = Candidate(
      "reordering", 0.95,
      f"rounding noise (screened): every element is within "
      f"{float(c['env_theta_golden']):.3g} units of u({f.work}) x its scale "
      f"of the float64 reference (the golden kernel's envelope; the KUT's "
      f"largest {float(c['z_max_test']):.3g}, golden's "
      f"{float(c['env_golden_z']):.3g}); median relative error {level:.3g}, "
      f"bias {float(s.bias):+.2f}, KUT/golden RMS error vs float64 = "
      f"{f.noise_ratio:.3g}", {"level_u": level / f.u, "path": "screen"})
  return Diagnosis(*cand[:4], candidates=(cand,), verdict="pass")


def _cleared(f: Facts, c: dict[str, Any]) -> bool:
  """Whether the screen's numbers shut every route but reordering."""
  s = f.sig
  if not f.has_ref or not np.isfinite(f.noise_ratio):
    return False
  cfg = f.cfg
  if int(s.n_value_equal) == f.n:  # signed zeros: the full path's
    return False
  if int(c["n_beyond"]) or int(c["n_nonfinite_mismatch"]) or int(
      s.n_nonfinite_new):
    return False
  if int(s.n_zeroed):  # zeros where golden is not: ftz's values, tiny
    return False  # at the row's scale, stay inside the envelope
  if not f.noise_ratio <= cfg.benign_noise_ratio:
    return False
  if (bool(s.is_permutation) or whole.transposed(f) or whole.shifted(f)
      or whole.stuck(f)):
    return False
  if (f.share <= cfg.sparse_exact_share
      and f.bits_per_diff <= cfg.sparse_exact_bits):
    return False
  if f.ndiff >= cfg.truncation_min_count:
    up, dn = float(s.ref_test_grown), float(s.ref_test_shrunk)
    sides = (min(up, dn) / max(up + dn, 1e-30),
             min(f.larger, f.smaller) / max(f.ndiff, 1))
    if min(sides) <= ONE_SIDED_SHARE:
      return False
  repr_t = np.asarray(s.repr_test, np.float64)
  repr_g = np.asarray(s.repr_golden, np.float64)
  for k in range(len(NARROW_FORMATS)):
    if (repr_t[k] >= NARROW_SHARE
        and repr_g[k] <= repr_t[k] - cfg.repr_gap / 2):
      return False
  return True
