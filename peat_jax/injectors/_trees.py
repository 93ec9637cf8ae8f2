"""Injectors on pytrees: parameters, gradients, optimizer state."""

import functools
import re
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from peat_jax.injectors import _models as md
from peat_jax.injectors import _random as rnd
from peat_jax.core import PeatError
from peat_jax.injectors._checks import (
    ERROR_MODELS, _SCOPES, _check_key, _check_name, _freeze, _tensor_params)
from peat_jax.injectors._kernel import _is_array
from peat_jax.injectors._kernel import _is_float


# ---------------------------------------------------------------------------
# On parameters, gradients, optimizer state.


def tree_path(path: Sequence[Any]) -> str:
  """``a/b/0/kernel`` for a pytree key path (what ``leaves`` regexes see)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _selected(tree, leaves, what):
  flat, td = jax.tree_util.tree_flatten_with_path(tree)
  if leaves is None:
    match = lambda path, leaf: True
  elif isinstance(leaves, str):
    try:
      rx = re.compile(leaves)
    except re.error as e:
      raise PeatError(f"{what}: 'leaves' expected a valid regex, got "
                      f"{leaves!r} ({e}).") from None
    match = lambda path, leaf: rx.search(path) is not None
  elif callable(leaves):
    match = leaves
  else:
    raise PeatError(f"{what}: 'leaves' expected None, a regex string or a "
                    f"predicate (path, leaf) -> bool, got "
                    f"{type(leaves).__name__}.")
  sel = [i for i, (path, leaf) in enumerate(flat)
         if _is_array(leaf) and _is_float(leaf)
         and match(tree_path(path), leaf)]
  if not sel:
    raise PeatError(f"{what}: 'leaves' selected no floating leaf; paths are "
                    f"{[tree_path(p) for p, _ in flat][:20]}.")
  return flat, td, sel


def inject_tree(name: str, key: jax.Array, tree: Any, *,
                leaves: str | Callable | None = None,
                scope: str = "one_leaf", **params) -> Any:
  """Injects ``name`` into the floating leaves of a pytree.

  The classic weight-fault campaign: parameters, gradients or optimizer state.
  With ``scope="one_leaf"`` (default) one selected leaf is drawn with
  probability proportional to its size, so ``count=1`` means one faulty
  element in the whole tree; with ``"each_leaf"`` every selected leaf gets its
  own injection (leaf i with ``derive(key, i)``).

  Args:
    name: a tensor error-model name.
    key: one PRNG key.
    tree: any pytree; non-floating leaves pass through.
    leaves: None (all floating leaves), a regex searched in the leaf's path
      string such as ``"params/Dense_0/kernel"`` (see ``tree_path``), or a
      predicate ``(path_string, leaf) -> bool``.
    scope: ``"one_leaf"`` or ``"each_leaf"``.
    **params: the model's parameters.

  Returns:
    A pytree of the same structure with the error injected.

  Raises:
    PeatError: bad name, params, scope, or a selection matching no leaf.
  """
  what = f"inject_tree({name!r})"
  _check_name(name, ERROR_MODELS, "inject_tree")
  p = _tensor_params(name, params, what)
  _check_key(key, what)
  if scope not in _SCOPES:
    raise PeatError(f"{what}: 'scope' expected one of {list(_SCOPES)}, got "
                    f"{scope!r}.")
  flat, td, sel = _selected(tree, leaves, what)
  out = [leaf for _, leaf in flat]
  chosen = [jnp.asarray(out[i]) for i in sel]
  for leaf in chosen:
    md.TENSOR_MODELS[name].check(tuple(leaf.shape), leaf.dtype, p)
  new = _tree_injector(name, _freeze(p), scope, tuple(sel))(key, chosen)
  for i, leaf in zip(sel, new):
    out[i] = leaf
  return jax.tree_util.tree_unflatten(td, out)


@functools.lru_cache(maxsize=256)
def _tree_injector(name: str, frozen: tuple, scope: str, sel: tuple
                   ) -> Callable:
  """One jitted program injecting into the selected leaves of a tree."""
  fn = md.TENSOR_MODELS[name].fn
  p = dict(frozen)

  def apply(key, leaves):
    k_leaf, k_inj = rnd.derive(key, 0), rnd.derive(key, 1)
    sizes = np.array([max(1, leaf.size) for leaf in leaves], np.float64)
    # Leaf j is chosen with probability sizes[j] / sum(sizes).
    edges = jnp.asarray(np.cumsum(sizes)[:-1] / sizes.sum(), jnp.float32)
    chosen = jnp.searchsorted(edges, rnd.uniform(k_leaf, 0, ()),
                              side="right")
    out = []
    for j, (i, leaf) in enumerate(zip(sel, leaves)):
      new = fn(rnd.derive(k_inj, i), leaf, **p)
      out.append(jnp.where(chosen == j, new, leaf) if scope == "one_leaf"
                 else new)
    return out

  return jax.jit(apply)


class InjectGradientsState(NamedTuple):
  """State of ``inject_gradients``: the number of updates seen."""

  count: jax.Array


def inject_gradients(name: str, key: jax.Array, *,
                     steps: int | Sequence[int] | None = None,
                     leaves: str | Callable | None = None,
                     scope: str = "one_leaf",
                     **params) -> optax.GradientTransformation:
  """An optax transformation that injects ``name`` into the updates it sees.

  Put it first in an ``optax.chain`` to corrupt gradients, last to corrupt
  the optimizer's updates. At update number ``count`` (0-based) in ``steps``
  it applies ``inject_tree(name, derive(key, count), updates, ...)``.

  Args:
    name: a tensor error-model name.
    key: one PRNG key.
    steps: the update numbers that are hit: an int, a sequence of ints, or
      None for every update.
    leaves: leaf selection as in ``inject_tree``.
    scope: ``"one_leaf"`` or ``"each_leaf"`` as in ``inject_tree``.
    **params: the model's parameters.

  Returns:
    An ``optax.GradientTransformation`` with state ``InjectGradientsState``.

  Raises:
    PeatError: bad name, params, key or steps.

  >>> tx = optax.chain(inject_gradients("bitflip", key, steps=3),
  ...                  optax.adam(1e-3))
  """
  what = f"inject_gradients({name!r})"
  _check_name(name, ERROR_MODELS, "inject_gradients")
  _tensor_params(name, params, what)
  _check_key(key, what)
  if scope not in _SCOPES:
    raise PeatError(f"{what}: 'scope' expected one of {list(_SCOPES)}, got "
                    f"{scope!r}.")
  if steps is not None:
    st = (steps,) if isinstance(steps, int) else steps
    if (isinstance(steps, bool) or not isinstance(st, (tuple, list))
        or not st or any(isinstance(s, bool) or not isinstance(s, int)
                         or s < 0 for s in st)):
      raise PeatError(f"{what}: 'steps' expected None, a non-negative int or "
                      f"a sequence of them, got {steps!r}.")
    steps = tuple(st)

  def init(params_):
    del params_
    return InjectGradientsState(count=jnp.zeros((), jnp.int32))

  def update(updates, state, params_=None):
    del params_
    hit = (jnp.asarray(True) if steps is None
           else jnp.isin(state.count, jnp.asarray(steps, jnp.int32)))
    new = inject_tree(name, rnd.derive(key, state.count), updates,
                      leaves=leaves, scope=scope, **params)
    updates = jax.tree_util.tree_map(
        lambda a, b: jnp.where(hit, a, b) if _is_array(b) else b, new,
        updates)
    return updates, InjectGradientsState(count=state.count + 1)

  return optax.GradientTransformation(init, update)
