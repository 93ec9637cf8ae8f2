"""Kernel sites: discover, name and select every kernel call of a train step.

A *site* is one call of a kernel inside a traced function (typically a train
step ``(state, batch) -> (state, metrics)``): a primitive equation of the
jaxpr (``dot_general``, ``conv_general_dilated``, ``exp``, ``reduce_sum``, ...)
or a composite call marked with :func:`peat_jax.composite` (``softmax``,
``layer_norm``, ``attention``, ...). Discovery traces the function with
``jax.make_jaxpr`` and walks the closed jaxpr recursively, into nested ``jit``,
``scan``, ``cond``, ``while``, ``remat`` (``jax.checkpoint``) and custom
derivative calls.

Site names
----------
``<phase>/<path>/<kernel>:<ordinal>``, e.g. ``fwd/MLP/Linear/dot_general:0``:

* ``phase``: ``fwd`` (forward pass, including forward work recomputed by
  ``remat`` in the backward pass), ``bwd`` (the gradient computation: equations
  JAX made by transposition, and everything inside a backward container) or
  ``upd`` (non-backward work that consumes gradients: the optimizer update,
  gradient norms).
* ``path``: the chain of modules whose ``__call__`` made the call (class names,
  outermost first, taken from the Python stack at trace time: nnx, Linen and
  any class with ``__call__``; Flax's own plumbing is skipped), the Optax
  transformations (``chain/scale_by_adam``) in the update phase, and the kinds
  of enclosing composites (``.../attention/softmax``). Empty for top-level
  code.
* ``kernel``: the primitive's name or the composite's kind.
* ``ordinal``: 0, 1, ... over the sites with the same phase, path and kernel,
  in jaxpr order.

Names depend only on the traced program, so they are the same across runs and
processes. Repeated modules of one class (``Block`` x 4) share a path and are
told apart by ordinal. Under ``scan`` a site inside the body is *one* site,
called once per iteration; under ``vmap`` a site is the batched kernel.
"""

import difflib
import fnmatch
import re
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import jax
from jax._src import source_info_util
from jax.extend import core as jex_core

from peat_jax.sites import _composite
from peat_jax.sites import _recognize
from peat_jax.core import PeatError

PHASES = ("fwd", "bwd", "upd")

# Primitives that move, reshape or re-type data, or build constants and random
# bits: not numerical kernels. Listed with `include_structural=True`.
STRUCTURAL_PRIMITIVES = frozenset(
    {
        "reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose",
        "slice", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad",
        "rev", "convert_element_type", "bitcast_convert_type", "iota", "copy",
        "copy_p", "stop_gradient", "device_put", "sharding_constraint",
        "optimization_barrier", "empty", "empty2", "random_bits", "random_seed",
        "random_wrap", "random_unwrap", "random_fold_in", "random_split",
        "threefry2x32", "split", "squeeze_p", "mesh_cast", "reshard",
        "pvary", "create_token", "axis_index",
    }
)

# Containers the substitution interpreter can rebuild around a changed body.
SUPPORTED_CONSTRUCTS = frozenset(
    {"jit", "scan", "cond", "while", "remat", "custom_jvp", "custom_vjp", "composite"}
)

_CONSTRUCT_LABEL = {
    "jit": "jit",
    "pjit": "jit",
    "closed_call": "jit",
    "core_call": "jit",
    "scan": "scan",
    "cond": "cond",
    "while": "while",
    "remat2": "remat",
    "checkpoint": "remat",
    "custom_jvp_call": "custom_jvp",
    "custom_vjp_call": "custom_vjp",
    "custom_vjp_call_jaxpr": "custom_vjp",
}


class Site(NamedTuple):
  """One kernel call in a traced function.

  Attributes:
    name: stable name ``<phase>/<path>/<kernel>:<ordinal>``.
    kernel: primitive name (``"dot_general"``) or composite kind
      (``"softmax"``).
    phase: ``"fwd"``, ``"bwd"`` or ``"upd"``.
    path: module path, ``/``-separated (may be empty).
    ordinal: index among sites with the same phase, path and kernel.
    composite: whether the site is a marked composite call.
    in_shapes: shapes of the site's array inputs.
    in_dtypes: dtype names of the inputs.
    out_shapes: shapes of the outputs.
    out_dtypes: dtype names of the outputs.
    where: enclosing constructs, outermost first (``("scan", "remat")``);
      ``"composite"`` for calls inside a marked composite.
    recompute: the call is forward work recomputed by ``remat``.
    address: position of the equation in the jaxpr tree (internal; equation
      index, sub-jaxpr index, equation index, ...).
  """

  name: str
  kernel: str
  phase: str
  path: str
  ordinal: int
  composite: bool
  in_shapes: tuple
  in_dtypes: tuple
  out_shapes: tuple
  out_dtypes: tuple
  where: tuple
  recompute: bool
  address: tuple


