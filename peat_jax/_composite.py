"""Marker for composite kernels (softmax, layer norm, attention, GELU, ...).

Model code marks a function that implements one composite kernel with
``@peat.composite("softmax")``; the site machinery recognises the marked call
in a traced training step as one site of that kernel.
"""

import functools
from typing import Callable

import jax


def composite(kind: str) -> Callable[[Callable], Callable]:
  """Marks ``fn`` as one call of the composite kernel ``kind``.

  Args:
    kind: kernel name, e.g. ``"softmax"``, ``"layer_norm"``, ``"attention"``.

  Returns:
    A decorator; the decorated function computes exactly what ``fn`` does.
  """

  def decorator(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      with jax.named_scope(f"peat:{kind}"):
        return fn(*args, **kwargs)

    wrapped.peat_composite = kind
    return wrapped

  return decorator
