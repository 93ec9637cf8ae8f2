"""Composite sites of the standard implementations, without model change.

While peat_jax traces a step (:func:`peat_jax.sites.trace`: discovery,
substitution, taps), calls of these implementations become marked composite
calls (:mod:`peat_jax.sites._composite`), as if the model had used
``@peat.composite``:

| implementation | kind | a KUT receives |
| --- | --- | --- |
| ``jax.nn.softmax(x, axis)`` | ``softmax`` | ``(x)`` or ``(x, axis=a)`` |
| ``jax.nn.log_softmax(x, axis)`` | ``log_softmax`` | ``(x)`` or ``(x, axis=a)`` |
| ``jax.nn.gelu(x, approximate)`` | ``gelu`` | ``(x)`` (erf) or ``(x, approximate=True)`` (tanh) |
| ``jax.nn.silu(x)`` (also ``jax.nn.swish``, the same function) | ``silu`` | ``(x)`` |
| ``jax.nn.dot_product_attention`` (also ``nnx.MultiHeadAttention``'s; k and v may have fewer heads: grouped-query attention) | ``attention`` | ``(q, k, v[, mask], *, [bias=], [scale=], [is_causal=True])`` |
| ``nnx.LayerNorm`` | ``layer_norm`` | ``(x, scale, bias, eps)`` |
| ``nnx.RMSNorm`` | ``rms_norm`` | ``(x, scale, eps)`` |
| ``optax.softmax_cross_entropy[_with_integer_labels]`` | ``cross_entropy`` | ``(logits, labels, reduction="none")`` |

The golden kernel of such a site is the library call itself, on the same
arguments: a step traced with recognition computes what it computes
without (tests/sites/test_recognize.py compares them bitwise). A call with
options outside the table (``where=``, a mask of a layer norm, attention
with sequence lengths or a local window, several axes, ...) stays what it
is: no composite site, its primitives remain sites of their own.

Calls are routed through module attributes: while a trace runs, every
module-level name bound to one of these functions (``jax.nn.softmax``,
``flax.nnx.softmax``, a model's ``from jax.nn import gelu``) is bound to a
router, and ``nnx.LayerNorm.__call__`` / ``nnx.RMSNorm.__call__`` are
routed likewise; everything is restored when the trace ends. The router
marks the call only in a thread that runs a peat_jax trace, outside any
composite (a ``@peat.composite`` that calls ``jax.nn.softmax`` stays one
site). Not routed: a reference kept elsewhere (a default argument, a
``functools.partial``, an attribute of an object) and a function the
model jitted itself whose trace jax cached before.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.sites import _composite

_local = threading.local()  # .depth: peat traces; .off: recognition off
_lock = threading.RLock()
_installed: dict = {"count": 0, "undo": []}


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray))


def _last_axis(x, axis) -> int | None:
  """``axis`` as a negative index when it is one int axis of ``x``."""
  if isinstance(axis, (tuple, list)) and len(axis) == 1:
    axis = axis[0]
  if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
    return None
  ndim = np.ndim(x)
  if not -ndim <= int(axis) < ndim:
    return None
  return int(axis) - ndim if int(axis) >= 0 else int(axis)


# ------------------------------------------------------------- mappers
#
# A mapper gets the library call's arguments and returns None (not a site)
# or (kind, golden, args, kwargs): the KUT convention's arguments and a
# golden function of them that makes exactly the library call.


def _softmax_like(kind: str, orig: Callable):
  def mapper(x, axis=-1, where=None):
    ax = _last_axis(x, axis) if _is_array(x) else None
    if where is not None or ax is None:
      return None
    golden = lambda x, axis=-1: orig(x, axis=axis)  # noqa: E731
    return kind, golden, (x,), ({} if ax == -1 else {"axis": ax})
  return mapper


def _gelu(orig: Callable):
  def mapper(x, approximate=True):
    if not _is_array(x) or not isinstance(approximate, (bool, np.bool_)):
      return None
    golden = lambda x, approximate=False: orig(x, approximate=approximate)  # noqa: E731
    return "gelu", golden, (x,), ({"approximate": True} if approximate
                                  else {})
  return mapper


def _attention(orig: Callable):
  sig = inspect.signature(orig)

  def mapper(*args, **kwargs):
    try:
      a = sig.bind(*args, **kwargs).arguments
    except TypeError:
      return None
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    bias, mask = a.get("bias"), a.get("mask")
    scale, causal = a.get("scale"), a.get("is_causal", False)
    impl = a.get("implementation")
    if (not all(_is_array(t) and np.ndim(t) == 4 for t in (q, k, v))
        or q.shape[2] % k.shape[2] or k.shape[2] != v.shape[2]
        or any(a.get(n) is not None for n in (
            "query_seq_lengths", "key_value_seq_lengths",
            "local_window_size"))
        or a.get("return_residual", False) or impl not in (None, "xla")
        or not isinstance(causal, (bool, np.bool_))
        or (scale is not None and not isinstance(scale, (int, float)))
        or (mask is not None and not _is_array(mask))
        or (bias is not None and not _is_array(bias))):
      return None

    def golden(q, k, v, mask=None, *, bias=None, scale=None, is_causal=False):
      return orig(q, k, v, bias, mask, scale=scale, is_causal=is_causal,
                  implementation=impl)

    kw = {}
    if bias is not None:
      kw["bias"] = bias
    if scale is not None:
      kw["scale"] = float(scale)
    if causal:
      kw["is_causal"] = True
    return "attention", golden, (q, k, v) + (() if mask is None
                                             else (mask,)), kw
  return mapper


def _silu(orig: Callable):
  def mapper(x):
    if not _is_array(x):
      return None
    return "silu", lambda x: orig(x), (x,), {}  # noqa: E731
  return mapper


def _cross_entropy(orig: Callable, integer_labels: bool):
  def mapper(logits, labels, axis=-1, where=None):
    if (where is not None or not _is_array(logits) or not _is_array(labels)
        or _last_axis(logits, axis) != -1):
      return None
    is_int = jnp.issubdtype(labels.dtype, jnp.integer)
    if is_int != integer_labels:
      return None
    golden = lambda logits, labels, reduction="none": orig(logits, labels)  # noqa: E731
    return "cross_entropy", golden, (logits, labels), {"reduction": "none"}
  return mapper


def _norm(kind: str, cls, orig_call: Callable, params: tuple[str, ...]):
  """Mapper of an nnx normalization module's ``__call__``."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  def mapper(self, x, *args, mask=None, **kwargs):
    if args or kwargs or mask is not None or not _is_array(x):
      return None
    last = (-1, np.ndim(x) - 1)
    axes_ok = all(
        (ax in last) if isinstance(ax, int) else
        (isinstance(ax, (tuple, list)) and len(ax) == 1 and ax[0] in last)
        for ax in (self.reduction_axes, self.feature_axes))
    if not axes_ok or self.axis_name is not None:
      return None
    graphdef, state = nnx.split(self)
    paths = jax.tree_util.tree_flatten_with_path(state)[0]
    names = [str(getattr(p[0], "key", p[0])) for p, _ in paths]
    if len(names) != len(set(names)) or not set(names) <= set(params):
      return None  # other state (e.g. rngs): not a plain normalization
    treedef = jax.tree.structure(state)
    given = {n: leaf for n, (_, leaf) in zip(names, paths)}

    def golden(x, *ps_eps):
      values = dict(zip(params, ps_eps[:-1]))
      new = jax.tree.unflatten(treedef, [values[n] for n in names])
      return orig_call(nnx.merge(graphdef, new), x)

    values = tuple(given.get(n) for n in params)
    return kind, golden, (x, *values, float(self.epsilon)), {}

  del cls
  return mapper


