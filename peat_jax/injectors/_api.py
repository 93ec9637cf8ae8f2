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

import functools
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from peat_jax.injectors import _compute as cp
from peat_jax.injectors import _formats as fm
from peat_jax.injectors import _models as md
from peat_jax.injectors import _params as pp
from peat_jax.injectors import _random as rnd
from peat_jax.core._errors import PeatError

FORMATS = tuple(sorted(fm.FORMATS))
"""Narrow formats of ``precision:<fmt>`` and ``accumulation:<fmt>``."""

TENSOR_ERROR_MODELS: tuple[str, ...] = tuple(md.TENSOR_MODELS)
"""Error models with a tensor injector (``inject``, ``inject_tree``)."""

COMPUTATION_ERROR_MODELS: tuple[str, ...] = tuple(cp.KERNEL_SPECS)
"""Error models of the computation, emulated inside dot_general/conv by
``injecting_kernel`` (``reordering`` and ``nondeterminism`` also have a tensor
form)."""

ERROR_MODELS: tuple[str, ...] = tuple(
    dict.fromkeys(TENSOR_ERROR_MODELS + COMPUTATION_ERROR_MODELS))
"""Every error-model name that has an injector."""

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


# ---------------------------------------------------------------------------
# Campaigns.


class InjectionRecord(NamedTuple):
  """Everything needed to replay one injection of a campaign bitwise.

  Attributes:
    name: the error model.
    params: all its parameters, defaults filled in.
    key: the injection's PRNG key.
    index: its position in the campaign.
  """

  name: str
  params: Mapping[str, Any]
  key: jax.Array
  index: int


class Campaign(NamedTuple):
  """N injections of one error model, run as one vmapped, jitted call.

  Attributes:
    name: the error model.
    params: its parameters, defaults filled in.
    keys: the N injection keys, raw ``uint32[N, 2]`` keys
      ``derive(key, i)``.
    outputs: the stacked results (leading axis N): injected tensors, kernel
      outputs (and input cotangents), or what ``summarize`` made of them.
    run: ``run(key)``: one injection as a jitted function, used by ``replay``.
  """

  name: str
  params: Mapping[str, Any]
  keys: jax.Array
  outputs: Any
  run: Callable

  def record(self, i: int) -> InjectionRecord:
    """The record of injection ``i``."""
    return InjectionRecord(self.name, dict(self.params), self.keys[i], int(i))

  @property
  def records(self) -> tuple[InjectionRecord, ...]:
    """All records (N small Python objects)."""
    return tuple(self.record(i) for i in range(len(self.keys)))

  def replay(self, record: "InjectionRecord | int") -> Any:
    """Re-runs one injection alone; bitwise equal to its campaign output."""
    if not isinstance(record, InjectionRecord):
      record = self.record(record)
    return self.run(record.key)


def replay(record: InjectionRecord, x: jax.Array) -> jax.Array:
  """Replays a tensor-campaign record on ``x``: ``inject`` with its key."""
  return inject(record.name, record.key, x, **record.params)


def _check_n(n, batch_size, what):
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise PeatError(f"{what}: 'n' expected a positive int, got {n!r}.")
  if batch_size is not None and (isinstance(batch_size, bool) or
                                 not isinstance(batch_size, int)
                                 or batch_size < 1):
    raise PeatError(f"{what}: 'batch_size' expected None or a positive int, "
                    f"got {batch_size!r}.")


def _batched(one: Callable, batch_size: int | None) -> Callable:
  """``one(key, operands)`` mapped over a leading axis of keys, jitted."""
  if batch_size is None:
    return jax.jit(jax.vmap(one, in_axes=(0, None)))
  return jax.jit(lambda ks, ops: jax.lax.map(lambda k: one(k, ops), ks,
                                             batch_size=batch_size))


def _identity(y):
  return y


@functools.lru_cache(maxsize=64)
def _tensor_campaign_fns(name: str, frozen: tuple, summarize: Callable,
                         batch_size: int | None) -> tuple[Callable, Callable]:
  """(batched, single) jitted programs of a tensor campaign, cached so that
  a second campaign with the same settings does not recompile."""
  fn = md.TENSOR_MODELS[name].fn
  p = dict(frozen)

  def one(k, xx):
    return summarize(fn(k, xx, **p))

  single = (_compiled(name, frozen) if summarize is _identity
            else jax.jit(one))
  return _batched(one, batch_size), single


@functools.lru_cache(maxsize=64)
def _kernel_campaign_fns(name: str, frozen: tuple, golden_fn: Callable,
                         where: str, on: str, summarize: Callable,
                         batch_size: int | None) -> tuple[Callable, Callable]:
  kut = injecting_kernel(name, golden_fn, where=where, on=on, **dict(frozen))

  def one(k, ops):
    a, ct = ops
    if where == "fwd":
      return summarize(kut(*a, inject_key=k))
    out, vjp_fn = jax.vjp(lambda *aa: kut(*aa, inject_key=k), *a)
    return summarize((out, vjp_fn(ct)))

  return _batched(one, batch_size), jax.jit(one)


