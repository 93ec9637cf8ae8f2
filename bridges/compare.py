"""Layer-by-layer comparison of a torch port against its JAX model.

The interface is small so that any port plugs in (the reference models here,
MiniLM in ``bridges/torch_minilm.py``):

1. a **name mapping**: a list of :class:`Point` s, each pairing a JAX site
   (and which of its arrays: output or an input) with torch module(s) (and
   which of their tensors), plus how torch's layout maps onto JAX's;
2. a function per side producing a :class:`Named` record of named
   activations, gradients of the loss with respect to them, parameter
   gradients and the loss: :func:`jax_side` (sites and taps, and zero
   "probes" added at the sites for gradients) and :func:`torch_side`
   (forward hooks and full backward hooks);
3. :func:`compare_named`, which runs ``peat.analyze`` (torch = test, JAX =
   golden, a float64 run = reference) and ``peat.detect`` on every
   activation and gradient, and names the first divergent layer.

:func:`compare_port` does all three for a ``peat_jax.bridges.torch_models``
port; its reference is :func:`reference_side`, the JAX model run in float64
(the model's own math, so it shares no bug with the port);
:func:`compare_train_step`
plays back one training step from an Orbax checkpoint in torch (same
AdamW + warm-up + global-norm clipping math as ``models/tasks.py``) against
the JAX golden step, parameter by parameter.

Divergence: a record diverges when it is not bitwise equal, the torch side
is more than ``threshold`` times as far from the float64 reference as JAX is
(``noise_ratio``), its own relative RMS error against the reference exceeds
``floor`` (a few float32 ulps; it keeps layers JAX computes exactly, such as
an embedding lookup, from diverging on one rounding), and, when signatures
are computed, the Detector does not call it ``exact`` or ``reordering``
(a less accurate summation order within the floor is not a port bug).
Without a reference a record diverges when its diagnosis fails.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import peat_jax as peat
from peat_jax.core import PeatError

__all__ = ["Comparison", "Named", "Point", "StepComparison", "TORCH_LAYOUTS",
           "compare_named", "compare_port", "compare_train_step", "jax_side",
           "reference_side", "torch_adamw_step", "torch_side"]

#: default noise-ratio threshold (as ``peat_jax.detector.localize``).
THRESHOLD = 2.0
#: default floor of the torch side's relative RMS error vs the reference.
FLOOR = 1e-6


class Point(NamedTuple):
  """One compared tensor: a JAX site's array and the torch tensor(s) for it.

  Attributes:
    name: the layer's name in reports, e.g. ``"blocks.0.attn.qkv"``.
    jax_site: a forward site name, e.g.
      ``"fwd/Vit/Block/MultiHeadAttention/Linear/dot_general:0"``.
    torch_modules: dotted module name(s) (``module.named_modules()``);
      several are combined by ``layout`` (e.g. q, k, v -> ``concat``).
    jax_port: ``"out"`` (the site's output) or ``"in<i>"`` (its i-th array
      input).
    torch_port: ``"out"`` or ``"in<i>"`` (the module's i-th positional
      input).
    layout: how torch tensors become the JAX layout: a key of
      :data:`TORCH_LAYOUTS` or ``f(list of arrays) -> array``.
    jax_bias: a Flax parameter path added to the JAX site's output (dense
      and conv sites compute ``x @ W``; the torch module adds its bias).
  """

  name: str
  jax_site: str
  torch_modules: tuple
  jax_port: str = "out"
  torch_port: str = "out"
  layout: Any = "same"
  jax_bias: tuple | None = None


#: torch layout -> JAX layout of the values of a point's module(s).
TORCH_LAYOUTS: dict[str, Callable[[list], np.ndarray]] = {
    "same": lambda ts: ts[0],
    "concat": lambda ts: np.concatenate(ts, axis=-1),
    "nchw_nhwc": lambda ts: ts[0].transpose(0, 2, 3, 1),
    "bhtd_bthd": lambda ts: ts[0].transpose(0, 2, 1, 3),
}


class Named(NamedTuple):
  """What one side computed, by point name.

  Attributes:
    activations: ``{point: array}`` in the JAX layout.
    gradients: ``{point: d loss / d activation}`` (points whose gradient a
      side cannot see, e.g. a torch module input that needs no grad, are
      absent).
    param_grads: ``{"a/b/kernel": gradient}`` in the Flax layout.
    loss: the loss value.
    context: ``{point: {"kernel", "reduction"}}`` from the JAX sites (for
      ``peat.detect``); empty on the torch side.
  """

  activations: dict
  gradients: dict
  param_grads: dict
  loss: float
  context: dict


# ------------------------------------------------------------- JAX side


def _port_index(port: str) -> int | None:
  if port == "out":
    return None
  if port.startswith("in") and port[2:].isdigit():
    return int(port[2:])
  raise PeatError(f"port {port!r}: expected 'out' or 'in<i>' (e.g. 'in0')")


def _eqn_at(jaxpr, address: tuple):
  eqn = jaxpr.eqns[address[0]]
  rest = address[1:]
  while rest:
    sub, _ = peat.sites.sub_jaxprs(eqn)[rest[0]]
    eqn = sub.eqns[rest[1]]
    rest = rest[2:]
  return eqn


def _golden_of(closed, site: peat.Site) -> Callable:
  """``f(args, kwargs)`` computing a site's golden kernel (KUT signature)."""
  eqn = _eqn_at(closed.jaxpr, site.address)
  if site.composite:
    call = peat.sites.composite_of(eqn)
    if call.calls_module:
      raise PeatError(f"site {site.name!r} is a composite_call of a module; "
                      "compare a site of a marked function instead")
    return lambda args, kwargs: call.fn(*args, **kwargs)
  prim = eqn.primitive
  return lambda args, kwargs: prim.bind(*args, **kwargs)