# ------------------------------------------------------------- routing


def _active() -> bool:
  return (getattr(_local, "depth", 0) > 0 and not getattr(_local, "off", False)
          and not _composite.in_composite())


def _router(orig: Callable, mapper: Callable, qualname: str | None = None):
  """A function that marks the call when recognition is active."""

  @functools.wraps(orig)
  def route(*args, **kwargs):
    if _active():
      mapped = mapper(*args, **kwargs)
      if mapped is not None:
        kind, golden, margs, mkwargs = mapped
        return _composite._marked_call(kind, golden, margs, mkwargs)  # pylint: disable=protected-access
    return orig(*args, **kwargs)

  if qualname:  # the module path of sites (peat_jax.sites._discovery)
    route.__code__ = route.__code__.replace(co_qualname=qualname)
  route.peat_recognizes = orig
  return route


def _function_targets() -> list[tuple[Callable, Callable]]:
  """(original, router) of every recognized function."""
  import optax  # pylint: disable=g-import-not-at-top

  out = []
  for orig, mapper in (
      (jax.nn.softmax, _softmax_like("softmax", jax.nn.softmax)),
      (jax.nn.log_softmax, _softmax_like("log_softmax", jax.nn.log_softmax)),
      (jax.nn.gelu, _gelu(jax.nn.gelu)),
      (jax.nn.silu, _silu(jax.nn.silu)),
      (jax.nn.dot_product_attention, _attention(jax.nn.dot_product_attention)),
      (optax.softmax_cross_entropy_with_integer_labels, _cross_entropy(
          optax.softmax_cross_entropy_with_integer_labels, True)),
      (optax.softmax_cross_entropy, _cross_entropy(
          optax.softmax_cross_entropy, False))):
    out.append((orig, _router(orig, mapper)))
  return out