def campaign(name: str, key: jax.Array, x: jax.Array, *, n: int,
             summarize: Callable[[jax.Array], Any] | None = None,
             batch_size: int | None = None, **params) -> Campaign:
  """Runs ``n`` injections of ``name`` into ``x`` as one jitted vmapped call.

  Injection i uses the raw key ``derive(key, i)``; its record
  replays it bitwise (``Campaign.replay`` or ``replay(record, x)`` when
  ``summarize`` is None).

  Args:
    name: a tensor error-model name.
    key: one PRNG key.
    x: the golden tensor (e.g. a site's output).
    n: number of injections.
    summarize: optional ``f(injected) -> pytree`` applied inside the vmapped
      call (e.g. an error statistic) so that memory is N summaries, not N
      tensors.
    batch_size: None (one vmap over all N) or a chunk size for
      ``jax.lax.map`` (bounded memory).
    **params: the model's parameters.

  Returns:
    A Campaign.

  Raises:
    PeatError: bad name, params, key, array, n or batch_size.
  """
  what = f"campaign({name!r})"
  _check_name(name, ERROR_MODELS, "campaign")
  p = _tensor_params(name, params, what)
  _check_key(key, what)
  _check_array(x, what)
  _check_n(n, batch_size, what)
  md.TENSOR_MODELS[name].check(tuple(x.shape), x.dtype, p)
  batched, single = _tensor_campaign_fns(
      name, _freeze(p), summarize if summarize is not None else _identity,
      batch_size)
  keys = rnd.derive_many(key, n)
  outputs = batched(keys, x)
  return Campaign(name, p, keys, outputs, lambda k: single(k, x))


def kernel_campaign(name: str, key: jax.Array, golden_fn: Callable,
                    args: Sequence[jax.Array], *, n: int, where: str = "fwd",
                    on: str = "output", cotangent: Any = None,
                    summarize: Callable[[Any], Any] | None = None,
                    batch_size: int | None = None, **params) -> Campaign:
  """Runs ``n`` injections through a kernel under test as one vmapped call.

  Each injection calls ``injecting_kernel(name, golden_fn, where=where,
  on=on, **params)`` on ``args``. With ``where="fwd"`` an output is the
  kernel's output; with ``"bwd"``/``"both"`` it is ``(output, input
  cotangents)`` from the VJP with ``cotangent`` (default: ones).

  Args:
    name: any name from ``ERROR_MODELS``.
    key: one PRNG key.
    golden_fn: the golden kernel; bind non-array arguments with
      ``functools.partial``.
    args: the kernel's array arguments (e.g. a site's captured inputs).
    n: number of injections.
    where: ``"fwd"``, ``"bwd"`` or ``"both"``.
    on: ``"output"`` or ``"inputs"``.
    cotangent: output cotangent for the backward pass; default ones.
    summarize: optional ``f(output) -> pytree`` applied inside the call.
    batch_size: None or a ``jax.lax.map`` chunk size.
    **params: the model's parameters.

  Returns:
    A Campaign.

  Raises:
    PeatError: bad name, params, key, arguments, n or batch_size.
  """
  what = f"kernel_campaign({name!r})"
  kut = injecting_kernel(name, golden_fn, where=where, on=on, **params)
  _, p, _, _ = kut.peat_injection  # validated, defaults filled
  _check_key(key, what)
  _check_n(n, batch_size, what)
  args = tuple(args)
  for a in args:
    if not _is_array(a):
      raise PeatError(f"{what}: 'args' expected arrays only (bind other "
                      f"arguments with functools.partial), got "
                      f"{type(a).__name__}.")
  if where != "fwd" and cotangent is None:
    shape = jax.eval_shape(golden_fn, *args)
    cotangent = jax.tree_util.tree_map(
        lambda s: jnp.ones(s.shape, s.dtype), shape)
  try:
    batched, single = _kernel_campaign_fns(
        name, _freeze(p), golden_fn, where, on,
        summarize if summarize is not None else _identity, batch_size)
  except TypeError:  # an unhashable golden_fn or summarize: no caching
    batched, single = _kernel_campaign_fns.__wrapped__(
        name, _freeze(p), golden_fn, where, on,
        summarize if summarize is not None else _identity, batch_size)
  keys = rnd.derive_many(key, n)
  ops = (args, cotangent)
  outputs = batched(keys, ops)
  return Campaign(name, p, keys, outputs, lambda k: single(k, ops))