class SiteTable(tuple):
  """A tuple of :class:`Site` in jaxpr order, with printing and counting."""

  def names(self) -> list[str]:
    """Returns the site names in order."""
    return [s.name for s in self]

  def by_name(self) -> dict[str, Site]:
    """Returns ``{name: site}``."""
    return {s.name: s for s in self}

  def counts(self) -> dict[tuple[str, str], int]:
    """Returns ``{(kernel, phase): number of sites}``."""
    out: dict[tuple[str, str], int] = {}
    for s in self:
      out[(s.kernel, s.phase)] = out.get((s.kernel, s.phase), 0) + 1
    return dict(sorted(out.items()))

  def table(self, max_rows: int | None = None) -> str:
    """Formats the sites as a fixed-width text table.

    Args:
      max_rows: print at most this many rows (all when ``None``).

    Returns:
      The table, one site per line, with a header.
    """
    rows = [("site", "kernel", "inputs", "outputs", "where")]
    for s in self[: max_rows if max_rows is not None else len(self)]:
      rows.append(
          (
              s.name,
              s.kernel + ("*" if s.composite else ""),
              _fmt_avals(s.in_shapes, s.in_dtypes),
              _fmt_avals(s.out_shapes, s.out_dtypes),
              "/".join(s.where) + (" (recompute)" if s.recompute else ""),
          )
      )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if max_rows is not None and len(self) > max_rows:
      lines.append(f"... {len(self) - max_rows} more sites")
    lines.append(f"{len(self)} sites; * = composite")
    return "\n".join(lines)

  def counts_table(self) -> str:
    """Formats site counts per kernel and phase as a text table."""
    counts = self.counts()
    kernels = sorted({k for k, _ in counts})
    rows = [("kernel", *PHASES, "total")]
    for k in kernels:
      c = [counts.get((k, p), 0) for p in PHASES]
      rows.append((k, *map(str, c), str(sum(c))))
    tot = [sum(counts.get((k, p), 0) for k in kernels) for p in PHASES]
    rows.append(("total", *map(str, tot), str(sum(tot))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    )

  def __repr__(self):
    return f"SiteTable({len(self)} sites)"


def _fmt_avals(shapes, dtypes) -> str:
  return ", ".join(
      f"{_short_dtype(d)}[{','.join(map(str, s))}]" for s, d in zip(shapes, dtypes)
  )


def _short_dtype(d: str) -> str:
  return {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
          "int32": "i32", "int64": "i64", "bool": "bool", "uint32": "u32",
          "int8": "i8", "uint8": "u8"}.get(d, d)


# ---------------------------------------------------------------------------
# Tracing


def _peat_entry(fn, args):
  """Calls ``fn(*args)``; its frame bounds the module paths of sites."""
  return fn(*args)


_ENTRY_CODE = _peat_entry.__code__


def trace(fn: Callable, *args) -> tuple[jex_core.ClosedJaxpr, Any]:
  """Traces ``fn(*args)`` to a closed jaxpr.

  Args:
    fn: the function (e.g. an un-jitted or jitted train step).
    *args: example arguments (arrays, ``jax.ShapeDtypeStruct`` or tracers).

  The standard implementations of composite kernels (``jax.nn.softmax``,
  ``nnx.LayerNorm``, ...) are recognized as composite sites while it traces
  (:mod:`peat_jax.sites._recognize`).

  Returns:
    ``(closed_jaxpr, out_shape)``, dead code removed, where ``out_shape`` is the output pytree of
    ``jax.ShapeDtypeStruct``.
  """
  with _recognize.recognizing():
    closed, out_shape = jax.make_jaxpr(lambda *a: _peat_entry(fn, a),
                                       return_shape=True)(*args)
  return _dce(closed), out_shape


def _dce(closed: jex_core.ClosedJaxpr) -> jex_core.ClosedJaxpr:
  """Drops dead equations (XLA drops them too), at every nesting level.

  Unlike ``jax``'s own DCE, surviving equations keep their signatures: a
  composite's nested ``jit`` keeps every input and output, so a kernel under
  test can be called with the marked function's full signature.
  """
  return jex_core.ClosedJaxpr(_prune(closed.jaxpr, [True] * len(closed.jaxpr.outvars)),
                              closed.consts)


def _prune(jaxpr, live_out: list[bool]):
  live = {v for v, keep in zip(jaxpr.outvars, live_out)
          if keep and not isinstance(v, jex_core.Literal)}
  kept = []
  for eqn in reversed(jaxpr.eqns):
    if not eqn.effects and not any(v in live for v in eqn.outvars):
      continue
    eqn = _prune_params(eqn)
    kept.append(eqn)
    live.update(v for v in eqn.invars if not isinstance(v, jex_core.Literal))
  kept.reverse()
  if len(kept) == len(jaxpr.eqns) and all(a is b for a, b in zip(kept, jaxpr.eqns)):
    return jaxpr
  return jaxpr.replace(eqns=kept)


def _prune_closed(c):
  new = _prune(c.jaxpr, [True] * len(c.jaxpr.outvars))
  return c if new is c.jaxpr else jex_core.ClosedJaxpr(new, c.consts)


def _prune_params(eqn):
  """Prunes the bodies of an equation's sub-jaxprs, keeping signatures."""
  p = eqn.params
  new = {}
  for key, val in p.items():
    if isinstance(val, jex_core.ClosedJaxpr):
      nv = _prune_closed(val)
    elif isinstance(val, jex_core.Jaxpr):
      nv = _prune(val, [True] * len(val.outvars))
    elif isinstance(val, tuple) and val and all(isinstance(b, jex_core.ClosedJaxpr) for b in val):
      nv = tuple(_prune_closed(b) for b in val)
    else:
      continue
    if nv is not val:
      new[key] = nv
  return eqn.replace(params={**p, **new}) if new else eqn


# ---------------------------------------------------------------------------
# Walking the jaxpr


def sub_jaxprs(eqn) -> list[tuple[Any, list]]:
  """The sub-jaxprs of an equation as ``(open jaxpr, consts)``, fixed order.

  Args:
    eqn: a jaxpr equation.

  Returns:
    A list (empty for first-order primitives); for ``cond`` one entry per
    branch, for ``while`` ``[cond, body]``.
  """
  p = eqn.params
  name = eqn.primitive.name
  if name == "cond":
    return [(b.jaxpr, b.consts) for b in p["branches"]]
  if name == "while":
    return [(p["cond_jaxpr"].jaxpr, p["cond_jaxpr"].consts),
            (p["body_jaxpr"].jaxpr, p["body_jaxpr"].consts)]
  out = []
  for j in jex_core.jaxprs_in_params(p):
    out.append((j, []))
  # Recover consts of closed jaxprs (jaxprs_in_params gives open jaxprs).
  closed = [v for v in p.values() if isinstance(v, jex_core.ClosedJaxpr)]
  if len(closed) == len(out):
    out = [(c.jaxpr, c.consts) for c in closed]
  return out


def _is_kernel_with_combiner(name: str) -> bool:
  """Primitives whose sub-jaxprs are combiners of one kernel (scatter-add)."""
  return name.startswith("scatter") or name in _COMBINER_KERNELS


_COMBINER_KERNELS = frozenset(
    {"reduce", "reduce_window", "select_and_scatter", "select_and_scatter_add", "sort",
     "argsort", "reduce_and"}
)


def construct_label(eqn) -> str:
  """Short name of the construct an equation with sub-jaxprs stands for."""
  return _CONSTRUCT_LABEL.get(eqn.primitive.name, eqn.primitive.name)


def _is_flax_plumbing(filename: str) -> bool:
  f = filename.replace("\\", "/")
  if "/flax/" not in f:
    return False
  return not ("/flax/nnx/nn/" in f or ("/flax/linen/" in f and not f.endswith(("module.py", "transforms.py"))))


class _PathCache:
  """Module paths from tracebacks, cached per traceback."""

  def __init__(self):
    self._cache: dict[Any, tuple[str, ...]] = {}

  def path(self, traceback) -> tuple[tuple[str, ...], bool]:
    """Returns ``(module path, whether Optax code made the call)``."""
    if traceback is None:
      return (), False
    try:
      return self._cache[traceback]
    except (KeyError, TypeError):
      pass
    codes, _ = traceback.raw_frames()
    comps: list[str] = []
    in_optax = False
    for code in codes:  # innermost first
      if code is _ENTRY_CODE:
        break
      fname = code.co_filename.replace("\\", "/")
      if not source_info_util.is_user_filename(fname) or _is_flax_plumbing(fname):
        continue
      q = code.co_qualname
      if "/optax/" in fname:
        in_optax = True
        if ".<locals>." in q:
          outer = q.split(".<locals>.")[0].split(".")[-1]
          if outer not in _OPTAX_WRAPPERS:
            comps.append(outer)
      elif q.endswith(".__call__") and q.count(".") >= 1:
        comps.append(q.split(".")[-2])
    comps.reverse()
    dedup = tuple(c for i, c in enumerate(comps) if i == 0 or comps[i - 1] != c)
    result = (dedup, in_optax)
    try:
      self._cache[traceback] = result
    except TypeError:
      pass
    return result


# Optax combinators that add no information to a path.
_OPTAX_WRAPPERS = frozenset({"chain", "named_chain", "with_extra_args_support", "inject_hyperparams"})


class _Ctx(NamedTuple):
  phase: str | None
  path: tuple | None  # set inside composites: the path all inner sites use
  where: tuple
  recompute: bool


def _aval_info(vs):
  shapes, dtypes = [], []
  for v in vs:
    aval = v.aval
    shapes.append(tuple(getattr(aval, "shape", ())))
    dtypes.append(str(getattr(aval, "dtype", type(aval).__name__)))
  return tuple(shapes), tuple(dtypes)


def walk(closed: jex_core.ClosedJaxpr, include_structural: bool = False) -> SiteTable:
  """Lists the kernel sites of a closed jaxpr.

  Args:
    closed: a closed jaxpr, e.g. from :func:`trace`.
    include_structural: also list data-movement primitives
      (:data:`STRUCTURAL_PRIMITIVES`).

  Returns:
    The sites, in jaxpr order.
  """
  sites: list[Site] = []
  counters: dict[tuple, int] = {}
  paths = _PathCache()

  def emit(eqn, kernel, phase, path, composite, ctx, address):
    key = (phase, path, kernel)
    ordinal = counters.get(key, 0)
    counters[key] = ordinal + 1
    prefix = f"{phase}/{'/'.join(path)}/" if path else f"{phase}/"
    ins = [v for v in eqn.invars if hasattr(v.aval, "shape")]
    in_shapes, in_dtypes = _aval_info(ins)
    out_shapes, out_dtypes = _aval_info(eqn.outvars)
    sites.append(
        Site(f"{prefix}{kernel}:{ordinal}", kernel, phase, "/".join(path), ordinal,
             composite, in_shapes, in_dtypes, out_shapes, out_dtypes, ctx.where,
             ctx.recompute, address)
    )

  def walk_jaxpr(jaxpr, ctx: _Ctx, prefix: tuple, in_taint: list[bool]) -> list[bool]:
    taint: dict[Any, bool] = {}
    for v, t in zip(jaxpr.invars, in_taint):
      taint[v] = t

    def tainted(v):
      return (not isinstance(v, jex_core.Literal)) and taint.get(v, False)

    for i, eqn in enumerate(jaxpr.eqns):
      address = prefix + (i,)
      ns = str(eqn.source_info.name_stack)
      in_t = [tainted(v) for v in eqn.invars]
      recompute = ctx.recompute or ("rematted_computation" in ns and "transpose(" not in ns)
      if recompute:
        phase = "fwd"
      elif "transpose(" in ns or ctx.phase == "bwd":
        phase = "bwd"
      else:
        phase = None
      if ctx.path is not None:
        path, in_optax = ctx.path, False
      else:
        path, in_optax = paths.path(eqn.source_info.traceback)
      if phase is None:
        phase = "upd" if (ctx.phase == "upd" or in_optax or any(in_t)) else "fwd"
      prim = eqn.primitive.name
      marker = _composite.lookup(eqn.params.get("name", "")) if prim in ("jit", "pjit") else None
      subs = [] if _is_kernel_with_combiner(prim) else sub_jaxprs(eqn)
      if marker is not None:
        kind, is_bwd, _ = marker
        if is_bwd:
          phase = "bwd"
        emit(eqn, kind, phase, path, True, ctx._replace(recompute=recompute), address)
        inner_ctx = _Ctx(phase, path + (kind,), ctx.where + ("composite",), recompute)
        (inner, _), = subs
        out_t = walk_jaxpr(inner, inner_ctx, address + (0,), in_t)
      elif subs:
        label = construct_label(eqn)
        inner_ctx = _Ctx(phase, ctx.path, ctx.where + (label,), recompute)
        out_t = []
        for j, (inner, _) in enumerate(subs):
          if len(inner.invars) == len(eqn.invars):
            inner_in = in_t
          else:
            inner_in = [any(in_t)] * len(inner.invars)
          out_t.append(walk_jaxpr(inner, inner_ctx, address + (j,), inner_in))
        if len(subs) == 1 and len(out_t[0]) == len(eqn.outvars) and label != "while":
          out_t = out_t[0]
        else:
          out_t = [any(in_t) or any(any(o) for o in out_t)] * len(eqn.outvars)
      else:
        if include_structural or prim not in STRUCTURAL_PRIMITIVES:
          emit(eqn, prim, phase, path, False, ctx._replace(recompute=recompute), address)
        out_t = [any(in_t)] * len(eqn.outvars)
      if phase in ("bwd", "upd"):
        out_t = [True] * len(eqn.outvars)
      for v, t in zip(eqn.outvars, out_t):
        taint[v] = t
    return [tainted(v) for v in jaxpr.outvars]

  walk_jaxpr(closed.jaxpr, _Ctx(None, None, (), False), (), [False] * len(closed.jaxpr.invars))
  return SiteTable(sites)


def discover_sites(fn: Callable, *args, include_structural: bool = False) -> SiteTable:
  """Lists every kernel site of ``fn(*args)``: forward, backward and update.

  >>> sites = discover_sites(task.step_fn, state, batch)
  >>> print(sites.table())
  >>> sites.counts()[("dot_general", "bwd")]

  Args:
    fn: the function to trace, typically a train step ``(state, batch) ->
      (state, metrics)`` (un-jitted or jitted).
    *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).
    include_structural: also list data-movement primitives (reshape,
      broadcast, convert, ...).

  Returns:
    A :class:`SiteTable` (a tuple of :class:`Site`) in jaxpr order.

  Raises:
    PeatError: ``fn`` is not callable.
  """
  if not callable(fn):
    raise PeatError(f"discover_sites expects a callable train step; got {type(fn).__name__}.")
  closed, _ = trace(fn, *args)
  return walk(closed, include_structural=include_structural)


# ---------------------------------------------------------------------------
# Selection


def close_matches(name: str, candidates: Iterable[str], n: int = 5) -> str:
  """Formats up to ``n`` close matches of ``name`` for an error message."""
  cands = list(dict.fromkeys(candidates))
  m = difflib.get_close_matches(name, cands, n=n, cutoff=0.4)
  if not m:
    m = cands[:n]
  return ", ".join(repr(x) for x in m)


def select_sites(
    sites: Sequence[Site],
    *,
    kernel: str | Sequence[str] | None = None,
    pattern: str | None = None,
    phase: str | Sequence[str] | None = None,
    names: Sequence[str] | None = None,
) -> SiteTable:
  """Selects sites; all given criteria must hold.

  Args:
    sites: the sites to select from (from :func:`discover_sites`).
    kernel: kernel name(s), e.g. ``"dot_general"`` or ``("softmax", "exp")``.
    pattern: ``fnmatch`` glob over site names, e.g. ``"fwd/*Attention*"``.
    phase: ``"fwd"``, ``"bwd"``, ``"upd"`` or a sequence of them.
    names: explicit site names.

  Returns:
    The selected sites, in jaxpr order.

  Raises:
    PeatError: an unknown kernel, phase or site name (the message lists close
      matches), or a pattern that matches no site.
  """
  sel = list(sites)
  if kernel is not None:
    kernels = (kernel,) if isinstance(kernel, str) else tuple(kernel)
    known = {s.kernel for s in sites}
    for k in kernels:
      if k not in known:
        raise PeatError(
            f"no site of kernel {k!r} in this step; expected one of the step's kernels, "
            f"closest: {close_matches(k, sorted(known))}. List them with discover_sites(...)"
            ".counts()."
        )
    sel = [s for s in sel if s.kernel in kernels]
  if phase is not None:
    phases = (phase,) if isinstance(phase, str) else tuple(phase)
    for p in phases:
      if p not in PHASES:
        raise PeatError(f"phase must be one of {PHASES}; got {p!r}.")
    sel = [s for s in sel if s.phase in phases]
  if pattern is not None:
    sel = [s for s in sel if fnmatch.fnmatchcase(s.name, pattern)]
    if not sel:
      raise PeatError(
          f"pattern {pattern!r} matches no site (with the other criteria); it is an "
          f"fnmatch glob over names such as {close_matches(pattern, [s.name for s in sites])}."
      )
  if names is not None:
    if isinstance(names, str):
      names = (names,)
    known = {s.name for s in sites}
    for n in names:
      if n not in known:
        raise PeatError(
            f"unknown site {n!r}; close matches: {close_matches(n, [s.name for s in sites])}. "
            "Names come from discover_sites(step, state, batch)."
        )
    wanted = set(names)
    sel = [s for s in sel if s.name in wanted]
  return SiteTable(sel)


def site_regex(pattern: str) -> re.Pattern:
  """Compiles an ``fnmatch`` glob over site names (for reuse by tools)."""
  return re.compile(fnmatch.translate(pattern))
