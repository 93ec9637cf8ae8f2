"""The compiled programs of a forward campaign (``peat.forward_campaign``):
the golden values once, and one vectorized chunk of injections per site.

A chunk at a site whose suffix is separable over the batch (``"sample"``)
builds, for each injection, the rows of the samples its faults hit, runs
the one-sample suffix on them and on the same rows without the fault (one
``vmap`` over both), and writes the faulted rows into golden's outputs; a
row that comes out bitwise equal to its fault-free twin is golden's own
row (a masked fault). Elsewhere (``"batch: ..."``) a chunk runs the
batch's suffix on every injection's faulted target and on the golden one,
and keeps golden's rows where a row equals the fault-free twin's.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from peat_jax import sites as _sites
from peat_jax.injectors import _models as md
from peat_jax.injectors import _sparse


class Faults(NamedTuple):
  """Where a sparse model's faults went (leading axis: the injections).

  Attributes:
    index: int32 ``[n, count]``: flat indices into the target (the site's
      output, or its weight operand).
    golden: ``[n, count]``: the values there before the fault.
    value: ``[n, count]``: the values written.
  """

  index: Any
  golden: Any
  value: Any


def _row(x, s, axis):
  return lax.dynamic_slice_in_dim(x, s, 1, axis=axis)


def _set_row(x, row, s, axis):
  return lax.dynamic_update_slice_in_dim(x, row, s, axis=axis)


def _same(a, b):
  """Bitwise equality of two arrays (NaN patterns included)."""
  if jnp.issubdtype(a.dtype, jnp.floating):
    bits = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[a.dtype.itemsize]
    return lax.bitcast_convert_type(a, bits) == lax.bitcast_convert_type(
        b, bits)
  return a == b


def _branch(site, jb, vals: dict, golden_outs: list, out_tree,
            inject_dense, sparse, summarize):
  """``keys[C, 2] -> (summaries, fault index, golden, value)`` of a site."""
  target = vals[site.sfx.start]
  flat_t = target.reshape(-1)
  per = math.prod(site.target_shape[1:]) if site.target_shape else 1
  frontier = {v: vals[v] for v in site.sfx.frontier}

  def faults(key):
    if sparse is None:
      z = jnp.zeros((0,), jnp.int32)
      return z, flat_t[:0], flat_t[:0]
    idx, val = sparse(key, flat_t)
    return idx, flat_t[idx], val

  def by_row(outs, ref, axes):
    """Rows of ``outs`` equal to ``ref`` (same computation, no fault) get
    golden's own rows."""
    fixed = []
    for o, r, g, a in zip(outs, ref, golden_outs, axes):
      eq = _same(o, r)
      if a is None:
        fixed.append(jnp.where(jnp.all(eq), g, o))
      else:
        keep = jnp.all(eq, axis=tuple(d for d in range(eq.ndim) if d != a),
                       keepdims=True)
        fixed.append(jnp.where(keep, g, o))
    return fixed

  if site.mode == "sample":
    j1, sfx1 = site.j1, site.sfx1
    corr_front = dict(zip(site.sfx.frontier, sfx1.frontier))

    def one(s, row):
      values = {corr_front[v]: (x if site.axes1[v] is None
                                else _row(x, s, site.axes1[v]))
                for v, x in frontier.items()}
      outs = _sites.evaluate_suffix(j1, sfx1, values, row,
                                    [None] * len(sfx1.outs))
      return [o for o, d in zip(outs, sfx1.outs) if d]

    dep = [i for i, d in enumerate(site.sfx.outs) if d]

    def chunk(keys):
      idx, gold, val = jax.vmap(faults)(keys)  # [C, J]
      c, j = idx.shape
      if j == 0:
        outs = [jnp.broadcast_to(g, (c,) + g.shape) for g in golden_outs]
      else:
        s = idx // per  # [C, J]
        # [C, J (the row's fault), J (every fault)]: faults in that sample.
        local = idx[:, None, :] - s[:, :, None] * per
        hit = s[:, None, :] == s[:, :, None]
        local = jnp.where(hit, local, per)  # out of range: dropped

        def make_row(sj, loc, v):
          r = target[sj].reshape(-1).at[loc].set(v, mode="drop")
          return r.reshape((1,) + site.target_shape[1:])

        rows = jax.vmap(jax.vmap(make_row, in_axes=(0, 0, None)))(
            s, local, val)
        clean = jax.vmap(jax.vmap(lambda sj: target[sj][None]))(s)
        ss = jnp.concatenate([s.reshape(-1), s.reshape(-1)])
        rr = jnp.concatenate([rows.reshape((c * j,) + rows.shape[2:]),
                              clean.reshape((c * j,) + clean.shape[2:])])
        res = jax.vmap(one)(ss, rr)  # per dependent output: [2CJ, ...]
        outs = [jnp.broadcast_to(g, (c,) + g.shape) for g in golden_outs]
        for o_i, r in zip(dep, res):
          a = site.out_axes[o_i]
          fault_r = r[:c * j].reshape((c, j) + r.shape[1:])
          clean_r = r[c * j:].reshape((c, j) + r.shape[1:])
          g = golden_outs[o_i]
          masked = jnp.all(_same(fault_r, clean_r),
                           axis=tuple(range(2, fault_r.ndim)))

          def put(gk, fr, mk, sk, a=a, g=g):
            out = gk
            for jj in range(j):
              new = jnp.where(mk[jj], _row(g, sk[jj], a), fr[jj])
              out = _set_row(out, new, sk[jj], a)
            return out

          outs[o_i] = jax.vmap(put)(outs[o_i], fault_r, masked, s)
      summ = jax.vmap(lambda *o: summarize(jax.tree.unflatten(
          out_tree, list(o))))(*outs)
      return summ, idx, gold, val

    return chunk

  def full(t):
    return _sites.evaluate_suffix(jb, site.sfx, frontier, t, golden_outs)

  def chunk(keys):
    idx, gold, val = jax.vmap(faults)(keys)
    if sparse is None:
      ts = jax.vmap(lambda k: inject_dense(k, target))(keys)
    else:
      ts = jax.vmap(lambda i, v: flat_t.at[i].set(v).reshape(
          target.shape))(idx, val)
    c = ts.shape[0]
    res = jax.vmap(full)(jnp.concatenate([ts, target[None]]))
    ref = [r[c] for r in res]
    outs = jax.vmap(lambda *o: by_row(list(o), ref, site.out_axes))(
        *[r[:c] for r in res])
    summ = jax.vmap(lambda *o: summarize(jax.tree.unflatten(
        out_tree, list(o))))(*outs)
    return summ, idx, gold, val

  return chunk


