"""The triage screen: is a record inside the golden kernel's envelope?

Playback screens every record before it pays for the noise-aware
decomposition (``_decompose``): the statistics pass and its finalization
(the Signature without its decomposition fields), and beside them the few
facts of the decomposition that decide whether a record is rounding noise
at all: the largest error of the KUT in units of ``u * scale`` against the
golden envelope, the elements beyond it, and the NaN/Inf mismatches. They
are the same numbers the decomposition computes (its
:func:`~peat_jax.analyzer.signature._decompose.envelope`), from one more
read of the pair. The Detector's triage (``peat.detector.triage``) decides
the records these facts clear; the others get the decomposition.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from peat_jax.analyzer.signature._decompose import envelope
from peat_jax.analyzer.signature._signature import Array


class Screen(NamedTuple):
  """What the triage screen adds to a Signature (one record).

  Attributes:
    z_max_test: float32: the KUT's largest error against the reference in
      units of ``u * scale`` (the decomposition's ``z_max_test``).
    env_golden_z: float32: the golden kernel's largest (``env_golden_z``).
    env_theta_golden: float32: the golden envelope (``env_theta_golden``).
    n_beyond: int32: elements beyond it, or NaN/Inf where golden is finite
      (``n_beyond``).
    n_nonfinite_mismatch: int32: elements NaN or Inf in one of the KUT and
      golden outputs and not the other (``n_nonfinite_mismatch``).
  """

  z_max_test: Array
  env_golden_z: Array
  env_theta_golden: Array
  n_beyond: Array
  n_nonfinite_mismatch: Array


def screen_facts(t: Array, g: Array, ref_hi: Array | None,
                 ref_lo: Array | None, dims=None) -> Screen:
  """The screen's facts of one record (traced).

  Args:
    t, g, ref_hi, ref_lo, dims: as the decomposition's
      (``_decompose.decompose``; without a reference the golden output
      stands in).

  Returns:
    A :class:`Screen`, every field equal to the decomposition's.
  """
  e = envelope(t, g, ref_hi, ref_lo, dims)
  f32 = lambda v: jnp.asarray(v, jnp.float32)
  return Screen(f32(e.z_max_test), f32(e.golden_z), f32(e.theta_g),
                e.n_beyond, e.n_nonfinite_mismatch)
