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

from peat_jax.detector._detect import SPARSE_EXACT_BITS, SPARSE_EXACT_SHARE
from peat_jax.detector._detect import detect
from peat_jax.detector._facts import (
    BENIGN_NOISE_RATIO, Candidate, Diagnosis, NARROW_FORMATS, _Facts, _host,
    _working_format)
from peat_jax.detector._rules import _rule_indexing, _rule_stuck

#: A record is cleared only when neither direction holds fewer than this
#: share of its changed magnitudes (the truncation rules fire at 1%).
ONE_SIDED_SHARE = 0.05
#: ... and no narrow format holds this share of its outputs (the precision
#: rule fires at 99%, golden 20 points below).
NARROW_SHARE = 0.9


def triage(sig, screen, *, dtype=None) -> Diagnosis | None:
  """The diagnosis of a screened record, or None where it is flagged.

  Args:
    sig: the record's Signature from the screen (no decomposition needed;
      ``peat.analyzer.screen``).
    screen: its :class:`~peat_jax.analyzer.Screen` facts.
    dtype: the compared arrays' dtype when the signature cannot tell (as
      :func:`~peat_jax.detector.detect`).

  Returns:
    ``exact`` (bitwise equal) or ``reordering`` (pass) decided by the
    screen (``params["path"] == "screen"``), or None: the record needs
    the decomposition (and the full Detector).
  """
  s = _host(sig)
  if int(s["n_bit_equal"]) == int(s["n"]):
    exact = detect(sig, dtype=dtype)
    return exact._replace(params={**exact.params, "path": "screen"})
  f = _Facts(s, _working_format(s, dtype))
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
      f"bias {float(s['bias']):+.2f}, KUT/golden RMS error vs float64 = "
      f"{f.noise_ratio:.3g}", {"level_u": level / f.u, "path": "screen"})
  return Diagnosis(*cand, candidates=(cand,), verdict="pass")


def _cleared(f: _Facts, c: dict[str, Any]) -> bool:
  """Whether the screen's numbers shut every route but reordering."""
  s = f.s
  if not f.has_ref or not np.isfinite(f.noise_ratio):
    return False
  if int(s["n_value_equal"]) == f.n:  # signed zeros: the full path's
    return False
  if int(c["n_beyond"]) or int(c["n_nonfinite_mismatch"]) or int(
      s["n_nonfinite_new"]):
    return False
  if int(s["n_zeroed"]):  # zeros where golden is not: ftz's values, tiny
    return False  # at the row's scale, stay inside the envelope
  if not f.noise_ratio <= BENIGN_NOISE_RATIO:
    return False
  if bool(s["is_permutation"]) or _rule_indexing(f) or _rule_stuck(f):
    return False
  if f.share <= SPARSE_EXACT_SHARE and f.bits_per_diff <= SPARSE_EXACT_BITS:
    return False
  if f.ndiff >= 16:
    up, dn = float(s["ref_test_grown"]), float(s["ref_test_shrunk"])
    sides = (min(up, dn) / max(up + dn, 1e-30),
             min(f.larger, f.smaller) / max(f.ndiff, 1))
    if min(sides) <= ONE_SIDED_SHARE:
      return False
  repr_t = np.asarray(s["repr_test"], np.float64)
  repr_g = np.asarray(s["repr_golden"], np.float64)
  for k in range(len(NARROW_FORMATS)):
    if repr_t[k] >= NARROW_SHARE and repr_g[k] <= repr_t[k] - 0.1:
      return False
  return True
