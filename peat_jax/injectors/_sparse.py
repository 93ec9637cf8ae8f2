"""The sparse form of the injectors that change a few chosen elements.

``bitflip``, ``random_value`` and ``nan`` (``count`` elements), ``zero``
with ``mode="elements"`` and ``exact`` (none) change a fixed number of
elements, chosen from the key and the array's size alone. Their sparse
form returns *where* and *what*: flat indices and the new values there,
such that ``x.reshape(-1).at[idx].set(values)`` is, bitwise,
``inject(name, key, x, **params)`` (the same draws, made by the same
functions). A forward campaign uses it to find the samples a fault hits
without writing a copy of the whole tensor.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from peat_jax.injectors import _models as md

_COUNTED = ("bitflip", "random_value", "nan")


def sparse_count(name: str, params: Mapping) -> int | None:
  """How many elements the sparse form changes, or None (no sparse form).

  Args:
    name: a tensor error model.
    params: its validated parameters.
  """
  if name in _COUNTED:
    return int(params["count"])
  if name == "zero" and params["mode"] == "elements":
    return int(params["count"])
  if name == "exact":
    return 0
  return None


def sparse_fn(name: str, params: Mapping
              ) -> Callable[[jax.Array, jax.Array], tuple[jax.Array,
                                                           jax.Array]] | None:
  """``f(key, flat) -> (idx, values)``: the sparse form, or None.

  Args:
    name: a tensor error model.
    params: its validated parameters.

  Returns:
    A traceable function of a key and the flattened golden array: the
    ``sparse_count`` flat indices (distinct) and their injected values;
    None for models that change more than a fixed few elements.
  """
  k = sparse_count(name, params)
  if k is None:
    return None
  if k == 0:
    return lambda key, flat: (jnp.zeros((0,), jnp.int32), flat[:0])
  if name == "zero":
    eff = lambda key, v: md._effect_zero(key, v)  # pylint: disable=protected-access
  else:
    ep = md._effect_params(name, params)  # pylint: disable=protected-access
    effect = md._EFFECTS[name]  # pylint: disable=protected-access
    eff = lambda key, v: effect(key, v, **ep)

  def f(key, flat):
    idx = md._choose(key, flat.size, k)  # pylint: disable=protected-access
    return idx, eff(key, flat[idx])

  return f
