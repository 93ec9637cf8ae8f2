"""The port probe's float64 references, on the device, for many sites.

For a primitive site whose signature calls for the port probe
(``peat.analyzer.needs_probe``), the probe needs the site's float64
reference and that reference on the inputs rounded to each probe format
(``peat.analyzer.probe_formats``). One x64 executable computes them for
every such site of a step; they come to the host once. The values are
those the host computes (the same float64 kernel on the same float64
inputs, the same rounding: tests/profiler/playback_fi/test_playback_records_fixed.py
compares the records byte for byte).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import core as _core
from peat_jax import injectors as _injectors


def _rounded(x, fmt: str):
  """The probe's input rounding (``analyzer.probes._ports._rounded``), traced:
  floating arrays to ``fmt`` by way of float32, as float64."""
  if x.ndim == 0 or not jnp.issubdtype(x.dtype, jnp.floating):
    return x.astype(jnp.float64) if jnp.issubdtype(
        x.dtype, jnp.floating) else x
  y = _injectors.round_nearest(x.astype(jnp.float32), _core.FORMATS[fmt])
  return y.astype(jnp.float64)


class ProbeReferences:
  """The probe's references of a Player's primitive sites, on the device."""

  def __init__(self, fns: Sequence, kernels: Sequence[str]):
    """Args: fns: per site its traceable golden kernel
    (``peat.analyzer.reference_traced``, None where there is none);
    kernels: per site its kernel name."""
    self.fns = list(fns)
    self.kernels = list(kernels)

    def refs(which, inputs):
      out = []
      for i, xs in zip(which, inputs):
        f = self.fns[i]
        hyps = {f"inputs_{fmt}": f(*[_rounded(x, fmt) for x in xs])
                for fmt in _analyzer.probe_formats(self.kernels[i])}
        out.append((f(*[x.astype(jnp.float64) for x in xs]), hyps))
      return out

    self._jit = jax.jit(refs, static_argnums=0)

  def device(self, which: tuple[int, ...], inputs: list) -> dict:
    """Site index -> (float64 reference, {hypothesis name: float64
    output}) as device arrays, for the sites ``which`` (the carried probe
    reads them there: the same executable, so the same values, as the
    whole probe's of the same sites)."""
    if not which:
      return {}
    with jax.enable_x64(True):
      return dict(zip(which, self._jit(which, inputs)))

  def __call__(self, which: tuple[int, ...], inputs: list) -> dict:
    """:meth:`device`'s arrays on the host."""
    got = jax.device_get(self.device(which, inputs))
    return {i: (np.asarray(r), {k: np.asarray(v) for k, v in h.items()})
            for i, (r, h) in got.items()}
