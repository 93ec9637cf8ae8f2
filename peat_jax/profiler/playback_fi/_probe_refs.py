"""The port probe's input-precision hypotheses, on the device.

For a primitive site whose signature calls for the port probe
(``peat.analyzer.needs_probe``), the probe reads the site's float64
reference (the screen's: ``DeviceReferences``) and that reference on the
inputs rounded to each probe format (``peat.analyzer.probe_formats``). Each
(site, format) hypothesis has an executable of its own: the whole probe
of a site's first record and the carried try of one format at its later
records run the same executable, so they read the same values (a float64
convolution compiled in another program may differ in its last bits,
which ``|t - h|`` at float32's rounding level magnifies to the ratio's 8th
digit), and a carried try computes its own format alone. The values are
those the host computes (the same float64 kernel on the same float64
inputs, the same rounding).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from peat_jax import analyzer as _analyzer
from peat_jax import core as _core
from peat_jax import injectors as _injectors


def _rounded(x, key: str):
  """The probe's input rounding (``peat.analyzer.probe_formats``' key: a
  format and a mode, ``peat.analyzer.variant_rounding``), traced:
  floating arrays rounded by way of float32, as float64."""
  if x.ndim == 0 or not jnp.issubdtype(x.dtype, jnp.floating):
    return x.astype(jnp.float64) if jnp.issubdtype(
        x.dtype, jnp.floating) else x
  fmt, mode = _analyzer.variant_rounding(key)
  y = _injectors.round_to(x.astype(jnp.float32), _core.FORMATS[fmt], mode)
  return y.astype(jnp.float64)


class ProbeReferences:
  """The input-precision hypotheses of a Player's primitive sites."""

  def __init__(self, fns: Sequence):
    """Args: fns: per site its traceable golden kernel
    (``peat.analyzer.reference_traced``, None where there is none)."""
    self.fns = list(fns)

    def hypothesis(key, xs):
      i, fmt = key
      return self.fns[i](*[_rounded(x, fmt) for x in xs])

    self._jit = jax.jit(hypothesis, static_argnums=0)

  def device(self, keys: Sequence[tuple[int, str]], inputs: list) -> list:
    """The float64 hypotheses ``inputs_<fmt>`` of the ``(site index,
    format)`` keys from each key's site inputs: device arrays, one
    executable per key (dispatched back to back)."""
    with jax.enable_x64(True):
      return [self._jit(tuple(k), xs) for k, xs in zip(keys, inputs)]