def _probe_kut(golden: Callable, probes_in: dict, probe_out):
  """A KUT = golden kernel with zero probes added to inputs and output."""

  def kut(*args, **kwargs):
    leaves, tree = jax.tree.flatten((args, kwargs))
    arr = [i for i, x in enumerate(leaves)
           if isinstance(x, (jax.Array, np.ndarray, np.generic))]
    for k, p in probes_in.items():
      leaves[arr[k]] = leaves[arr[k]] + p
    a, kw = jax.tree.unflatten(tree, leaves)
    out = golden(a, kw)
    if probe_out is not None:
      if isinstance(out, (list, tuple)):
        out = type(out)([out[0] + probe_out, *out[1:]])
      else:
        out = out + probe_out
    return out

  return kut


def _site_context(site: peat.Site) -> dict:
  ins = site.in_shapes
  if site.kernel == "dot_general" and len(ins) > 1 and len(ins[1]) == 2:
    red = ins[1][0]
  elif site.kernel == "conv_general_dilated" and len(ins) > 1:
    red = int(np.prod(ins[1][:-1]))
  else:
    red = ins[0][-1] if ins and ins[0] else 1
  return {"kernel": site.kernel, "reduction": int(red)}


def _get_path(tree: Mapping, path: tuple):
  node = tree
  for k in path:
    try:
      node = node[k]
    except (KeyError, IndexError, TypeError) as err:
      raise PeatError(f"parameter path {path} not found (at {k!r})") from err
  return node


