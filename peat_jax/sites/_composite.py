"""Marker for composite kernels (softmax, layer norm, attention, GELU, ...).

Model code marks a function that implements one composite kernel with
``@peat.composite("softmax")``. The marked call stays an ordinary JAX
computation (same forward values), but it leaves two recognisable equations in
any jaxpr that contains it:

* the forward site: a nested ``jit`` equation named ``peat:<kind>#<token>``
  whose inputs are the array arguments of the call and whose outputs are the
  flattened results;
* the backward site (when the step differentiates through the call): a nested
  ``jit`` named ``peat:<kind>:bwd#<token>`` whose inputs are the same array
  arguments followed by the output cotangents, and whose outputs are the
  cotangents of the floating-point arguments.

This works through ``jax.custom_vjp``: the forward saves the call's inputs as
residuals and the backward is ``jax.vjp`` of the marked function at those
inputs. Gradients are therefore the gradients of the marked function (the
forward is recomputed inside the backward site, like ``jax.checkpoint`` of that
one call). Forward-mode differentiation (``jax.jvp``/``jax.jacfwd``) through a
marked call is not supported, as for any ``custom_vjp``.

``<token>`` is a process-local number that lets the site machinery find how to
call a kernel under test with the marked function's own signature; it never
appears in site names (see :mod:`peat_jax.sites._discovery`).

Non-array arguments (Python numbers, strings, ``None``, shapes) are static:
they are closed over, and a kernel under test receives them unchanged. Integer
and boolean array arguments (labels, masks) are inputs of the site without a
cotangent.
"""

import dataclasses
import functools
import re
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

_NAME_RE = re.compile(r"^peat:(?P<kind>[A-Za-z0-9_.\-]+)(?P<bwd>:bwd)?#(?P<token>\d+)$")
_KIND_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclasses.dataclass(frozen=True)
class CompositeCall:
  """How one marked call was made (one per distinct call signature).

  Attributes:
    kind: the composite kernel's name, e.g. ``"softmax"``.
    fn: the marked (golden) function.
    treedef: tree structure of ``(args, kwargs)`` of the call.
    leaves: the flattened ``(args, kwargs)`` with ``None`` in array positions.
    is_array: per leaf, whether it is a traced input of the site.
    is_float: per leaf, whether it is a floating-point array (has a
      cotangent).
    call_kut: ``(kut, args, kwargs) -> result``; calls a kernel under test
      with the marked function's signature.
  """

  kind: str
  fn: Callable
  treedef: Any
  leaves: tuple
  is_array: tuple
  is_float: tuple
  call_kut: Callable = None

  @property
  def calls_module(self) -> bool:
    """Whether the call is :func:`composite_call` of a Flax module (whose
    kernel under test receives the module, not plain arrays)."""
    return self.call_kut is not _default_call_kut

  def rebuild(self, arrays):
    """Returns ``(args, kwargs)`` with ``arrays`` put in the array slots."""
    it = iter(arrays)
    leaves = [next(it) if a else leaf for leaf, a in zip(self.leaves, self.is_array)]
    return jax.tree.unflatten(self.treedef, leaves)


_lock = threading.Lock()
_registry: list[CompositeCall] = []
_local = threading.local()  # .depth: marked calls being traced (per thread)


def in_composite() -> bool:
  """Whether this thread is tracing the body of a marked composite call.

  The recognition of standard implementations
  (:mod:`peat_jax.sites._recognize`) is off there: a composite's own
  ``jax.nn.softmax`` is part of it, not a site of its own.
  """
  return getattr(_local, "depth", 0) > 0


def _in_body(fn: Callable, *args, **kwargs):
  """Calls ``fn`` as (part of) a marked call's body (see in_composite)."""
  _local.depth = getattr(_local, "depth", 0) + 1
  try:
    return fn(*args, **kwargs)
  finally:
    _local.depth -= 1


def composite_of(eqn) -> "CompositeCall | None":
  """The :class:`CompositeCall` of a composite site's equation, or None.

  Args:
    eqn: a jaxpr equation (a composite site is a nested ``jit`` named by
      :func:`composite`).

  Returns:
    How the marked call was made, or None for any other equation.
  """
  found = lookup(eqn.params.get("name", "")) if "name" in eqn.params else None
  return None if found is None else found[2]


def lookup(name: str):
  """Parses a nested-jit name made by :func:`composite`.

  Args:
    name: the ``name`` parameter of a ``jit`` equation.

  Returns:
    ``(kind, is_backward, CompositeCall)`` or ``None`` if ``name`` is not a
    composite marker.
  """
  m = _NAME_RE.match(name)
  if m is None:
    return None
  token = int(m.group("token"))
  with _lock:
    if token >= len(_registry):
      return None
    call = _registry[token]
  return m.group("kind"), m.group("bwd") is not None, call


