"""The one place the PyTorch bridge imports torch, and dtype/array conversions.

torch is optional for peat_jax (the ``torch`` extra): nothing imports it until
a bridge function needs it, and a missing install raises
:class:`TorchNotInstalledError` with the command that fixes it.

Conversions between JAX and torch go through DLPack and share memory on CPU
(float32, bfloat16 and float16 included): :func:`to_torch` and
:func:`from_torch` never copy, so a write on one side shows through on the
other (copy explicitly where that matters).
"""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.core import PeatError

__all__ = ["TorchNotInstalledError", "require_torch", "torch_dtype",
           "jax_dtype", "to_torch", "from_torch", "to_numpy"]

INSTALL_HINT = ("install the CPU build with `pip install 'peat_jax[torch]'` "
                "(torch==2.13.0)")


class TorchNotInstalledError(PeatError, ImportError):
  """torch is needed by a bridge function but cannot be imported."""


def require_torch() -> Any:
  """Imports and returns the ``torch`` module.

  Returns:
    The ``torch`` module.

  Raises:
    TorchNotInstalledError: torch is not installed (or fails to import).
  """
  try:
    return importlib.import_module("torch")
  except ImportError as err:
    raise TorchNotInstalledError(
        f"the PyTorch bridge (peat_jax.bridges) needs torch, which cannot be "
        f"imported ({err}); {INSTALL_HINT}.") from err


_NAMES = ("float32", "bfloat16", "float16", "float64", "int32", "int64",
          "int16", "int8", "uint8", "bool")


def torch_dtype(dtype: Any) -> Any:
  """The torch dtype of a JAX/NumPy dtype (no promotion, no fallback).

  Raises:
    PeatError: a dtype with no torch counterpart.
  """
  torch = require_torch()
  name = jnp.dtype(dtype).name
  if name not in _NAMES:
    raise PeatError(f"dtype {name} has no torch counterpart in the bridge; "
                    f"expected one of {', '.join(_NAMES)}")
  return getattr(torch, name)


def jax_dtype(dtype: Any) -> np.dtype:
  """The JAX dtype of a torch dtype (``torch.bfloat16`` -> ``bfloat16``).

  Raises:
    PeatError: a torch dtype the bridge does not map.
  """
  name = str(dtype).removeprefix("torch.")
  if name not in _NAMES:
    raise PeatError(f"torch dtype {dtype} has no JAX counterpart in the "
                    f"bridge; expected one of {', '.join(_NAMES)}")
  return jnp.dtype(name)


def to_torch(x: jax.Array) -> Any:
  """A torch tensor sharing ``x``'s memory (DLPack, zero copy on CPU).

  Do not write to the result: JAX arrays are immutable and the write would
  show through.

  Args:
    x: a concrete ``jax.Array`` (not a tracer).

  Returns:
    A ``torch.Tensor`` aliasing ``x``.

  Raises:
    PeatError: ``x`` is not a concrete jax.Array.
  """
  torch = require_torch()
  if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
    raise PeatError(f"to_torch expects a concrete jax.Array, got "
                    f"{type(x).__name__}; inside jit use "
                    "peat_jax.bridges.torch_op instead")
  return torch.from_dlpack(x)


def from_torch(t: Any) -> jax.Array:
  """A jax.Array sharing the memory of torch tensor ``t`` (zero copy on CPU).

  ``t`` is detached first (a tensor that requires grad cannot be exported).
  In-place writes to ``t`` afterwards would show through; pass
  ``t.clone()`` where that matters.

  Args:
    t: a CPU ``torch.Tensor``.

  Returns:
    A ``jax.Array`` aliasing ``t``.

  Raises:
    PeatError: a float64 tensor while JAX runs without x64 (JAX would
      silently downcast it to float32).
  """
  torch = require_torch()
  if not isinstance(t, torch.Tensor):
    raise PeatError(f"from_torch expects a torch.Tensor, got "
                    f"{type(t).__name__}")
  if t.dtype == torch.float64 and not jax.config.jax_enable_x64:
    raise PeatError("from_torch: a float64 tensor would be silently cast to "
                    "float32 by JAX (x64 is off); cast it explicitly with "
                    "t.float() or enable jax_enable_x64")
  return jax.dlpack.from_dlpack(t.detach())


def to_numpy(t: Any) -> np.ndarray:
  """A NumPy array of a torch tensor (bfloat16 as ``ml_dtypes.bfloat16``).

  Shares memory when ``t`` is a contiguous CPU tensor that needs no grad.
  """
  torch = require_torch()
  t = t.detach()
  if t.dtype == torch.bfloat16:
    return t.contiguous().view(torch.int16).numpy().view(jnp.bfloat16)
  return t.numpy()
