"""An error model as a kernel under test: `injecting_kernel`."""

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.injectors import _compute as cp
from peat_jax.injectors import _models as md
from peat_jax.injectors import _params as pp
from peat_jax.injectors import _random as rnd
from peat_jax.core import PeatError
from peat_jax.injectors._checks import (
    ERROR_MODELS, _ON, _WHERE, _check_key, _check_name, _compiled, _freeze)


# ---------------------------------------------------------------------------
# As a kernel under test.


def _is_array(leaf: Any) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def _is_float(a: Any) -> bool:
  return jnp.issubdtype(jnp.result_type(a), jnp.floating)


def _zero_ct(a: Any) -> np.ndarray:
  return np.zeros(np.shape(a), jax.dtypes.float0)


def _inject_leaves(name, p, key, tree):
  """Injects into every float leaf of ``tree``, leaf i with derive(key, i)."""
  leaves, td = jax.tree_util.tree_flatten(tree)
  out = []
  for i, leaf in enumerate(leaves):
    if _is_array(leaf) and _is_float(leaf):
      md.TENSOR_MODELS[name].check(tuple(jnp.shape(leaf)),
                                   jnp.result_type(leaf), p)
      leaf = _compiled(name, _freeze(p))(rnd.derive(key, i),
                                         jnp.asarray(leaf))
    out.append(leaf)
  return jax.tree_util.tree_unflatten(td, out)


def injecting_kernel(name: str, golden_fn: Callable, *, where: str = "fwd",
                     on: str = "output", **params) -> Callable:
  """Wraps a golden kernel into a kernel under test that injects ``name``.

  The returned function has ``golden_fn``'s signature plus a required
  keyword ``inject_key`` (one PRNG key per call, so a jitted training step can
  pass a fresh key each step). It is a ``jax.custom_vjp``:

  * tensor models (``bitflip``, ``precision:bf16``, ...) inject into the
    forward output (``where="fwd"``), into the input cotangents computed by
    the golden VJP (``"bwd"``), or both; with ``on="inputs"`` they instead
    inject into the floating inputs before the golden kernel runs (e.g.
    ``precision:tf32`` on matmul operands), and the backward pass is the
    golden VJP at the injected inputs.
  * computation models (``accumulation:<fmt>``, ``reordering``,
    ``nondeterminism``) re-compute every floating dot_general/conv inside
    ``golden_fn`` (forward), inside its VJP (backward) or both.

  Non-array arguments (dimension numbers, strides, Python scalars) are static.
  The i-th floating leaf is injected with ``derive(derive(inject_key, 0), i)``
  in the forward pass and ``derive(derive(inject_key, 1), i)`` in the
  backward pass (``peat_jax.injectors._random.derive``).

  Args:
    name: an error-model name from ``ERROR_MODELS``.
    golden_fn: the trusted kernel, e.g. ``jax.lax.dot_general`` or a softmax.
    where: ``"fwd"``, ``"bwd"`` or ``"both"``.
    on: ``"output"`` or ``"inputs"`` (tensor models only; not with
      ``where="bwd"``).
    **params: the model's parameters.

  Returns:
    ``kut(*args, inject_key, **kwargs)`` computing what ``golden_fn`` computes,
    with the error injected.

  Raises:
    PeatError: unknown name, bad params, bad ``where``/``on``; at call time a
      missing or malformed ``inject_key``.

  >>> kut = injecting_kernel("accumulation:fp16", jax.lax.dot_general)
  >>> y = kut(a, b, (((1,), (0,)), ((), ())), inject_key=jax.random.key(0))
  """
  what = f"injecting_kernel({name!r})"
  _check_name(name, ERROR_MODELS, "injecting_kernel")
  if where not in _WHERE:
    raise PeatError(f"{what}: 'where' expected one of {list(_WHERE)}, got "
                    f"{where!r}.")
  if on not in _ON:
    raise PeatError(f"{what}: 'on' expected one of {list(_ON)}, got {on!r}.")
  if not callable(golden_fn):
    raise PeatError(f"{what}: golden_fn expected a callable, got "
                    f"{type(golden_fn).__name__}.")
  computation = name in cp.KERNEL_SPECS
  if computation:
    p = pp.validate(what, cp.KERNEL_SPECS[name], params)
    if on != "output":
      raise PeatError(f"{what}: 'on' expected 'output' for a model of the "
                      f"computation, got {on!r}.")
    kernel = cp.kernel_for(name, p)
  else:
    p = md.validate_tensor_params(name, params)
    if on == "inputs" and where == "bwd":
      raise PeatError(f"{what}: on='inputs' expected where='fwd' or 'both', "
                      "got where='bwd'.")
  fwd_on = where in ("fwd", "both")
  bwd_on = where in ("bwd", "both")

  def forward(key, call, dyn):
    kf = rnd.derive(key, 0)
    if computation:
      return cp.emulate(call, kernel, kf)(*dyn) if fwd_on else call(*dyn)
    if on == "inputs":
      return call(*_inject_leaves(name, p, kf, list(dyn)))
    out = call(*dyn)
    return _inject_leaves(name, p, kf, out) if fwd_on else out

  def backward(key, call, dyn, g):
    kf, kb = rnd.derive(key, 0), rnd.derive(key, 1)
    if not computation and on == "inputs":
      dyn = _inject_leaves(name, p, kf, list(dyn))
    fidx = [i for i, d in enumerate(dyn) if _is_float(d)]

    def call_f(*fl):
      full = list(dyn)
      for i, f in zip(fidx, fl):
        full[i] = f
      return call(*full)

    _, vjp_fn = jax.vjp(call_f, *[dyn[i] for i in fidx])
    if computation and bwd_on:
      res, td = jax.tree_util.tree_flatten(vjp_fn)
      cts = cp.emulate(
          lambda r, ct: jax.tree_util.tree_unflatten(td, r)(ct), kernel,
          kb)(res, g)
    else:
      cts = vjp_fn(g)
      if bwd_on:
        cts = _inject_leaves(name, p, kb, list(cts))
    out = [_zero_ct(d) for d in dyn]
    for i, c in zip(fidx, cts):
      out[i] = c
    return out

  def kut(*args, inject_key=None, **kwargs):
    if inject_key is None:
      raise PeatError(f"{what}: the kernel under test needs a keyword "
                      "'inject_key' (one PRNG key per call), got none.")
    _check_key(inject_key, what)
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    pos = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]

    def call(*dyn):
      full = list(leaves)
      for i, d in zip(pos, dyn):
        full[i] = d
      a, kw = jax.tree_util.tree_unflatten(treedef, full)
      return golden_fn(*a, **kw)

    static = (treedef, tuple((i, leaf) for i, leaf in enumerate(leaves)
                             if i not in set(pos)))
    try:
      f = cache.get(static)
    except TypeError:  # unhashable static arguments: no caching
      static, f = None, None
    if f is None:
      f = jax.jit(_custom_vjp(call))
      if static is not None and len(cache) < 64:
        cache[static] = f
    return f(inject_key, *[leaves[i] for i in pos])

  def _custom_vjp(call):
    @jax.custom_vjp
    def f(key, *dyn):
      return forward(key, call, dyn)

    def f_fwd(key, *dyn):
      return forward(key, call, dyn), (key, dyn)

    def f_bwd(res, g):
      key, dyn = res
      return (_zero_ct(key), *backward(key, call, dyn, g))

    f.defvjp(f_fwd, f_bwd)
    return f

  cache = {}

  kut.peat_injection = (name, p, where, on)
  functools.update_wrapper(kut, golden_fn, updated=())
  return kut
