"""Backward primitive sites paired with the forward call they transpose.

JAX differentiates a ``dot_general`` or ``conv_general_dilated`` call by
*transposition*: the cotangent of each operand is one more equation of the
same primitive (``transpose(jvp(...))`` in its name stack) over the output
cotangent and the other operand, with other dimension numbers, and a few
data-movement equations around it (``transpose``, ``rev``,
``convert_element_type``). The kernel under test's VJP needs the forward
call itself: its parameters and both forward operands. This module finds,
for every backward (transposed) primitive equation of a traced step, the
forward equation it transposes, which operand's cotangent it computes, and
where the forward operands can be read when the backward equation runs.

How a backward equation ``B`` is paired (all of it at trace time, from the
jaxpr alone):

1. *Templates.* For each forward equation ``F`` and operand ``j``,
   ``jax.vjp`` of ``F``'s primitive with ``F``'s own parameters is traced on
   abstract values: the one equation of the primitive in it is what JAX's
   transpose rule makes for ``j`` (its parameters, which of its operands is
   the output cotangent, the data movement applied to the other operand
   before it and to its result after it).
2. *Residual identity.* ``B`` transposes ``F`` for operand ``j`` when its
   parameters are the template's and its non-cotangent operand is ``F``'s
   other operand (the same value: the same variable, followed through the
   data movement of the template and through the inputs of nested ``jit``,
   ``remat``, custom-derivative, ``cond`` and composite calls).
3. *Partners.* A backward equation whose residual is recomputed (inside a
   composite's backward site, the forward work is recomputed) is paired
   through its partner: the transposition of the same ``F`` for the other
   operand, which shares its output cotangent.

Equivalent forward equations (a recomputation of a forward call on the
same values) are one forward call; the one that is a forward site names the
pair. Equations inside ``scan`` and ``while`` bodies whose forward operands
are saved residuals of another loop are not paired (:class:`Pair` is then
missing and the caller refuses the site, naming it).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from peat_jax.sites import _composite
from peat_jax.sites import _discovery as _sites

#: Primitives whose backward sites are paired.
KERNELS = ("dot_general", "conv_general_dilated")

# Data movement followed when comparing values (one array in, one out).
_MOVES = frozenset({"transpose", "reshape", "convert_element_type", "rev",
                    "squeeze", "expand_dims", "broadcast_in_dim", "copy",
                    "copy_p"})
# Data movement after the transposed equation that can be undone.
_INVERTIBLE = frozenset({"transpose", "reshape", "convert_element_type"})


class Source(NamedTuple):
  """Where a forward operand's value is read when a backward site runs.

  Attributes:
    scope: address prefix of the jaxpr that holds ``var``.
    var: the variable (or a literal).
    moves: ``((primitive, params), ...)`` applied to it, in order.
  """

  scope: tuple
  var: Any
  moves: tuple


class Pair(NamedTuple):
  """A backward primitive site and the forward call it transposes.

  Attributes:
    forward: address of the forward equation.
    forward_site: the forward site's name when it is a forward-phase site
      (else None: a recomputation inside a backward container).
    operand: the forward operand whose cotangent the site computes.
    ct_pos: position of the output cotangent among the site's operands.
    sources: per forward operand, where its value is read.
    primitive: the forward equation's primitive.
    params: the forward equation's parameters.
    post: the data movement JAX applies after the site's equation to make
      the operand's cotangent, ``((primitive, params, in_aval), ...)``.
    out_aval: the forward call's output aval.
  """

  forward: tuple
  forward_site: str | None
  operand: int
  ct_pos: int
  sources: tuple
  primitive: Any
  params: dict
  post: tuple
  out_aval: Any


class _Template(NamedTuple):
  params_key: tuple
  in_avals: tuple
  ct_pos: int
  res_moves: tuple  # moves applied to the other operand before the equation
  post: tuple


def _freeze(x) -> Any:
  if isinstance(x, dict):
    return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
  if isinstance(x, (tuple, list)):
    return tuple(_freeze(v) for v in x)
  try:
    hash(x)
    return x
  except TypeError:
    return repr(x)


def _params_key(eqn) -> tuple:
  return _freeze(eqn.params)


def _move_key(moves) -> tuple:
  return tuple((p.name, _freeze(params)) for p, params in moves)


def _aval_key(aval) -> tuple:
  return (tuple(aval.shape), str(aval.dtype))


def _backward(eqn, inside_backward: bool) -> bool:
  """Whether an equation is backward work (JAX's transposition).

  Name stacks are relative to the enclosing equation: an equation made by
  transposition has ``transpose(`` in its own name stack, or has none of
  ``jvp(`` (the forward of a ``jax.vjp`` traced inside a backward
  container) and ``rematted_computation`` (forward work recomputed by
  ``remat``) inside a backward container.
  """
  ns = str(eqn.source_info.name_stack)
  if "transpose(" in ns:
    return True
  return inside_backward and "jvp(" not in ns and "rematted_computation" not in ns


# ------------------------------------------------------------ the jaxpr tree


class _Tree:
  """Every scope of a closed jaxpr: producers and inputs mapped outwards."""

  def __init__(self, closed):
    self.eqns: dict[tuple, Any] = {}       # address -> equation
    self.producer: dict[tuple, tuple] = {}  # (scope, var) -> (index, eqn)
    self.up: dict[tuple, tuple] = {}        # (scope, invar) -> (scope', var')
    self.inputs: set = set()                # (scope, var) of in/const vars
    self.backward: dict[tuple, bool] = {}   # address -> backward work
    self._visit(closed.jaxpr, (), False)

  def _visit(self, jaxpr, scope, inside_backward: bool):
    for v in list(jaxpr.invars) + list(jaxpr.constvars):
      self.inputs.add((scope, v))
    for i, eqn in enumerate(jaxpr.eqns):
      addr = scope + (i,)
      self.eqns[addr] = eqn
      self.backward[addr] = _backward(eqn, inside_backward)
      for v in eqn.outvars:
        self.producer[(scope, v)] = (i, eqn)
      if _sites._is_kernel_with_combiner(eqn.primitive.name):
        continue
      for j, (inner, _) in enumerate(_sites.sub_jaxprs(eqn)):
        sub = addr + (j,)
        for v, outer in zip(inner.invars, _outer_vars(eqn, j, inner)):
          if outer is not None and not isinstance(outer, jex_core.Literal):
            self.up[(sub, v)] = (scope, outer)
        self._visit(inner, sub, self.backward[addr])

  def source(self, scope, var) -> Source:
    """The value ``var`` holds, as a root variable and data movement."""
    moves = []
    while True:
      if isinstance(var, jex_core.Literal):
        break
      if (scope, var) in self.up:
        scope, var = self.up[(scope, var)]
        continue
      found = self.producer.get((scope, var))
      if found is None:
        break
      _, eqn = found
      ins = [v for v in eqn.invars]
      if eqn.primitive.name not in _MOVES or len(ins) != 1:
        break
      moves.append((eqn.primitive, dict(eqn.params)))
      var = ins[0]
    return Source(scope, var, tuple(reversed(moves)))

  def readable(self, src: Source, at: tuple) -> bool:
    """Whether ``src`` holds its value when the equation at ``at`` runs."""
    if isinstance(src.var, jex_core.Literal):
      return True
    n = len(src.scope)
    if at[:n] != src.scope or len(at) <= n:
      return False
    if (src.scope, src.var) in self.inputs:
      return True
    found = self.producer.get((src.scope, src.var))
    return found is not None and found[0] < at[n]


def _outer_vars(eqn, j: int, inner) -> list:
  """Per inner input of sub-jaxpr ``j``: the equation input it receives."""
  label = _sites.construct_label(eqn)
  ins, n = list(eqn.invars), len(inner.invars)
  p = eqn.params
  if label in ("jit", "custom_jvp", "custom_vjp", "remat") and n == len(ins):
    return ins
  if label == "cond" and n == len(ins) - 1:
    return ins[1:]
  if label == "scan":
    nc = p["num_consts"]
    return ins[:nc] + [None] * (n - nc)
  if label == "while":
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    consts = ins[:cn] if j == 0 else ins[cn:cn + bn]
    return consts + [None] * (n - len(consts))
  return [None] * n


def _key(src: Source) -> tuple:
  var = src.var
  vk = ("lit", repr(var.val)) if isinstance(var, jex_core.Literal) else id(var)
  return (src.scope, vk, _move_key(src.moves))


# ------------------------------------------------------------------ templates


_TEMPLATES: dict[tuple, _Template | None] = {}


def _template(eqn, j: int) -> _Template | None:
  """How JAX transposes ``eqn`` for operand ``j`` (None: an unusual rule)."""
  ins = [v.aval for v in eqn.invars]
  ck = (eqn.primitive.name, _params_key(eqn), tuple(map(_aval_key, ins)), j)
  if ck in _TEMPLATES:
    return _TEMPLATES[ck]
  params = eqn.primitive.get_bind_params(eqn.params)

  def t(xj, other, ct):
    def f(x):
      ops = [x, other] if j == 0 else [other, x]
      return eqn.primitive.bind(*ops, **params)
    return jax.vjp(f, xj)[1](ct)[0]

  sds = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
  try:
    closed = _sites._dce(jax.make_jaxpr(t)(
        sds(ins[j]), sds(ins[1 - j]), sds(eqn.outvars[0].aval)))
  except Exception:  # pylint: disable=broad-except  # no transpose rule
    closed = None
  _TEMPLATES[ck] = None if closed is None else _read_template(closed.jaxpr,
                                                              eqn.primitive)
  return _TEMPLATES[ck]


def _read_template(jaxpr, prim) -> _Template | None:
  kernels = [e for e in jaxpr.eqns if e.primitive is prim]
  if len(kernels) != 1 or len(kernels[0].invars) != 2:
    return None
  k = kernels[0]
  _, other, ct = jaxpr.invars
  if ct not in k.invars:
    return None
  ct_pos = list(k.invars).index(ct)
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  var, moves = k.invars[1 - ct_pos], []
  while var is not other:
    e = producer.get(var)
    if e is None or e.primitive.name not in _MOVES or len(e.invars) != 1:
      return None
    moves.append((e.primitive, dict(e.params)))
    var = e.invars[0]
  consumers = {}
  for e in jaxpr.eqns:
    for v in e.invars:
      consumers.setdefault(v, []).append(e)
  post, var = [], k.outvars[0]
  while var is not jaxpr.outvars[0]:
    users = consumers.get(var, [])
    if (len(users) != 1 or users[0].primitive.name not in _INVERTIBLE
        or len(users[0].invars) != 1):
      return None
    post.append((users[0].primitive, dict(users[0].params), var.aval))
    var = users[0].outvars[0]
  return _Template(_params_key(k), tuple(_aval_key(v.aval) for v in k.invars),
                   ct_pos, tuple(reversed(moves)), tuple(post))


# -------------------------------------------------------------------- pairing


class BackwardMap(NamedTuple):
  """The backward sites of a step and the forward calls they belong to.

  Attributes:
    pairs: transposed primitive site address -> :class:`Pair`.
    unpaired: transposed primitive site address -> why it has no pair.
    forward: backward site address -> the name of the forward site it
      belongs to: the call a transposed site transposes, the call a
      recomputation (inside a backward container) recomputes on the same
      values, the forward marker of a composite's backward marker (same
      call). Missing when there is no such forward-phase site.
  """

  pairs: dict
  unpaired: dict
  forward: dict
  kind: dict
  params: dict


def analyze_backward(closed, table: Sequence[_sites.Site]) -> BackwardMap:
  """Pairs the backward sites of a step with their forward calls.

  Args:
    closed: the step's closed jaxpr (:func:`peat_jax.sites.trace`).
    table: its sites (:func:`peat_jax.sites.walk`).

  Returns:
    A :class:`BackwardMap`.
  """
  tree = _Tree(closed)
  fwd_site = {s.address: s.name for s in table if s.phase == "fwd"}
  kernels = [(a, e) for a, e in tree.eqns.items()
             if e.primitive.name in KERNELS]
  forwards = [(a, e) for a, e in kernels if not tree.backward[a]]
  backwards = [(a, e) for a, e in kernels if tree.backward[a]]
  # forward operand value -> [(forward address, operand index)]
  by_value: dict[tuple, list] = {}
  fsrc = {}
  for a, e in forwards:
    fsrc[a] = [tree.source(a[:-1], v) for v in e.invars]
    for k, src in enumerate(fsrc[a]):
      by_value.setdefault(_key(src), []).append((a, k))

  def matches(b, be, fa, j):
    """The template of (fa, j) if backward equation be fits it."""
    fe = tree.eqns[fa]
    if fe.primitive is not be.primitive or len(fe.invars) != 2:
      return None
    t = _template(fe, j)
    if (t is None or t.params_key != _params_key(be)
        or t.in_avals != tuple(_aval_key(v.aval) for v in be.invars)):
      return None
    return t

  found: dict[tuple, list] = {}
  for b, be in backwards:
    cands = []
    for pos in (0, 1):
      res = tree.source(b[:-1], be.invars[pos])
      for fa, k in _strip_candidates(res, by_value):
        t = matches(b, be, fa, 1 - k)
        if t is not None and t.ct_pos == 1 - pos and _key(
            fsrc[fa][k]._replace(moves=fsrc[fa][k].moves + t.res_moves)
        ) == _key(res):
          cands.append((fa, 1 - k, t))
    found[b] = _equivalent(cands, fsrc, fwd_site)

  def ct_key(b, pos):
    return _key(tree.source(b[:-1], tree.eqns[b].invars[pos]))

  # Partners: the other operand's transposition of the same forward call.
  for b, be in backwards:
    if len(found[b]) == 1:
      continue
    for b2, c2 in found.items():
      if b2 == b or b2[:-1] != b[:-1] or len(c2) != 1:
        continue
      fa, j2, t2 = c2[0]
      t = matches(b, be, fa, 1 - j2)
      if t is not None and ct_key(b, t.ct_pos) == ct_key(b2, t2.ct_pos):
        found[b] = [(fa, 1 - j2, t)]
        break

  pairs, unpaired = {}, {}
  for b, be in backwards:
    cands = found[b]
    if not cands:
      unpaired[b] = ("no forward call of the same kernel whose operand "
                     "reaches it (a scan's saved residuals, or a backward "
                     "rule other than JAX's transposition)")
      continue
    if len(cands) > 1:
      unpaired[b] = ("it transposes one of several forward calls with equal "
                     "parameters and operands: "
                     + ", ".join(fwd_site.get(c[0], str(c[0])) for c in cands))
      continue
    fa, j, t = cands[0]
    sources = _sources(tree, b, be, fa, j, t, fsrc, found)
    if sources is None:
      unpaired[b] = ("the forward operand whose cotangent it computes is not "
                     "reachable where it runs")
      continue
    fe = tree.eqns[fa]
    pairs[b] = Pair(fa, fwd_site.get(fa), j, t.ct_pos, sources,
                    fe.primitive, dict(fe.params), t.post,
                    fe.outvars[0].aval)
  forward = {b: p.forward_site for b, p in pairs.items() if p.forward_site}
  # Recomputations: forward work inside backward containers, on the values
  # of a forward site (same primitive, parameters and operand values).
  named = {}
  for a, e in forwards:
    if a in fwd_site:
      named.setdefault((e.primitive.name, _params_key(e),
                        tuple(_key(x) for x in fsrc[a])), fwd_site[a])
  for a, e in forwards:
    if a not in fwd_site:
      key = (e.primitive.name, _params_key(e), tuple(_key(x) for x in fsrc[a]))
      if key in named:
        forward[a] = named[key]
  forward.update(_composite_forwards(tree, table))
  kind = {}
  for site in table:
    if site.phase != "bwd":
      continue
    a = site.address
    if a in pairs or a in unpaired:
      kind[a] = "vjp"
    elif site.composite:
      m = _composite.lookup(tree.eqns[a].params.get("name", ""))
      kind[a] = "composite_vjp" if m is not None and m[1] else "recompute"
    elif site.kernel in KERNELS:
      kind[a] = "recompute"
    else:
      kind[a] = "kernel"
  params = {a: _vjp_params(tree, a, pairs.get(a)) for a, k in kind.items()
            if k == "vjp"}
  return BackwardMap(pairs, unpaired, forward, kind, params)


def _vjp_params(tree: _Tree, a, pair: Pair | None) -> dict:
  """A transposed site's own parameters, and ``cotangent_dtype`` where the
  operand's cotangent is narrower than the site's output.

  A bf16 model's attention logits (bf16 operands, float32 result) are
  transposed by a float32 dot whose result JAX rounds to the operand's
  bf16 one equation later; a KUT's VJP returns that cotangent in the
  operand's dtype (JAX's rule), so the two are compared there
  (``profiler.playback_fi`` rounds the golden tap to it).
  """
  params = dict(tree.eqns[a].params)
  if pair is None:
    return params
  operand = tree.eqns[pair.forward].invars[pair.operand].aval.dtype
  out = tree.eqns[a].outvars[0].aval.dtype
  if (jnp.issubdtype(operand, jnp.floating)
      and jnp.issubdtype(out, jnp.floating)
      and jnp.dtype(operand).itemsize < jnp.dtype(out).itemsize):
    params["cotangent_dtype"] = jnp.dtype(operand).name
  return params


def _composite_forwards(tree: _Tree, table) -> dict:
  """Backward composite marker address -> its forward marker's site name."""
  by_token = {}
  bwd = []
  for s in table:
    if not s.composite:
      continue
    m = _composite.lookup(tree.eqns[s.address].params.get("name", ""))
    if m is None:
      continue
    token = tree.eqns[s.address].params["name"].rpartition("#")[2]
    if m[1]:
      bwd.append((s.address, token))
    elif s.phase == "fwd":
      by_token[token] = s.name
  return {a: by_token[t] for a, t in bwd if t in by_token}


def _strip_candidates(res: Source, by_value: dict):
  """Forward operands ``res`` may be (it, less a tail of data movement)."""
  for n in range(len(res.moves), -1, -1):
    yield from by_value.get(_key(res._replace(moves=res.moves[:n])), [])


def _equivalent(cands, fsrc, fwd_site) -> list:
  """Candidates, with recomputations of one forward call merged."""
  groups: list[list] = []
  for c in cands:
    key = (c[1], tuple(_key(s) for s in fsrc[c[0]]))
    for g in groups:
      if g[0] == key:
        g.append(c)
        break
    else:
      groups.append([key, c])
  out = []
  for g in groups:
    members = g[1:]
    named = [c for c in members if c[0] in fwd_site]
    out.append((named or members)[0])
  return out


def _sources(tree: _Tree, b, be, fa, j, t: _Template, fsrc, found):
  """Per forward operand, where its value is read at ``b`` (None: nowhere)."""
  own = tree.source(b[:-1], be.invars[1 - t.ct_pos])
  n = len(own.moves) - len(t.res_moves)
  out = [None, None]
  if n >= 0 and _move_key(own.moves[n:]) == _move_key(t.res_moves):
    out[1 - j] = own._replace(moves=own.moves[:n])
  if tree.readable(fsrc[fa][j], b):
    out[j] = fsrc[fa][j]
  else:  # the partner's residual is operand j
    for b2, c2 in found.items():
      if b2[:-1] == b[:-1] and any(c[0] == fa and c[1] == 1 - j for c in c2):
        be2 = tree.eqns[b2]
        t2 = next(c[2] for c in c2 if c[0] == fa and c[1] == 1 - j)
        src = tree.source(b2[:-1], be2.invars[1 - t2.ct_pos])
        m = len(src.moves) - len(t2.res_moves)
        if m >= 0 and _move_key(src.moves[m:]) == _move_key(t2.res_moves):
          out[j] = src._replace(moves=src.moves[:m])
          break
  if out[0] is None or out[1] is None or not all(
      tree.readable(s, b) for s in out):
    return None
  return tuple(out)
