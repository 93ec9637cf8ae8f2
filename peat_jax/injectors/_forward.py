"""Forward fault-injection campaigns: ``peat.forward_campaign``.

``n`` injections into a forward function ``fn(*args)``, each one fault of a
tensor error model at the output (or a weight) of one site, as one jitted
program (docs/injectors.md, "Forward campaigns"):

* the function is traced flat with every selected site marked
  (:func:`peat_jax.sites.flat_trace`); one golden evaluation computes every
  value the sites' suffixes read (their *frontier*), once per call;
* injection ``i`` has the key ``derive(key, i)``; it picks its site
  uniformly among the selected ones (stream ``SITE_STREAM`` of that key),
  then the error model picks its elements with the same key, as
  ``inject(error_model, key_i, site_output)`` would;
* where the suffix of a site is separable over the batch (checked on the
  traced equations against a one-sample trace,
  :func:`peat_jax.sites.separable`) and the model changes a few elements
  (``bitflip``, ``random_value``, ``nan``, ``zero`` elements), only the hit
  samples are recomputed from the site on, each alone; elsewhere (samples
  mix, a dense model, a weight fault) the whole batch is. Injections are
  grouped by site into chunks of a fixed size, a ``scan`` over the chunks
  runs each chunk's site (``lax.switch``), ``vmap`` over the chunk's
  injections;
* a recomputed sample (or batch row) that comes out bitwise equal to the
  same computation without the fault, in the same vectorized call, is a
  masked fault: its output is golden's own row, not a recomputation that
  may differ from it in the last bits.

Replay runs the same compiled program with the injection's key alone in a
chunk (the other chunks skip): bitwise the campaign's output.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import sites as _sites
from peat_jax.core import PeatError
from peat_jax.injectors import _models as md
from peat_jax.injectors import _random as rnd
from peat_jax.injectors import _sparse
from peat_jax.injectors._forward_chunks import Faults
from peat_jax.injectors._forward_chunks import _Program
from peat_jax.injectors._checks import (
    ERROR_MODELS, _check_key, _check_name, _tensor_params)

#: The random stream of an injection's key that chooses its site.
SITE_STREAM = 0x517E
_ONS = ("outputs", "weights")
_SAMPLE_CHUNK = 64  # injections per vectorized chunk, sample-wise suffixes
_BATCH_CHUNK = 8  # ... when a chunk recomputes whole batches


class ForwardInjection(NamedTuple):
  """One injection of a forward campaign: enough to replay it.

  Attributes:
    index: its position in the campaign.
    site: the site it went into.
    key: its raw ``uint32[2]`` key (``derive(key, index)``).
    name: the error model.
    params: the model's parameters, defaults filled in.
    on: ``"outputs"`` or ``"weights"``.
    output: ``summarize(output)``, or the function's output, with the fault.
  """

  index: int
  site: str
  key: jax.Array
  name: str
  params: Mapping[str, Any]
  on: str
  output: Any


class ForwardCampaign(NamedTuple):
  """The result of :func:`forward_campaign`.

  Attributes:
    name: the error model.
    params: its parameters, defaults filled in.
    on: ``"outputs"`` or ``"weights"``.
    sites: the selected site names, in execution order.
    modes: site -> ``"sample"`` (the hit samples recomputed alone) or
      ``"batch: <why>"`` (the whole batch recomputed).
    site_index: int ``[n]`` (NumPy): each injection's index into ``sites``.
    keys: ``uint32[n, 2]``: the injections' keys.
    outputs: the stacked ``summarize(output)`` (or outputs), leading axis n.
    golden: the function's output without a fault (the same program).
    faults: :class:`Faults` of a sparse model, else None.
    program: the compiled programs (golden values, a chunk per site).
    state: the golden values the chunks read (frontier, outputs).
    chunk: injections per chunk.
  """

  name: str
  params: Mapping[str, Any]
  on: str
  sites: tuple
  modes: Mapping[str, str]
  site_index: np.ndarray
  keys: jax.Array
  outputs: Any
  golden: Any
  faults: Faults | None
  program: Any
  state: tuple
  chunk: int

  def record(self, i: int) -> ForwardInjection:
    """The record of injection ``i``."""
    i = int(i)
    return ForwardInjection(
        i, self.sites[int(self.site_index[i])], self.keys[i], self.name,
        dict(self.params), self.on,
        jax.tree.map(lambda a: a[i], self.outputs))

  @property
  def records(self) -> tuple[ForwardInjection, ...]:
    """Every injection's record, in order."""
    return tuple(self.record(i) for i in range(len(self.site_index)))

  def replay(self, record: "ForwardInjection | int") -> Any:
    """Re-runs one injection alone; bitwise its campaign output.

    Args:
      record: a :class:`ForwardInjection` of this campaign or its index.

    Returns:
      What the campaign holds for it (``summarize(output)`` or the output).
    """
    i = record.index if isinstance(record, ForwardInjection) else int(record)
    n = len(self.site_index)
    if not 0 <= i < n:
      raise PeatError(f"replay: injection {i} expected in [0, {n})")
    keys = jnp.broadcast_to(jnp.asarray(self.keys[i]), (self.chunk, 2))
    out = self.program.chunks[int(self.site_index[i])](*self.state, keys)[0]
    return jax.tree.map(lambda a: a[0], out)