#: Tokens of the registered calls, by what identifies them apart from
#: their static leaves (kind, function, structure, slots, calling rule).
_tokens: dict[tuple, list[int]] = {}
#: Static leaves compared by value (by type and repr: -0.0 is not 0.0);
#: any other static leaf is the same only if it is the same object.
_VALUE_TYPES = (bool, int, float, complex, str, bytes, type(None), np.dtype)


def _same_leaves(a: tuple, b: tuple) -> bool:
  """Whether two calls' static leaves are the same values."""
  return len(a) == len(b) and all(
      x is y or (type(x) is type(y) and isinstance(x, _VALUE_TYPES)
                 and repr(x) == repr(y))
      for x, y in zip(a, b))


def _outer_trace():
  """The outermost jaxpr trace below the current trace, or None outside
  jit (JAX's trace stack: linearize and jaxpr traces name their parent)."""
  from jax._src import core as jcore  # pylint: disable=g-import-not-at-top
  from jax._src.interpreters import partial_eval as pe  # pylint: disable=g-import-not-at-top
  t, outer = jcore.trace_ctx.trace, None
  while t is not None:  # through linearize, batching and jaxpr traces
    if isinstance(t, pe.DynamicJaxprTrace):
      outer = t
    t = getattr(t, "parent_trace", None)
  return outer


def _occurrence(key: tuple) -> int | None:
  """How many identical calls this thread's current outermost trace has
  registered before this one (None outside jit)."""
  outer = _outer_trace()
  if outer is None:
    return None
  if getattr(_local, "outer", None) is not outer:
    _local.outer, _local.seen = outer, {}  # a new trace: count afresh
  n = _local.seen.get(key, 0)
  _local.seen[key] = n + 1
  return n


def _register(call: CompositeCall) -> int:
  """The call's token. Under jit, the n-th call of a trace that is
  identical to the n-th identical call of an earlier trace gets that
  call's token: the same step traced again names its composites alike,
  so its program (and the persistent cache's key of it) is the same,
  while distinct calls of one trace (a model's four layer norms) keep
  distinct tokens."""
  key = (call.kind, id(call.fn), call.treedef, call.is_array, call.is_float,
         id(call.call_kut))
  with _lock:
    n = _occurrence(key)
    same = [t for t in _tokens.get(key, ())
            if _same_leaves(_registry[t].leaves, call.leaves)]
    if n is not None and n < len(same):
      return same[n]
    _registry.append(call)  # holds fn and call_kut: their ids stay theirs
    _tokens.setdefault(key, []).append(len(_registry) - 1)
    return len(_registry) - 1


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _default_call_kut(kut, args, kwargs):
  return kut(*args, **kwargs)


def _marked_call(kind: str, fn: Callable, args, kwargs, call_kut=_default_call_kut):
  """Runs ``fn(*args, **kwargs)`` as a marked composite call."""
  leaves, treedef = jax.tree.flatten((args, kwargs))
  is_array = tuple(_is_array(x) for x in leaves)
  is_float = tuple(
      a and jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x, a in zip(leaves, is_array)
  )
  arrays = [x for x, a in zip(leaves, is_array) if a]
  statics = tuple(None if a else x for x, a in zip(leaves, is_array))
  call = CompositeCall(kind, fn, treedef, statics, is_array, is_float, call_kut=call_kut)
  token = _register(call)
  out_box = {}

  def fwd_arrays(*arrs):
    a, kw = call.rebuild(arrs)
    flat, out_box["treedef"] = jax.tree.flatten(_in_body(fn, *a, **kw))
    return flat

  fwd_arrays.__name__ = f"peat:{kind}#{token}"
  fwd_arrays.__qualname__ = fwd_arrays.__name__
  fwd_jit = jax.jit(fwd_arrays)

  def bwd_arrays(*arrs_and_cts):
    arrs, cts = arrs_and_cts[: len(arrays)], arrs_and_cts[len(arrays):]
    return _in_body(_vjp_floats, call, fn, arrs, cts, call_kut=None)

  bwd_arrays.__name__ = f"peat:{kind}:bwd#{token}"
  bwd_arrays.__qualname__ = bwd_arrays.__name__
  bwd_jit = jax.jit(bwd_arrays)

  @jax.custom_vjp
  def marked(*arrs):
    return fwd_jit(*arrs)

  def marked_fwd(*arrs):
    return fwd_jit(*arrs), arrs

  def marked_bwd(arrs, cts):
    float_cts = iter(bwd_jit(*arrs, *cts))
    return tuple(next(float_cts) if f else None for f, a in zip(call.is_float, call.is_array) if a)

  marked.defvjp(marked_fwd, marked_bwd)
  flat_out = marked(*arrays)
  return jax.tree.unflatten(out_box["treedef"], flat_out)


