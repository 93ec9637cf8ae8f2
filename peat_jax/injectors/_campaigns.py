"""Injection campaigns: many seeded injections as one vmapped program,
each replayable bitwise."""

import functools
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from peat_jax.injectors import _models as md
from peat_jax.injectors import _random as rnd
from peat_jax.core import PeatError
from peat_jax.injectors._checks import (
    ERROR_MODELS, _check_array, _check_key, _check_name, _compiled, _freeze,
    _tensor_params)
from peat_jax.injectors._kernel import _is_array
from peat_jax.injectors._kernel import injecting_kernel
from peat_jax.injectors._api import inject


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
