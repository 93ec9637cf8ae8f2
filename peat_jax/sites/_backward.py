"""What ``backward="kut"`` runs at backward sites, and where.

:func:`backward_sites` (and the substitution's selection) adds to the
selected forward sites the backward sites that belong to them
(:func:`peat_jax.sites._pairing.analyze_backward`), each with what the KUT
computes there (:data:`KINDS`); :func:`vjp_output` is the KUT's VJP at a
transposed primitive site, laid out as that site's output.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax

from peat_jax.core import PeatError
from peat_jax.sites import _discovery as _sites
from peat_jax.sites._pairing import BackwardMap
from peat_jax.sites._pairing import Pair
from peat_jax.sites._pairing import analyze_backward


#: What the KUT computes at a backward site with ``backward="kut"``:
#: ``vjp`` (a transposed ``dot_general`` / ``conv_general_dilated``: the
#: cotangent the KUT's VJP gives at the forward call it transposes),
#: ``composite_vjp`` (a composite's backward marker: the VJP of the KUT at
#: the forward inputs and output cotangents), ``recompute`` (forward work
#: recomputed inside a backward container: the KUT's forward) and
#: ``kernel`` (any other primitive: the KUT on the site's own operands).
KINDS = ("vjp", "composite_vjp", "recompute", "kernel")


class BackwardSite(NamedTuple):
  """A backward site that ``backward="kut"`` adds to selected forward sites.

  Attributes:
    site: the backward site.
    kind: one of :data:`KINDS`.
    forward: the forward site it belongs to (None: found by kernel and
      module path).
    params: for ``vjp`` sites, the site's own primitive parameters (its
      float64 reference is the golden primitive with them); else None.
  """

  site: _sites.Site
  kind: str
  forward: str | None
  params: dict | None


def backward_of(table: Sequence[_sites.Site], chosen: Sequence[_sites.Site],
                bmap: BackwardMap) -> list[BackwardSite]:
  """The backward sites that belong to the chosen forward sites.

  A backward site belongs to them when the forward site it belongs to
  (:attr:`BackwardMap.forward`) is chosen; a backward site without one
  (a recomputation of no forward site, another primitive) when a chosen
  forward site has its kernel and module path.

  Args:
    table: the step's sites.
    chosen: the selected sites (forward sites count).
    bmap: :func:`analyze_backward` of the step.

  Returns:
    The backward sites, in execution order.
  """
  names = {s.name for s in chosen if s.phase == "fwd"}
  keys = {(s.kernel, s.path) for s in chosen if s.phase == "fwd"}
  out = []
  for s in table:
    if s.phase != "bwd":
      continue
    fwd = bmap.forward.get(s.address)
    if fwd is not None and fwd not in names:
      continue
    if fwd is None and (s.kernel, s.path) not in keys:
      continue
    out.append(BackwardSite(s, bmap.kind[s.address], fwd,
                            bmap.params.get(s.address)))
  return out


def backward_sites(fn, *args, forward: Sequence[str] = (),
                   backward: Sequence[str] = ()) -> list[BackwardSite]:
  """The backward sites where ``backward="kut"`` runs the KUT's VJP.

  Those ``Substitution(kut, sites=forward, backward="kut")`` adds to the
  forward sites, and the backward sites named in ``backward`` (selected
  explicitly), with what the KUT computes at each.

  >>> bw = backward_sites(task.step_fn, state, batch,
  ...                     forward=["fwd/Dense_0/dot_general:0"])
  >>> [(b.site.name, b.kind, b.forward) for b in bw]

  Args:
    fn: the step.
    *args: its example arguments.
    forward: names of the selected forward sites.
    backward: names of backward sites selected explicitly (other names
      are ignored).

  Returns:
    The :class:`BackwardSite` list, in execution order.

  Raises:
    PeatError: an unknown site name.
  """
  closed, _ = _sites.trace(fn, *args)
  table = _sites.walk(closed)
  chosen = list(_sites.select_sites(table, names=tuple(forward)))
  bmap = analyze_backward(closed, table)
  found = backward_of(table, chosen, bmap)
  have = {b.site.name for b in found}
  named = set(backward) - have
  extra = [BackwardSite(s, bmap.kind[s.address], bmap.forward.get(s.address),
                        bmap.params.get(s.address))
           for s in table if s.name in named and s.phase == "bwd"]
  order = {s.name: i for i, s in enumerate(table)}
  return sorted(found + extra, key=lambda b: order[b.site.name])


# -------------------------------------------------------------------- running


def _apply(moves, x):
  for prim, params in moves:
    x = prim.bind(x, **prim.get_bind_params(params))
  return x


def _undo(post, cot, out_aval):
  """The transposed equation's output from the operand's cotangent."""
  x = cot
  for prim, params, in_aval in reversed(post):
    name = prim.name
    if name == "transpose":
      perm = params["permutation"]
      inv = [0] * len(perm)
      for i, p in enumerate(perm):
        inv[p] = i
      x = jax.lax.transpose(x, tuple(inv))
    elif name == "reshape":
      x = jax.lax.reshape(x, tuple(in_aval.shape))
    else:  # convert_element_type
      x = jax.lax.convert_element_type(x, in_aval.dtype)
  if x.shape != out_aval.shape or x.dtype != out_aval.dtype:
    x = jax.lax.convert_element_type(x, out_aval.dtype)
  return x


def vjp_output(pair: Pair, kut, invals: list, read, site: str, out_aval):
  """The backward site's output computed by the KUT's VJP.

  Args:
    pair: the site's :class:`Pair`.
    kut: the kernel under test, ``kut(*forward_operands, **forward_params)``.
    invals: the backward site's input values.
    read: ``read(scope, var)``: a variable's value where the site runs.
    site: the backward site's name (for errors).
    out_aval: the backward site's output aval.

  Returns:
    What the backward equation returns, from the KUT's VJP at the forward
    operands and the site's output cotangent.

  Raises:
    PeatError: the KUT's forward output differs in shape or dtype from the
      golden kernel's.
  """
  ops = [_apply(s.moves, read(s.scope, s.var)) for s in pair.sources]
  ct = invals[pair.ct_pos]

  def forward(*xs):
    out = kut(*xs, **pair.params)
    out = out[0] if isinstance(out, (list, tuple)) else out
    if (tuple(out.shape) != tuple(pair.out_aval.shape)
        or out.dtype != pair.out_aval.dtype):
      raise PeatError(
          f"KUT at backward site {site!r} returned {out.dtype}"
          f"{list(out.shape)} from its forward call; expected "
          f"{pair.out_aval.dtype}{list(pair.out_aval.shape)} (the golden "
          "output) to take its VJP. Cast or reshape in the KUT.")
    return out

  _, vjp = jax.vjp(forward, *ops)
  cot = vjp(ct)[pair.operand]
  return _undo(pair.post, cot, out_aval)