class _Program:
  """The campaign's compiled programs: no control flow inside them (on
  XLA:CPU a convolution inside a ``while`` or ``cond`` body runs ~35x
  slower than the same one outside, measured in jax 0.10.2).

  ``golden(leaves)``: the function's golden outputs and every frontier
  value, once; ``chunks[s](values, golden, keys)``: one chunk of
  injections at site ``s`` (vectorized over its keys); ``gather``: the
  chunks' results in injection order. A campaign is one golden call and
  one chunk call per chunk; a replay is the chunk call of its chunk with
  its key in every slot, the same executable, so bitwise the same.
  """

  def __init__(self, tb, sites: list, name: str, p: Mapping, summarize):
    jb = tb.jaxpr
    self.keep = list(dict.fromkeys(
        v for s in sites for v in (s.sfx.start,) + s.sfx.frontier))
    model = md.TENSOR_MODELS[name]
    inject_dense = lambda k, x: model.fn(k, x, **p)
    sparse = _sparse.sparse_fn(name, p)
    dtype = jnp.result_type(*[s.target_dtype for s in sites])

    def golden(leaves):
      outs, vals = _sites.evaluate_all(jb, leaves, self.keep)
      return outs, [vals[v] for v in self.keep]

    def chunk_fn(site):
      def run(values, golden_outs, keys):
        vals = dict(zip(self.keep, values))
        summ, idx, gold, val = _branch(
            site, jb.jaxpr, vals, list(golden_outs), tb.out_tree,
            inject_dense, sparse, summarize)(keys)
        return summ, idx, gold.astype(dtype), val.astype(dtype)
      return jax.jit(run)

    self.golden = jax.jit(golden)
    self.chunks = [chunk_fn(s) for s in sites]
    self.gather = jax.jit(lambda parts, order: jax.tree.map(
        lambda *a: jnp.concatenate(a)[order], *parts))
    self.out_tree = tb.out_tree

  def run(self, values, golden_outs, keys_chunks: np.ndarray,
          site_chunks: np.ndarray, order: np.ndarray):
    """Every chunk, then the results in injection order."""
    parts, fill = [], None
    for keys, s in zip(keys_chunks, site_chunks):
      if s < 0:
        parts.append(None)
        continue
      parts.append(self.chunks[s](values, golden_outs, jnp.asarray(keys)))
      fill = parts[-1] if fill is None else fill
    zeros = jax.tree.map(jnp.zeros_like, fill)
    parts = [zeros if x is None else x for x in parts]
    summ, idx, gold, val = self.gather(parts, jnp.asarray(order))
    return summ, Faults(idx, gold, val)