def _plan_size(n: int, nsites: int, chunk: int) -> tuple[int, int]:
  """(chunks, chunk size): room for any split of n injections by site."""
  return -(-n // chunk) + nsites - 1, chunk


def _plan(site_index: np.ndarray, keys: np.ndarray, nsites: int, chunk: int):
  """Keys by chunk, each chunk's site (-1: none) and each injection's slot."""
  n = len(site_index)
  k, c = _plan_size(n, nsites, chunk)
  kc = np.zeros((k, c, 2), np.uint32)
  sc = np.full((k,), -1, np.int32)
  order = np.zeros((n,), np.int32)
  row = 0
  for s in range(nsites):
    idx = np.nonzero(site_index == s)[0]
    for start in range(0, len(idx), c):
      part = idx[start:start + c]
      kc[row, :len(part)] = keys[part]
      kc[row, len(part):] = keys[part[0]]  # padding: a copy, dropped
      sc[row] = s
      order[part] = row * c + np.arange(len(part))
      row += 1
  return kc, sc, order


class _Site(NamedTuple):
  """One selected site, as the program computes it."""

  name: str
  sfx: Any  # Suffix in the batch trace
  target_shape: tuple
  target_dtype: Any
  mode: str  # "sample" or "batch: ..."
  sfx1: Any = None  # the Suffix in the one-sample trace ("sample" mode)
  j1: Any = None  # the one-sample flat jaxpr
  axes1: Any = None  # frontier var (batch trace) -> batch axis
  out_axes: tuple = ()  # per output: batch axis or None


def _usable(site) -> str | None:
  if len(site.out_shapes) != 1:
    return f"{len(site.out_shapes)} outputs"
  if not np.issubdtype(np.dtype(site.out_dtypes[0]), np.floating) and (
      site.out_dtypes[0] not in ("bfloat16", "float16")):
    return f"a {site.out_dtypes[0]} output"
  bad = [w for w in site.where if w in ("scan", "cond", "while")]
  if bad:
    return f"a place inside `{bad[0]}`"
  return None


def _select(table, kernel, pattern, names, what) -> list:
  sel = _sites.select_sites(table, kernel=kernel, pattern=pattern,
                            phase="fwd", names=names)
  ok = []
  for s in sel:
    why = _usable(s)
    if why is None:
      ok.append(s)
    elif names is not None:
      raise PeatError(f"{what}: site {s.name!r} has {why}; a fault goes into "
                      "one floating output of a site outside scan, cond and "
                      "while. Choose other sites.")
  if not ok:
    raise PeatError(f"{what}: no usable forward site selected (kernel="
                    f"{kernel!r}, pattern={pattern!r}, sites={names!r}); "
                    "expected at least one with one floating output")
  return ok


def _weight_var(jb, eqn_index: int, batched_in: list, name: str, what: str):
  """The weight operand of a primitive site: its largest floating input
  that depends on no batched argument."""
  taint = {v for v, b in zip(jb.invars, batched_in) if b}
  for e in jb.eqns[:eqn_index]:
    if any(_sites.is_var(v) and v in taint
           for v in e.invars):
      taint.update(e.outvars)
  cands = [v for v in jb.eqns[eqn_index].invars
           if _sites.is_var(v) and v not in taint
           and _sites.is_floating(v)]
  if not cands:
    raise PeatError(f"{what}: site {name!r} has no weight operand (a "
                    "floating input that depends on no batched argument); "
                    "on='weights' needs one, e.g. a dense or convolution "
                    "kernel")
  return max(cands, key=lambda v: math.prod(_sites.shape_of(v)))


def _one_sample(fn, args, leaves, size, names):
  """The one-sample flat trace and its correspondence, or (None, reason)."""
  batched = _sites.leading_batch(leaves, size)
  if not any(batched):
    return None, f"no argument has a leading batch axis of size {size}"
  tree = jax.tree.structure(args)
  args1 = jax.tree.unflatten(tree, _sites.one_sample(leaves, batched))
  try:
    t1 = _sites.flat_trace(fn, args1, names)
  except Exception as e:  # pylint: disable=broad-except
    return None, f"it cannot be traced with one sample ({type(e).__name__})"
  return t1, None


def _analyze(fn, args, names, on, count, what):
  """The flat trace and, per site, its suffix and how to recompute it."""
  tb = _sites.flat_trace(fn, args, names)
  jb = tb.jaxpr.jaxpr
  leaves = jax.tree.leaves(args)
  traces: dict = {}  # batch size -> (trace, corr, axes) or (None, why)
  out = []
  for name in names:
    mi = tb.marks[name]
    mark_in = jb.eqns[mi].invars[0]
    size = (_sites.shape_of(mark_in) or (0,))[0]
    if size not in traces:
      t1, why = _one_sample(fn, args, leaves, size, names) if size > 1 else (
          None, "the batch has one sample")
      corr = axes = None
      if t1 is not None:
        corr = _sites.corresponding_vars(jb, t1.jaxpr.jaxpr)
        if corr is None:
          why = "its one-sample trace has other equations"
        else:
          axes = _sites.batch_axes(corr, size)
      traces[size] = (t1 if corr is not None else None, corr, axes, why)
    t1, corr, axes, why = traces[size]
    if on == "outputs":
      sfx = _sites.suffix(jb, jb.eqns[mi].outvars[0], mi + 1)
    else:
      if tb.sites.by_name()[name].composite:
        raise PeatError(f"{what}: on='weights' injects into a weight operand "
                        f"of a primitive site; {name!r} is a composite")
      si = next(i for i in range(mi - 1, -1, -1)
                if mark_in in jb.eqns[i].outvars)
      w = _weight_var(jb, si, _sites.leading_batch(leaves, size), name, what)
      sfx = _sites.suffix(jb, w, si, only=si)
    if on == "weights":
      mode = "batch: a weight fault reaches every sample"
    elif count is None:
      mode = "batch: the model changes more than a fixed few elements"
    elif count >= size:
      mode = f"batch: {count} faults may hit every sample of {size}"
    elif t1 is None:
      mode = f"batch: {why}"
    else:
      reason = _sites.separable(jb, t1.jaxpr.jaxpr, corr, axes, sfx)
      mode = "sample" if reason is None else f"batch: {reason}"
    out_axes = tuple(None if axes is None else (
        axes.get(v) if _sites.is_var(v) else None)
                     for v in jb.outvars)
    out_axes = tuple(a if isinstance(a, int) else None for a in out_axes)
    site = _Site(name, sfx, _sites.shape_of(sfx.start),
                 sfx.start.aval.dtype, mode, out_axes=out_axes)
    if mode == "sample":
      j1 = t1.jaxpr.jaxpr
      sfx1 = _sites.Suffix(corr[sfx.start], sfx.eqns,
                           tuple(corr[v] for v in sfx.frontier), sfx.outs)
      site = site._replace(sfx1=sfx1, j1=j1, axes1={
          v: axes[v] for v in sfx.frontier})
    out.append(site)
  return tb, out


def forward_campaign(fn: Callable, args: Sequence[Any], error_model: str, *,
                     key: jax.Array, n: int, kernel: str | Sequence[str] |
                     None = None, pattern: str | None = None,
                     sites: Sequence[str] | None = None,
                     summarize: Callable[[Any], Any] | None = None,
                     on: str = "outputs", **params) -> ForwardCampaign:
  """``n`` fault injections into a forward function, as one program.

  Each injection puts one fault of ``error_model`` (with ``params``) into
  the output of one selected site of ``fn(*args)`` (``on="outputs"``) or
  into the weight operand that site reads (``on="weights"``: its largest
  floating input that depends on no batched argument), and runs the rest of
  the forward pass. The site is chosen uniformly among the selected ones,
  then the model chooses its elements as ``inject(error_model, key_i,
  target)`` would (``key_i = derive(key, i)``). Golden values are computed
  once; where the rest of the function is separable over the batch
  (checked on its equations) and the model changes a few elements, only the
  samples it hits are recomputed. ``modes`` says which way each site went.

  The batch is the leading axis of the site's output; the arguments whose
  leading dimension has that size are its batched arguments (the one-sample
  trace slices them).

  Args:
    fn: the forward function, e.g. ``lambda params, x: model.apply(...)``;
      not a train step (no gradients are taken).
    args: its arguments, a sequence of pytrees of arrays.
    error_model: a tensor error model (``peat.TENSOR_ERROR_MODELS``).
    key: one PRNG key.
    n: the number of injections.
    kernel: select sites by kernel name(s).
    pattern: select sites by an ``fnmatch`` pattern over names.
    sites: select sites by name (:func:`peat.discover_sites` of ``fn``).
    summarize: ``f(output) -> pytree``, applied to each injection's output
      inside the program (memory: n summaries instead of n outputs).
    on: ``"outputs"`` or ``"weights"``.
    **params: the error model's parameters.

  Returns:
    A :class:`ForwardCampaign`; ``.replay(i)`` re-runs injection ``i``,
    bitwise.

  Raises:
    PeatError: an unknown or computation error model, bad parameters (for
      a site's target shape too), a bad key or ``n``, no usable site, a site
      inside scan/cond/while, ``on="weights"`` at a composite or a site with
      no weight operand.
  """
  what = f"forward_campaign({error_model!r})"
  _check_name(error_model, ERROR_MODELS, "forward_campaign")
  p = _tensor_params(error_model, params, what)
  _check_key(key, what)
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise PeatError(f"{what}: 'n' expected a positive int, got {n!r}.")
  if on not in _ONS:
    raise PeatError(f"{what}: 'on' expected one of {_ONS}, got {on!r}.")
  if not callable(fn):
    raise PeatError(f"{what}: 'fn' expected a function, got "
                    f"{type(fn).__name__}.")
  if summarize is not None and not callable(summarize):
    raise PeatError(f"{what}: 'summarize' expected a function or None, got "
                    f"{type(summarize).__name__}.")
  if not isinstance(args, (tuple, list)):
    raise PeatError(f"{what}: 'args' expected a tuple of fn's arguments, "
                    f"got {type(args).__name__}.")
  args = tuple(args)
  names_given = (sites,) if isinstance(sites, str) else sites
  leaves, tree = jax.tree.flatten(args)
  try:
    cache_key = (fn, tree, tuple((tuple(np.shape(x)), str(
        getattr(x, "dtype", type(x).__name__))) for x in leaves),
                 error_model, tuple(sorted(p.items())), kernel if not
                 isinstance(kernel, list) else tuple(kernel), pattern,
                 None if names_given is None else tuple(names_given),
                 on, summarize)
    hash(cache_key)
  except TypeError:  # an unhashable function or parameter: no reuse
    cache_key = None
  built = _BUILT.get(cache_key) if cache_key is not None else None
  if built is None:
    built = _build(fn, args, error_model, p, kernel, pattern, names_given,
                   summarize, on, what)
    if cache_key is not None:
      if len(_BUILT) >= _CACHE_SIZE:
        _BUILT.pop(next(iter(_BUILT)))
      _BUILT[cache_key] = built
  names, plans, prog, chunk, count = built
  golden_outs, values = prog.golden(leaves)
  keys = rnd.derive_many(key, n)
  site_index = np.asarray(_choose_sites(keys, len(names)))
  kc, sc, order = _plan(site_index, np.asarray(keys), len(names), chunk)
  outputs, faults = prog.run(values, golden_outs, kc, sc, order)
  return ForwardCampaign(
      error_model, p, on, tuple(names), {s.name: s.mode for s in plans},
      site_index, keys, outputs,
      jax.tree.unflatten(prog.out_tree, golden_outs),
      faults if count else None, prog, (values, golden_outs), chunk)


_BUILT: dict = {}  # campaign settings -> what _build made (newest last)
_CACHE_SIZE = 16


def _build(fn, args, error_model, p, kernel, pattern, names_given, summarize,
           on, what):
  """Sites, suffixes and the compiled programs of a campaign's settings."""
  table = _sites.discover_sites(fn, *args)
  chosen = _select(table, kernel, pattern, names_given, what)
  names = [s.name for s in chosen]
  count = _sparse.sparse_count(error_model, p)
  tb, plans = _analyze(fn, args, names, on, count, what)
  for s in plans:
    md.TENSOR_MODELS[error_model].check(s.target_shape, s.target_dtype, p)
  chunk = (_SAMPLE_CHUNK if all(s.mode == "sample" for s in plans)
           else _BATCH_CHUNK)
  prog = _Program(tb, plans, error_model, p,
                  summarize if summarize is not None else _identity)
  return names, plans, prog, chunk, count


def _identity(o):
  return o


@jax.jit
def _site_draw(keys, nsites):
  return jax.vmap(lambda k: rnd.bits32(k, SITE_STREAM, ()))(keys) % nsites


def _choose_sites(keys, nsites: int):
  """Each injection's site: uniform over ``nsites`` from its key."""
  return _site_draw(keys, jnp.uint32(nsites)).astype(jnp.int32)
