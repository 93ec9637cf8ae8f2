"""One hypothesis the port probe tries: :class:`Variant`.

The grammar (``._grammar``) makes every slip a Variant: the error model it
names, its name (``peat.core.Slip.name``), what it is in words, and the
float64 output it predicts (evaluated lazily: most are never the best).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import numpy as np


class Variant(NamedTuple):
  """One hypothesis of the probe.

  Attributes:
    model: the error model it names (``parameter``, ``precision:bf16``).
    name: its name (``eps``, ``inputs_tf32_toward_zero``, ...).
    sentence: what it is, for the evidence.
    fn: ``fn() -> float64 output`` (evaluated lazily).
    estimate: the fitted constant, or None.
    extra: what the Detector's evidence takes from it (``rounding``,
      ``where``, ``category``, ``slip``).
  """

  model: str
  name: str
  sentence: str
  fn: Callable[[], Any]
  estimate: float | None = None
  extra: Mapping[str, Any] = {}


def f64(x) -> np.ndarray:
  """A host float64 copy."""
  return np.asarray(x, np.float64)