def _vjp_floats(call: CompositeCall, fn, arrs, cts, call_kut):
  """Cotangents of the float array arguments of ``fn`` (or of a KUT)."""
  arrs = list(arrs)
  float_pos = [i for i, f in enumerate(f for f, a in zip(call.is_float, call.is_array) if a) if f]

  def of_floats(*floats):
    full = list(arrs)
    for i, x in zip(float_pos, floats):
      full[i] = x
    a, kw = call.rebuild(full)
    out = fn(*a, **kw) if call_kut is None else call_kut(fn, a, kw)
    return jax.tree.leaves(out)

  _, vjp = jax.vjp(of_floats, *[arrs[i] for i in float_pos])
  return list(vjp(list(cts)))


def kut_forward(call: CompositeCall, kut: Callable, arrays) -> list:
  """Calls ``kut`` on a forward composite site's inputs.

  Args:
    call: the site's :class:`CompositeCall`.
    kut: kernel under test with the marked function's signature.
    arrays: the site's input arrays.

  Returns:
    The flattened result of the kernel under test.
  """
  a, kw = call.rebuild(arrays)
  return jax.tree.leaves(call.call_kut(kut, a, kw))


def kut_backward(call: CompositeCall, kut: Callable, arrays_and_cts) -> list:
  """The VJP of ``kut`` on a backward composite site's inputs.

  Uses the kernel under test's own backward when it is a ``jax.custom_vjp``,
  else JAX's autodiff of it.

  Args:
    call: the site's :class:`CompositeCall`.
    kut: kernel under test with the marked function's signature.
    arrays_and_cts: the backward site's inputs (arrays, then cotangents).

  Returns:
    Cotangents of the floating-point array arguments.
  """
  n = sum(call.is_array)
  return _vjp_floats(call, kut, arrays_and_cts[:n], arrays_and_cts[n:], call_kut=call.call_kut)


def composite(kind: str) -> Callable[[Callable], Callable]:
  """Marks ``fn`` as one call of the composite kernel ``kind``.

  Every call of the decorated function becomes one forward site of kernel
  ``kind`` (and one backward site where the step differentiates through it).
  A kernel under test for ``kind`` is called with the same arguments as the
  decorated function.

  >>> @composite("softmax")
  ... def softmax(x, axis=-1):
  ...   return jax.nn.softmax(x, axis=axis)

  Args:
    kind: kernel name, e.g. ``"softmax"``, ``"layer_norm"``, ``"attention"``,
      ``"gelu"``, ``"cross_entropy"``; letters, digits, ``_``, ``.``, ``-``.

  Returns:
    A decorator; the decorated function computes exactly what ``fn`` does.

  Raises:
    PeatError: ``kind`` is empty or has other characters.
  """
  _check_kind(kind)

  def decorator(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      return _marked_call(kind, fn, args, kwargs)

    wrapped.peat_composite = kind
    return wrapped

  return decorator


def _check_kind(kind):
  from peat_jax.core import PeatError  # pylint: disable=g-import-not-at-top

  if not isinstance(kind, str) or not _KIND_RE.match(kind):
    raise PeatError(
        f"composite kind must be a non-empty name of letters, digits, '_', '.' or '-'"
        f" (e.g. 'softmax'); got {kind!r}."
    )


def composite_call(kind: str, module: Any, *args, **kwargs):
  """Calls a Flax ``nnx.Module`` as one marked composite call.

  Use it where a composite kernel is an existing module, e.g. an
  ``nnx.LayerNorm``: ``y = peat.composite_call("layer_norm", self.norm, x)``
  instead of ``y = self.norm(x)``. The module's parameters become inputs of the
  site (and get gradients through it). A kernel under test for such a site is
  called as ``kut(module, *args, **kwargs)`` with a module whose parameters are
  the site's inputs.

  Args:
    kind: kernel name, as for :func:`composite`.
    module: a stateless-in-call ``nnx.Module`` (it must not update its own
      state while called, e.g. no batch statistics).
    *args: positional arguments of ``module.__call__``.
    **kwargs: keyword arguments of ``module.__call__``.

  Returns:
    ``module(*args, **kwargs)``.

  Raises:
    PeatError: ``kind`` is invalid.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  _check_kind(kind)
  graphdef, state = nnx.split(module)

  def call_module(state, *a, **kw):
    return nnx.merge(graphdef, state)(*a, **kw)

  def call_kut(kut, a, kw):
    state, *rest = a
    return kut(nnx.merge(graphdef, state), *rest, **kw)

  return _marked_call(kind, call_module, (state, *args), kwargs, call_kut=call_kut)
