"""Fault injectors for every error model: on tensors, as kernels under test,
on parameter/gradient/optimizer-state trees, and as vmapped campaigns.

Every injector is pure, jit-able, vmappable over keys and deterministic given
its key. Names and parameters are checked in Python before anything is traced;
parameters are static (they may change the shapes of internal arrays), keys
and data are traced.

>>> import jax, peat_jax as peat
>>> x = jax.random.normal(jax.random.key(0), (64, 64))
>>> y = peat.inject("bitflip", jax.random.key(1), x, count=3, bits=20)
>>> int((y != x).sum())
3
"""

from typing import Any

import jax
import numpy as np

from peat_jax.injectors import _compute as cp
from peat_jax.injectors import _rounding as fm
from peat_jax.injectors import _models as md
from peat_jax.injectors import _params as pp
from peat_jax.injectors._checks import (
    ERROR_MODELS, _check_array, _check_key, _check_name, _compiled, _freeze,
    _tensor_params)
"""Narrow formats of ``precision:<fmt>`` and ``accumulation:<fmt>``."""
"""Error models with a tensor injector (``inject``, ``inject_tree``)."""
"""Error models of the computation, emulated inside dot_general/conv by
``injecting_kernel`` (``reordering`` and ``nondeterminism`` also have a tensor
form)."""
"""Every error-model name that has an injector."""


# ---------------------------------------------------------------------------
# On a tensor.


def inject(name: str, key: jax.Array, x: jax.Array, **params) -> jax.Array:
  """Injects the error model ``name`` into ``x``.

  Pure, jit-able and vmappable over ``key``; the same key gives the same bits.
  Parameters are static; see docs/error_models.md for each model's
  parameters and defaults.

  Args:
    name: an error-model name from ``TENSOR_ERROR_MODELS``, e.g. ``"bitflip"``,
      ``"precision:bf16"``.
    key: one PRNG key (``jax.random.key`` or ``jax.random.PRNGKey``).
    x: float32, bfloat16 or float16 array (float64 where x64 is enabled).
    **params: the model's parameters, e.g. ``count=2, bits=(20,)``.

  Returns:
    An array of ``x``'s shape and dtype with the error injected.

  Raises:
    PeatError: unknown name (the message lists the known ones), a model of the
      computation (use ``injecting_kernel``), unknown or out-of-range
      parameters (expected vs got), a bad key or a non-float array.

  >>> y = inject("stuck_at", jax.random.key(0), x, bit=3, value=1, share=0.5)
  """
  what = f"inject({name!r})"
  _check_name(name, ERROR_MODELS, "inject")
  p = _tensor_params(name, params, what)
  _check_key(key, what)
  _check_array(x, what)
  md.TENSOR_MODELS[name].check(tuple(x.shape), x.dtype, p)
  return _compiled(name, _freeze(p))(key, x)


def injection_params(name: str, **params) -> dict[str, Any]:
  """Validates ``params`` of ``name`` and returns them with defaults filled.

  Args:
    name: an error-model name from ``ERROR_MODELS``.
    **params: parameters as for ``inject`` or ``injecting_kernel``.

  Returns:
    Every parameter of the model, normalized (what campaign records keep).

  Raises:
    PeatError: unknown name or bad parameters.
  """
  _check_name(name, ERROR_MODELS, "injection_params")
  if name in cp.KERNEL_SPECS:
    return pp.validate(f"injecting_kernel({name!r})", cp.KERNEL_SPECS[name],
                       params)
  return md.validate_tensor_params(name, params)


def bit_probabilities(dtype, field_weights=None) -> np.ndarray:
  """Probability of each bit position being drawn by ``bitflip``.

  Args:
    dtype: float dtype of the data.
    field_weights: None (every bit equally likely, the default) or
      ``(sign, exponent, mantissa)`` weights of the three fields; bits within a
      field are equally likely.

  Returns:
    float64 array indexed by bit position (0 = last mantissa bit, the last
    entry is the sign bit), summing to 1.
  """
  fm.check_dtype(dtype, "bit_probabilities")
  if field_weights is not None:
    field_weights = md.EFFECT_SPECS["bitflip"]["field_weights"].check(
        field_weights)
  return md.bit_probabilities(dtype, field_weights)
