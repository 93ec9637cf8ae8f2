"""Checks shared by the injectors: names, keys, arrays, parameters (Python,
before tracing), and the cache of compiled tensor injectors."""

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.injectors import _compute as cp
from peat_jax.injectors import _rounding as fm
from peat_jax.injectors import _models as md
from peat_jax.core import PeatError

FORMATS = tuple(sorted(fm.FORMATS))

TENSOR_ERROR_MODELS: tuple[str, ...] = tuple(md.TENSOR_MODELS)

COMPUTATION_ERROR_MODELS: tuple[str, ...] = tuple(cp.KERNEL_SPECS)

ERROR_MODELS: tuple[str, ...] = tuple(
    dict.fromkeys(TENSOR_ERROR_MODELS + COMPUTATION_ERROR_MODELS))

_WHERE = ("fwd", "bwd", "both")
_ON = ("output", "inputs")
_SCOPES = ("one_leaf", "each_leaf")


# ---------------------------------------------------------------------------
# Checks.


def _check_name(name: Any, known: Sequence[str], what: str) -> str:
  if name == "unknown":
    raise PeatError(f"{what}: 'unknown' is the Detector's verdict for errors "
                    "no model explains; it has no injector. Known error "
                    f"models: {list(known)}.")
  if not isinstance(name, str) or name not in known:
    hint = ""
    if isinstance(name, str) and name.split(":")[0] in ("precision",
                                                         "accumulation"):
      hint = f" Formats: {list(FORMATS)}."
    raise PeatError(f"{what}: unknown error model {name!r}; expected one of "
                    f"{list(known)}.{hint}")
  return name


def _check_key(key: Any, what: str) -> None:
  dtype = getattr(key, "dtype", None)
  shape = getattr(key, "shape", None)
  if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
    if shape == ():
      return
  elif dtype == jnp.uint32 and shape == (2,):
    return
  raise PeatError(f"{what}: expected one PRNG key (jax.random.key(seed), or a "
                  f"uint32[2] jax.random.PRNGKey), got "
                  f"{type(key).__name__} of dtype {dtype} and shape {shape}.")


def _check_array(x: Any, what: str) -> None:
  if not isinstance(x, (jax.Array, np.ndarray)):
    raise PeatError(f"{what}: expected a jax.Array or numpy array, got "
                    f"{type(x).__name__}.")
  fm.check_dtype(x.dtype, what)


def _tensor_params(name: str, params: Mapping[str, Any], what: str
                   ) -> dict[str, Any]:
  if name not in md.TENSOR_MODELS:
    raise PeatError(
        f"{what}: {name!r} is an error model of the computation (a reduction "
        f"accumulated another way), not of a tensor; use "
        f"peat.injecting_kernel({name!r}, golden_fn) to emulate it inside a "
        f"dot_general/conv kernel.")
  return md.validate_tensor_params(name, params)


def _freeze(p: Mapping[str, Any]) -> tuple:
  return tuple(sorted(p.items()))


@functools.lru_cache(maxsize=None)
def _compiled(name: str, frozen: tuple) -> Callable:
  fn = md.TENSOR_MODELS[name].fn
  p = dict(frozen)
  return jax.jit(lambda key, x: fn(key, x, **p))
