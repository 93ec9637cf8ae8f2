"""Exact bit counting of the pure-JAX pass: carry-save adder trees.

Each element contributes uint32 words whose set bits are conditions; the
count of each condition over all elements is the sum of one bit position.
Words are added in groups with carry-save adders into bit planes, so the
pass reads each element once and counts 32 conditions per word."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from peat_jax.analyzer.signature._elements import (
    _element_floats, _element_words, _float_init, _float_merge, _float_reduce,
    _float_update)
from peat_jax.analyzer.signature._signature import Array
from peat_jax.analyzer.signature._signature import _bits_of


#: Words per lane added per step of the counting scan (bit-sliced CSA tree).
_GROUP = 16
#: Lanes (elements side by side) of the counting scan; its planes stay in cache.
_WIDTH = 1024


def _csa_add(a: list[Array], b: list[Array]) -> list[Array]:
  """Adds two bit-sliced counters (lists of planes, LSB first)."""
  if len(a) < len(b):
    a, b = b, a
  out, carry = [], None
  for i, x in enumerate(a):
    y = b[i] if i < len(b) else None
    if y is None and carry is None:
      out.append(x)
      continue
    if y is None:
      out.append(x ^ carry)
      carry = x & carry
    elif carry is None:
      out.append(x ^ y)
      carry = x & y
    else:
      xy = x ^ y
      out.append(xy ^ carry)
      carry = (x & y) | (carry & xy)
  if carry is not None:
    out.append(carry)
  return out


def _csa_tree(words: list[Array]) -> list[Array]:
  """Bit-sliced sum of 1-bit counters: per bit position, how many are set."""
  cs = [[w] for w in words]
  while len(cs) > 1:
    nxt = [_csa_add(cs[i], cs[i + 1]) for i in range(0, len(cs) - 1, 2)]
    if len(cs) % 2:
      nxt.append(cs[-1])
    cs = nxt
  return cs[0]


def _accumulate_planes(acc: tuple[Array, ...], add: list[Array]):
  """acc += add for bit-sliced counters; acc has fixed length (no overflow)."""
  out, carry = [], None
  for i, p in enumerate(acc):
    y = add[i] if i < len(add) else None
    if y is None and carry is None:
      out.append(p)
    elif y is None:
      out.append(p ^ carry)
      carry = p & carry
    elif carry is None:
      out.append(p ^ y)
      carry = p & y
    else:
      py = p ^ y
      out.append(py ^ carry)
      carry = (p & y) | (carry & py)
  return tuple(out)


def _plane_counts(planes: tuple[Array, ...]) -> Array:
  """int32[32] per-bit totals of a bit-sliced counter of (width,) planes."""
  shifts = jnp.arange(32, dtype=jnp.uint32)
  total = jnp.zeros((32,), jnp.int32)
  for l, p in enumerate(planes):
    c = jnp.sum(((p[:, None] >> shifts) & 1).astype(jnp.int32), axis=0,
                dtype=jnp.int32)
    total = total + (c << l)
  return total


def _count_pass(t: Array, g: Array, dtype):
  """Exact per-bit counts of `_element_words` over flat t, g (one pass).

  `t`, `g` are the records' bit patterns (unsigned), of dtype `dtype`.

  Carry-save (bit-sliced) counting: a `lax.scan` takes _GROUP x _WIDTH
  elements per step, adds the _GROUP words of each lane with a tree of
  bitwise full adders (per bit position, all 32 at once), and adds that
  small count into per-word accumulators of L bit planes (plane l holds
  bit l of each lane's count). Only bitwise element-wise operations run in
  the loop; the planes are reduced once at the end. Elements that do not
  fill a step are counted directly.

  Returns:
    flags int32[32], bits_up int32[nbits], bits_down int32[nbits],
    ulp_cum int32[nbits], hash_t uint32[2], hash_g uint32[2], and the
    reduced `_element_floats` (dict; "ss" entries as (max, scaled sumsq)).
  """
  n = t.shape[0]
  nbits = _bits_of(dtype)
  # Small records use narrower steps (powers of two, 32 .. _WIDTH lanes).
  width = _WIDTH
  while width > 32 and _GROUP * width * 16 > n:
    width //= 2
  per_step = _GROUP * width
  steps = n // per_step
  main = steps * per_step
  k = 2 if nbits == 64 else 1
  nw = 1 + 3 * k
  nplanes = max(1, int(math.ceil(math.log2(_GROUP * (steps + 1) + 1))))
  zero = jnp.zeros((width,), jnp.uint32)
  planes = tuple(tuple(zero for _ in range(nplanes)) for _ in range(nw))
  hsum = [jnp.uint32(0)] * 4

  def add_block(planes, ws):
    out = []
    for i, w in enumerate(ws):
      cnt = _csa_tree([w[j] for j in range(_GROUP)])
      out.append(_accumulate_planes(planes[i], cnt))
    return tuple(out)

  cdt = jnp.float64 if dtype == jnp.float64 else jnp.float32
  fl = None
  if steps == 1:
    tb, gb = t[:main].reshape(_GROUP, width), g[:main].reshape(_GROUP, width)
    ws, hw = _element_words(tb, gb, dtype)
    planes = add_block(planes, ws)
    hsum = [jnp.sum(x, dtype=jnp.uint32) for x in hw]
    fl = _float_reduce(_element_floats(tb, gb, dtype), scaled=False)
  elif steps:

    def body(acc, tg):
      planes, hsh, facc = acc
      ws, hw = _element_words(*tg, dtype)  # each (_GROUP, width)
      hsh = tuple(h + jnp.sum(x, axis=0, dtype=jnp.uint32)
                  for h, x in zip(hsh, hw))
      facc = _float_update(facc, _element_floats(*tg, dtype))
      return (add_block(planes, ws), hsh, facc), None

    init = (planes, tuple(zero for _ in range(4)),
            _float_init((_GROUP, width), cdt))
    (planes, hsh, facc), _ = lax.scan(
        body, init,
        (t[:main].reshape(steps, _GROUP, width),
         g[:main].reshape(steps, _GROUP, width)))
    hsum = [jnp.sum(h, dtype=jnp.uint32) for h in hsh]
    fl = _float_reduce(facc, scaled=True)
  if main < n:
    # The tail's words, zero-padded to one block (zero words count nothing).
    ws, hw = _element_words(t[main:], g[main:], dtype)
    ws = [jnp.pad(w, (0, per_step - (n - main))).reshape(_GROUP, width)
          for w in ws]
    planes = add_block(planes, ws)
    hsum = [a + jnp.sum(x, dtype=jnp.uint32) for a, x in zip(hsum, hw)]
    ft = _float_reduce(_element_floats(t[main:], g[main:], dtype),
                       scaled=False)
    fl = ft if fl is None else _float_merge(fl, ft)
  per_word = [_plane_counts(p) for p in planes]
  flags = per_word[0]

  def cat(ws):
    return jnp.concatenate(ws)[:nbits]

  bits_up = cat(per_word[1:1 + k])
  bits_down = cat(per_word[1 + k:1 + 2 * k])
  ulp_cum = cat(per_word[1 + 2 * k:1 + 3 * k])
  return (flags, bits_up, bits_down, ulp_cum, jnp.stack(hsum[:2]),
          jnp.stack(hsum[2:]), fl)