def _flat_params(tree: Mapping, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    key = f"{prefix}/{k}" if prefix else str(k)
    if isinstance(v, Mapping):
      out.update(_flat_params(v, key))
    else:
      out[key] = np.asarray(v)
  return out


def jax_side(loss_fn: Callable, params: Any, batch: Any,
             points: Sequence[Point]) -> Named:
  """Named activations and gradients of a JAX loss, from its sites.

  Activations come from ``peat.tap`` (the golden kernel's output or input at
  each point's site, plus ``jax_bias``); gradients from zero probes added
  at the sites (``peat.substitute`` with the golden kernel + probe) and
  ``jax.grad`` with respect to the probes: the gradient of the loss with
  respect to that array through that site.

  Args:
    loss_fn: ``(params, batch) -> scalar loss`` (the model's forward and
      loss, e.g. ``Port.jax_loss``).
    params: the parameters (a nested dict).
    batch: the batch.
    points: the name mapping.

  Returns:
    A :class:`Named`.

  Raises:
    PeatError: a point's site that does not exist (with close matches) or
      a bad port.
  """
  closed, _ = peat.sites.trace(loss_fn, params, batch)
  table = peat.sites.walk(closed)
  by = table.by_name()
  missing = [p.jax_site for p in points if p.jax_site not in by]
  if missing:
    raise PeatError(
        f"JAX sites of the name mapping not found: {missing}; close "
        f"matches: {peat.sites.close_matches(missing[0], by)}. Fix the mapping "
        "(peat.discover_sites(loss_fn, params, batch).table() lists them)")
  names = tuple(dict.fromkeys(p.jax_site for p in points))
  tapped = jax.jit(peat.tap(loss_fn, peat.Substitution(None, sites=names)))
  loss, taps = tapped(params, batch)

  acts, shapes, context = {}, {}, {}
  for p in points:
    tp = taps[p.jax_site]
    i = _port_index(p.jax_port)
    gold = tp.golden[0] if isinstance(tp.golden, tuple) else tp.golden
    val = gold if i is None else tp.inputs[i]
    shapes[p.name] = jax.ShapeDtypeStruct(val.shape, val.dtype)
    if p.jax_bias is not None:
      val = val + _get_path(params, p.jax_bias)
    acts[p.name] = np.asarray(val)
    context[p.name] = _site_context(by[p.jax_site])

  goldens = {n: _golden_of(closed, by[n]) for n in names}

  def probed(probes):
    subs = []
    for n in names:
      ins = {_port_index(p.jax_port): probes[p.name] for p in points
             if p.jax_site == n and p.jax_port != "out"}
      outs = [probes[p.name] for p in points
              if p.jax_site == n and p.jax_port == "out"]
      out = sum(outs[1:], outs[0]) if outs else None
      subs.append(peat.Substitution(_probe_kut(goldens[n], ins, out),
                                    sites=(n,)))
    return peat.substitute(loss_fn, *subs)(params, batch)

  zeros = {k: jnp.zeros(s.shape, s.dtype) for k, s in shapes.items()}
  grads = jax.jit(jax.grad(probed))(zeros)
  pgrads = jax.jit(jax.grad(loss_fn))(params, batch)
  return Named(acts, {k: np.asarray(v) for k, v in grads.items()},
               _flat_params(pgrads), float(loss), context)


# ----------------------------------------------------------- torch side


def _torch_layout(p: Point) -> Callable:
  if callable(p.layout):
    return p.layout
  if p.layout not in TORCH_LAYOUTS:
    raise PeatError(f"point {p.name!r}: unknown layout {p.layout!r}; "
                    f"expected one of {sorted(TORCH_LAYOUTS)} or a callable")
  return TORCH_LAYOUTS[p.layout]


def torch_side(module: Any, loss_fn: Callable, batch: Any,
               points: Sequence[Point],
               param_names: Callable[[dict], dict] | None = None) -> Named:
  """Named activations and gradients of a torch loss, from module hooks.

  A forward hook on each point's module(s) keeps the output or input
  tensor; a full backward hook keeps ``grad_output`` / ``grad_input``
  (the gradient through that module alone, as the JAX probes give).

  Args:
    module: the torch module.
    loss_fn: ``(module, batch) -> scalar torch loss``.
    batch: the batch.
    points: the name mapping.
    param_names: maps ``{torch parameter name: gradient}`` to the Flax
      names (e.g. through a weight map); default keeps torch names.

  Returns:
    A :class:`Named` (``context`` empty).

  Raises:
    PeatError: a module of the mapping that the torch model lacks.
  """
  from peat_jax.bridges._torch import require_torch, to_numpy
  torch = require_torch()
  mods = dict(module.named_modules())
  wanted = list(dict.fromkeys(m for p in points for m in p.torch_modules))
  missing = [m for m in wanted if m not in mods]
  if missing:
    raise PeatError(f"torch modules of the name mapping not found: "
                    f"{missing}; the model has {sorted(k for k in mods if k)}")
  seen: dict = {}
  handles = []

  def fwd_hook(name):
    def hook(mod, inputs, output):
      del mod
      seen[(name, "out", "act")] = output.detach().clone()
      for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
          seen[(name, f"in{i}", "act")] = x.detach().clone()
    return hook

  def bwd_hook(name):
    def hook(mod, grad_input, grad_output):
      del mod
      seen[(name, "out", "grad")] = grad_output[0].detach().clone()
      for i, g in enumerate(grad_input):
        if g is not None:
          seen[(name, f"in{i}", "grad")] = g.detach().clone()
    return hook

  for m in wanted:
    handles.append(mods[m].register_forward_hook(fwd_hook(m)))
    handles.append(mods[m].register_full_backward_hook(bwd_hook(m)))
  try:
    module.zero_grad(set_to_none=True)
    loss = loss_fn(module, batch)
    with warnings.catch_warnings():
      # The first layer's input needs no grad: its hook sees grad_output only.
      warnings.filterwarnings("ignore", message="Full backward hook is firing")
      loss.backward()
  finally:
    for h in handles:
      h.remove()

  acts, grads = {}, {}
  for p in points:
    lay = _torch_layout(p)
    a = [seen.get((m, p.torch_port, "act")) for m in p.torch_modules]
    if any(x is None for x in a):
      raise PeatError(f"point {p.name!r}: torch module(s) {p.torch_modules} "
                      f"have no {p.torch_port!r} tensor (not called, or no "
                      "such input)")
    acts[p.name] = np.ascontiguousarray(lay([to_numpy(x) for x in a]))
    g = [seen.get((m, p.torch_port, "grad")) for m in p.torch_modules]
    if all(x is not None for x in g):
      grads[p.name] = np.ascontiguousarray(lay([to_numpy(x) for x in g]))
  pg = {n: prm.grad for n, prm in module.named_parameters()
        if prm.grad is not None}
  if param_names is not None:
    pg = param_names(pg)
  pg = {k: (v if isinstance(v, np.ndarray) else to_numpy(v))
        for k, v in pg.items()}
  return Named(acts, grads, pg, float(loss.detach()), {})


# ------------------------------------------------------------- compare


class Comparison(NamedTuple):
  """Result of :func:`compare_named`.

  Attributes:
    rows: one dict per (point, ``what``) in forward order, ``what`` one of
      ``activation``, ``gradient``, ``param_grad``: shapes, ``max_rel``
      (max |torch - jax| / max |jax|), ``rms_rel``, errors of each side
      against the reference (``jax_ref_max_rel``, ``jax_ref_rms_rel``,
      ``torch_ref_max_rel``, ``torch_ref_rms_rel``), ``noise_ratio``, the
      diagnosis (``model``, ``verdict``, ``confidence``, ``evidence``),
      ``diverged``, and ``reference_dtype`` (not ``float64`` where the
      reference model computed that array in a narrower dtype, e.g. the
      output of an ``nnx.Embed``, whose compute dtype is fixed when the
      model is built; JAX then often equals the reference and the noise
      ratio is meaningless).
    first_divergent: ``{"activation": row or None, "gradient": ...,
      "param_grad": ...}``; activations in forward order, gradients and
      parameter gradients in backward order (the last layer first).
    loss: ``{"jax", "torch", "reference"}``.
  """

  rows: list
  first_divergent: dict
  loss: dict

  def table(self, what: str | None = None) -> str:
    """A fixed-width text table of the rows (optionally of one ``what``)."""
    rows = [r for r in self.rows if what is None or r["what"] == what]
    w = max([len(r["name"]) for r in rows] + [5])
    head = (f"{'layer':<{w}}  {'what':<10} {'max_rel':>9} {'rms_rel':>9} "
            f"{'jax_ref':>9} {'torch_ref':>9} {'noise':>7}  model")
    lines = [head]
    for r in rows:
      nr = r["noise_ratio"]
      lines.append(
          f"{r['name']:<{w}}  {r['what']:<10} {r['max_rel']:9.2e} "
          f"{r['rms_rel']:9.2e} {r['jax_ref_rms_rel']:9.2e} "
          f"{r['torch_ref_rms_rel']:9.2e} {nr:7.3g}  {r['model'] or '-'}"
          + ("  <- diverged" if r["diverged"] else "")
          + (f"  (reference is {r['reference_dtype']})"
             if r.get("reference_dtype") not in (None, "float64") else ""))
    return "\n".join(lines)


def _rel(num: float, den: float) -> float:
  if den == 0.0:
    return 0.0 if num == 0.0 else math.inf
  return num / den


def _rms(x: np.ndarray) -> float:
  return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


def _absmax(x: np.ndarray) -> float:
  return float(np.max(np.abs(x))) if x.size else 0.0


def _row(name: str, what: str, test, gold, ref, context, *, threshold: float,
         floor: float, signatures: bool) -> dict:
  """One compared array: errors in float64 NumPy, signature and diagnosis."""
  test, gold = np.asarray(test), np.asarray(gold)
  if test.shape != gold.shape or test.dtype != gold.dtype:
    raise PeatError(
        f"{what} {name!r}: torch gives {test.dtype}{list(test.shape)}, JAX "
        f"{gold.dtype}{list(gold.shape)}; expected equal shapes and dtypes "
        "(fix the point's layout; the comparison never casts)")
  ref_dtype = None
  if ref is not None:
    ref_dtype = str(np.asarray(ref).dtype)
    ref = np.asarray(ref, np.float64)
    if ref.shape != gold.shape:
      raise PeatError(f"{what} {name!r}: reference shape {ref.shape} != "
                      f"{gold.shape}")
  t64, g64 = test.astype(np.float64), gold.astype(np.float64)
  d = t64 - g64
  row = {
      "name": name, "what": what, "shape": list(gold.shape),
      "dtype": str(gold.dtype), "reference_dtype": ref_dtype,
      "bit_equal": bool(np.array_equal(test.view(np.uint8),
                                       gold.view(np.uint8))),
      "max_rel": _rel(_absmax(d), _absmax(g64)),
      "rms_rel": _rel(_rms(d), _rms(g64)),
      "model": None, "verdict": None, "confidence": math.nan,
      "evidence": None, "signature": None,
  }
  if ref is not None:
    rmax, rrms = _absmax(ref), _rms(ref)
    et, eg = t64 - ref, g64 - ref
    row.update(jax_ref_max_rel=_rel(_absmax(eg), rmax),
               jax_ref_rms_rel=_rel(_rms(eg), rrms),
               torch_ref_max_rel=_rel(_absmax(et), rmax),
               torch_ref_rms_rel=_rel(_rms(et), rrms),
               noise_ratio=(1.0 if _rms(et) == _rms(eg) == 0.0
                            else _rel(_rms(et), _rms(eg))))
  else:
    row.update(jax_ref_max_rel=math.nan, jax_ref_rms_rel=math.nan,
               torch_ref_max_rel=math.nan, torch_ref_rms_rel=math.nan,
               noise_ratio=math.nan)
  if signatures:
    t2 = test.reshape(1, -1) if test.ndim < 2 else test
    g2 = gold.reshape(t2.shape)
    sig = peat.analyze(t2, g2, None if ref is None else ref.reshape(t2.shape))
    diag = peat.detect(sig, context=context)
    row.update(model=diag.model, verdict=diag.verdict,
               confidence=float(diag.confidence), evidence=diag.evidence,
               signature=peat.profiler.signature_record(sig))
  if row["bit_equal"]:
    row["diverged"] = False
  elif ref is not None:
    nr = row["noise_ratio"]
    row["diverged"] = bool(
        nr > threshold and row["torch_ref_rms_rel"] > floor
        and row["model"] not in ("exact", "reordering"))
  elif signatures:
    row["diverged"] = bool(row["verdict"] == "fail")
  else:
    row["diverged"] = None
  return row


WHATS = ("activation", "gradient", "param_grad")


def compare_named(test: Named, golden: Named, reference: Named | None,
                  points: Sequence[Point], *, threshold: float = THRESHOLD,
                  floor: float = FLOOR, signatures: bool = True,
                  what: Sequence[str] = WHATS,
                  param_order: Sequence[str] | None = None) -> Comparison:
  """Compares a torch side (test) with a JAX side (golden), layer by layer.

  Args:
    test: the torch side (:func:`torch_side`).
    golden: the JAX side (:func:`jax_side`).
    reference: a float64 side (e.g. the torch port in float64), or None.
    points: the name mapping, forward order.
    threshold: noise-ratio threshold of divergence.
    floor: minimum relative RMS error of torch vs the reference for a
      divergence.
    signatures: also run ``peat.analyze`` and ``peat.detect`` per row
      (one XLA compilation per distinct shape: seconds each on a CPU);
      False gives the NumPy error columns only.
    what: which of ``activation``, ``gradient``, ``param_grad`` to compare.
    param_order: parameter names in forward order (default: the JAX
      side's order); parameter gradients are searched for the first
      divergence in reverse (backward) order, like activation gradients.

  Returns:
    A :class:`Comparison`.

  Raises:
    PeatError: a point missing on one side, arrays of different shapes or
      dtypes, or an unknown ``what``.
  """
  bad = [w for w in what if w not in WHATS]
  if bad:
    raise PeatError(f"what={bad}: expected a subset of {WHATS}")
  rows = []
  for kind, t, g, r, names in (
      ("activation", test.activations, golden.activations,
       reference.activations if reference else None, [p.name for p in points]),
      ("gradient", test.gradients, golden.gradients,
       reference.gradients if reference else None,
       [p.name for p in points if p.name in test.gradients]),
      ("param_grad", test.param_grads, golden.param_grads,
       reference.param_grads if reference else None,
       list(param_order or golden.param_grads))):
    if kind not in what:
      continue
    for n in names:
      if n not in t or n not in g:
        raise PeatError(f"{kind} {n!r} is missing on the "
                        f"{'torch' if n not in t else 'JAX'} side; both "
                        "sides must produce every point")
      ref = None if r is None else r.get(n)
      if r is not None and ref is None:
        raise PeatError(f"{kind} {n!r} is missing in the reference")
      ctx = golden.context.get(n) if kind == "activation" else None
      rows.append(_row(n, kind, t[n], g[n], ref, ctx, threshold=threshold,
                       floor=floor, signatures=signatures))
  first = {}
  for kind in WHATS:
    rs = [r for r in rows if r["what"] == kind]
    if kind in ("gradient", "param_grad"):
      rs = rs[::-1]  # backward order
    first[kind] = next((r for r in rs if r["diverged"]), None)
  loss = {"jax": golden.loss, "torch": test.loss,
          "reference": reference.loss if reference else math.nan}
  return Comparison(rows, first, loss)


# ------------------------------------------------------------ ports


def _to_f64(tree: Any) -> Any:
  """float64 copies of the float leaves of a pytree (exact), others as is."""
  def f(x):
    a = np.asarray(x)
    return a.astype(np.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a
  return jax.tree.map(f, tree)


def reference_side(loss_fn: Callable, params: Any, batch: Any,
                   points: Sequence[Point]) -> Named:
  """:func:`jax_side` of the JAX model in float64: the reference.

  The parameters and the float arrays of the batch are cast to float64
  (exactly) and the model runs with x64 enabled in a scope
  (``jax.enable_x64``); the caller's config is untouched. The reference is
  the model's own math, so it shares no bug with a torch port.
  """
  with jax.enable_x64(True):
    return jax_side(loss_fn, _to_f64(params), _to_f64(batch), points)


def compare_port(port: Any, params: Any, batch: Any, *,
                 threshold: float = THRESHOLD, floor: float = FLOOR,
                 signatures: bool = True,
                 what: Sequence[str] = WHATS) -> Comparison:
  """Layer-by-layer comparison of a torch port with its JAX model.

  Loads ``params`` into the port (float32, checked), runs :func:`torch_side`
  on it, :func:`jax_side` on ``port.jax_loss`` (the golden) and
  :func:`reference_side` (the JAX model in float64, the reference), and
  compares them with :func:`compare_named`.

  Args:
    port: a ``peat_jax.bridges.torch_models.Port`` (built from a task, so
      ``jax_loss`` is set).
    params: Flax parameters (e.g. restored from an Orbax checkpoint).
    batch: one batch of the task.
    threshold, floor, signatures, what: see :func:`compare_named`.

  Returns:
    A :class:`Comparison`.

  Raises:
    PeatError: a port without ``jax_loss``, or any mapping problem.
  """
  from peat_jax.bridges import torch_models
  if port.jax_loss is None:
    raise PeatError("the port has no JAX loss; build it from a task "
                    "(build_port(task)), not from a config")
  torch_models.load_flax_params(port.module, params, port.weight_map)
  names = lambda g: _flat_params(torch_models.torch_to_flax(
      g, port.weight_map))
  test = torch_side(port.module, port.loss, batch, port.points, names)
  golden = jax_side(port.jax_loss, params, batch, port.points)
  ref = reference_side(port.jax_loss, params, batch, port.points)
  order = ["/".join(str(x) for x in m.flax) for m in port.weight_map]
  return compare_named(test, golden, ref, port.points, threshold=threshold,
                       floor=floor, signatures=signatures, what=what,
                       param_order=order)


# -------------------------------------------------------- train step


class StepComparison(NamedTuple):
  """One training step in torch vs the JAX golden step.

  Attributes:
    step: the checkpoint step played back.
    rows: per Flax parameter (forward order) and ``what`` in ``grad``,
      ``mu``, ``nu``, ``update``, ``param``: as :class:`Comparison` rows.
    first_divergent: ``{what: first diverged row or None}``.
    scalars: ``{"loss", "grad_norm", "lr"}`` -> ``{"jax", "torch",
      "reference"}``.
  """

  step: int
  rows: list
  first_divergent: dict
  scalars: dict

  def table(self, what: str | None = None) -> str:
    """A text table like :meth:`Comparison.table`."""
    return Comparison(self.rows, {}, {}).table(what)


def _opt_parts(opt_state):
  import optax
  adam = sched = None
  for leaf in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(
      x, (optax.ScaleByAdamState, optax.ScaleByScheduleState))):
    if isinstance(leaf, optax.ScaleByAdamState):
      adam = leaf
    elif isinstance(leaf, optax.ScaleByScheduleState):
      sched = leaf
  if adam is None or sched is None:
    raise PeatError("the optimizer state is not the models/tasks.py AdamW "
                    "chain (ScaleByAdamState and ScaleByScheduleState "
                    "expected); only that optimizer is played back in torch")
  return adam, sched


def torch_adamw_step(params: dict, grads: dict, mu: dict, nu: dict,
                     count: int, sched_count: int, config: Mapping, *,
                     b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-8) -> tuple[dict, dict, dict, dict]:
  """One ``models/tasks.py`` optimizer step in torch (optax's math).

  ``clip_by_global_norm(clip)`` then ``adamw(schedule, weight_decay)`` with
  the linear warm-up schedule, term by term as optax computes it:
  ``g <- g if |g| < clip else g / |g| * clip``; ``mu <- (1-b1) g + b1 mu``;
  ``nu <- (1-b2) g^2 + b2 nu``; ``u <- mu_hat / (sqrt(nu_hat) + eps) + wd p``;
  ``p <- p + (-lr(count)) u``. (``torch.optim.AdamW`` and
  ``clip_grad_norm_`` differ: the latter divides by ``norm + 1e-6``.)

  Args:
    params, grads, mu, nu: ``{name: tensor}`` (same dtype per entry).
    count: Adam's step count before this step.
    sched_count: the schedule's count before this step.
    config: the task config (``lr``, ``warmup``, ``weight_decay``,
      ``clip``).
    b1, b2, eps: Adam constants (optax defaults).

  Returns:
    ``(new params, new mu, new nu, info)``, info ``{"grad_norm", "lr"}``.
  """
  from peat_jax.bridges._torch import require_torch
  torch = require_torch()
  keys = sorted(params)
  dtype = params[keys[0]].dtype
  with torch.no_grad():
    g_norm = torch.sqrt(sum(torch.sum(grads[k] * grads[k]) for k in keys))
    clip = float(config["clip"])
    if not bool(g_norm < clip):
      grads = {k: (grads[k] / g_norm) * clip for k in keys}
    c = torch.tensor(count + 1, dtype=dtype)
    bc1 = 1 - torch.tensor(b1, dtype=dtype) ** c
    bc2 = 1 - torch.tensor(b2, dtype=dtype) ** c
    lr, warm = float(config["lr"]), int(config["warmup"])
    sc = torch.tensor(sched_count, dtype=dtype)
    if sched_count < warm:  # optax.linear_schedule(0, lr, warm)
      frac = 1 - torch.clamp(sc, 0, warm) / warm
      lr_now = torch.tensor(0.0 - lr, dtype=dtype) * frac + lr
    else:
      lr_now = torch.tensor(lr, dtype=dtype)
    wd = float(config["weight_decay"])
    new_p, new_mu, new_nu = {}, {}, {}
    for k in keys:
      g = grads[k]
      m = (1 - b1) * g + b1 * mu[k]
      v = (1 - b2) * (g * g) + b2 * nu[k]
      u = (m / bc1) / (torch.sqrt(v / bc2 + 0.0) + eps)
      u = u + wd * params[k]
      u = (-lr_now) * u
      new_p[k], new_mu[k], new_nu[k] = params[k] + u, m, v
  return new_p, new_mu, new_nu, {"grad_norm": float(g_norm),
                                 "lr": float(lr_now)}


def _torch_step(port, params, opt_adam, opt_sched, batch, config):
  from peat_jax.bridges import torch_models
  module = port.make()
  torch_models.load_flax_params(module, params, port.weight_map)
  module.zero_grad(set_to_none=True)
  loss = port.loss(module, batch)
  loss.backward()
  to_t = lambda tree: {
      k: torch_models._to_tensor(np.asarray(a))  # pylint: disable=protected-access
      for k, a in torch_models.flax_to_torch(tree, port.weight_map).items()}
  p = {n: prm.detach() for n, prm in module.named_parameters()}
  g = {n: prm.grad for n, prm in module.named_parameters()}
  new_p, mu, nu, info = torch_adamw_step(
      p, g, to_t(opt_adam.mu), to_t(opt_adam.nu), int(opt_adam.count),
      int(opt_sched.count), config)
  back = lambda d: _flat_params(torch_models.torch_to_flax(
      d, port.weight_map))
  return ({"grad": back(g), "mu": back(mu), "nu": back(nu),
           "param": back(new_p)},
          {"loss": float(loss.detach()), **info})


def _jax_step(step_fn, jax_loss, state, batch) -> tuple[dict, dict]:
  new_state, metrics = step_fn(state, batch)
  grads = jax.jit(jax.grad(jax_loss))(state.params, batch)
  adam, _ = _opt_parts(new_state.opt_state)
  return ({"grad": _flat_params(grads), "mu": _flat_params(adam.mu),
           "nu": _flat_params(adam.nu),
           "param": _flat_params(new_state.params)},
          {"loss": float(metrics["loss"]),
           "grad_norm": float(metrics["grad_norm"])})


STEP_WHATS = ("grad", "mu", "nu", "update", "param")


def compare_train_step(task: Any, golden_dir: str, step: int, *,
                       port: Any = None, threshold: float = THRESHOLD,
                       floor: float = FLOOR, signatures: bool = True,
                       what: Sequence[str] = STEP_WHATS) -> StepComparison:
  """Plays back one training step in torch against the JAX golden step.

  Restores the Orbax checkpoint ``step`` of a golden run, runs the JAX
  golden step (``task.train_step``) and the same step in torch: the port
  loaded from the checkpoint's parameters, forward, backward, then
  :func:`torch_adamw_step` on the checkpoint's Adam moments. The reference
  is the JAX step in float64 (state and batch cast exactly, x64 in a
  scope). Gradients, moments, updates (new - old, in float64) and new
  parameters are compared per parameter.

  Args:
    task: the golden run's task (a ``models`` scenario).
    golden_dir: the golden run directory (or its checkpoints folder).
    step: a saved step.
    port: the torch port (default ``build_port(task)``).
    threshold, floor, signatures: see :func:`compare_named`.
    what: which of ``grad``, ``mu``, ``nu``, ``update``, ``param`` to
      compare.

  Returns:
    A :class:`StepComparison`.

  Raises:
    PeatError / CheckpointError: a missing step, another optimizer, or
      mapping problems.
  """
  from peat_jax.bridges import torch_models
  port = port or torch_models.build_port(task)
  bad = [w for w in what if w not in STEP_WHATS]
  if bad:
    raise PeatError(f"what={bad}: expected a subset of {STEP_WHATS}")
  state = peat.restore_state(golden_dir, task, step=step)
  batch = task.batch_at(int(state.data_position))
  adam, sched = _opt_parts(state.opt_state)
  jax_vals, j_info = _jax_step(task.train_step, port.jax_loss, state, batch)
  with jax.enable_x64(True):
    r_vals, r_info = _jax_step(jax.jit(task.step_fn), port.jax_loss,
                               _to_f64(state), _to_f64(batch))
  t_vals, t_info = _torch_step(port, state.params, adam, sched, batch,
                               task.config)
  old = {k: v.astype(np.float64) for k, v in
         _flat_params(state.params).items()}
  for vals in (jax_vals, t_vals, r_vals):
    vals["update"] = {k: vals["param"][k].astype(np.float64) - old[k]
                      for k in old}
  order = ["/".join(str(x) for x in m.flax) for m in port.weight_map]
  rows = []
  for kind in what:
    for k in order:
      rows.append(_row(k, kind, t_vals[kind][k], jax_vals[kind][k],
                       r_vals[kind][k], None, threshold=threshold,
                       floor=floor, signatures=signatures))
  first = {w: next((r for r in rows if r["what"] == w and r["diverged"]),
                   None) for w in what}
  lr = float(_lr_of(task.config, int(sched.count)))
  scalars = {
      "loss": {"jax": j_info["loss"], "torch": t_info["loss"],
               "reference": r_info["loss"]},
      "grad_norm": {"jax": j_info["grad_norm"],
                    "torch": t_info["grad_norm"],
                    "reference": r_info["grad_norm"]},
      "lr": {"jax": lr, "torch": t_info["lr"], "reference": math.nan}}
  return StepComparison(int(step), rows, first, scalars)


def _lr_of(config: Mapping, count: int) -> float:
  import optax
  sched = optax.join_schedules(
      [optax.linear_schedule(0.0, config["lr"], config["warmup"]),
       optax.constant_schedule(config["lr"])], [config["warmup"]])
  return float(sched(count))