def _method_targets() -> list[tuple[type, Callable, Callable]]:
  """(class, original __call__, router) of every recognized module."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  out = []
  for cls, kind, params in ((nnx.LayerNorm, "layer_norm", ("scale", "bias")),
                            (nnx.RMSNorm, "rms_norm", ("scale",))):
    orig = cls.__dict__["__call__"]
    out.append((cls, orig, _router(orig, _norm(kind, cls, orig, params),
                                   f"{cls.__qualname__}.__call__")))
  return out


_TARGETS: dict = {}


def _targets():
  if not _TARGETS:
    _TARGETS["functions"] = _function_targets()
    _TARGETS["methods"] = _method_targets()
  return _TARGETS["functions"], _TARGETS["methods"]


def _install() -> None:
  functions, methods = _targets()
  routers = {id(o): (o, r) for o, r in functions}
  undo = []
  for mod in list(sys.modules.values()):
    d = getattr(mod, "__dict__", None)
    if not isinstance(d, dict) or d is globals():
      continue
    for name, value in list(d.items()):
      hit = routers.get(id(value))
      if hit is not None and hit[0] is value:
        d[name] = hit[1]
        undo.append((d, name, value, hit[1]))
  for cls, orig, router in methods:
    type.__setattr__(cls, "__call__", router)
    undo.append((cls, "__call__", orig, router))
  _installed["undo"] = undo


def _uninstall() -> None:
  for where, name, orig, router in reversed(_installed["undo"]):
    if isinstance(where, dict):
      if where.get(name) is router:
        where[name] = orig
    elif where.__dict__.get(name) is router:
      type.__setattr__(where, name, orig)
  _installed["undo"] = []


@contextlib.contextmanager
def recognizing():
  """Recognition during one peat_jax trace (nested traces share it)."""
  with _lock:
    if _installed["count"] == 0:
      _install()
    _installed["count"] += 1
  _local.depth = getattr(_local, "depth", 0) + 1
  try:
    yield
  finally:
    _local.depth -= 1
    with _lock:
      _installed["count"] -= 1
      if _installed["count"] == 0:
        _uninstall()


@contextlib.contextmanager
def recognition(enabled: bool = True):
  """Turns recognition of the standard implementations on or off.

  On by default. Inside ``with peat.sites.recognition(False):`` traces made
  in this thread (discovery, substitution, taps) see the standard
  implementations as plain primitives, as before recognition existed.

  Args:
    enabled: whether traces in this thread recognize them.

  Yields:
    None.
  """
  old = getattr(_local, "off", False)
  _local.off = not enabled
  try:
    yield
  finally:
    _local.off = old


KINDS = ("softmax", "log_softmax", "gelu", "silu", "attention", "layer_norm",
         "rms_norm", "cross_entropy")
