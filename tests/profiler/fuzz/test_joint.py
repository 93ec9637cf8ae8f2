"""Joint variants, the budget's order and the bent cap.

Unit tests of ``peat_jax.profiler.fuzz._lattice`` / ``_variants`` /
``_fuzz._order`` on seeded inputs, no training run: a call whose every
axis is a multiple of 8 reaches element counts of every residue modulo 8,
16, 32 and 128 only through joint variants; a joint variant is the shape
its name says, within the cap, the same arrays on a rebuild; an axis
reaches one past 1,024, 4,096, 16,384, 32,768 and 65,536 among its first
lengths; a row variant keeps the kernel's width where the bent cap
allows; and a site making the same call as an earlier one runs after
every first site's variants.
"""

import math
import re
from types import SimpleNamespace

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from peat_jax.profiler.fuzz import _coverage as C
from peat_jax.profiler.fuzz import _fuzz as F
from peat_jax.profiler.fuzz import _lattice as L
from peat_jax.profiler.fuzz import _variants as V

_DN = (((2,), (0,)), ((), ()))


def _x(shape, seed=0, dtype=np.float32):
  r = np.random.default_rng(seed)
  return (r.standard_normal(shape) * 2.0 + 0.25).astype(np.float32).astype(
      dtype)


def _gelu(call):
  return jax.nn.gelu(np.asarray(call.args[0], np.float32))


def _golden_dot(call):
  return lax.dot_general(*[np.asarray(a) for a in call.args],
                         call.kwargs["dimension_numbers"])


def _rowwise(dtype):
  """A GELU site of every axis a multiple of 8: [8, 16, 64]."""
  return "gelu", V.Call((_x((8, 16, 64), 1, dtype),), {})


def _gemm(dtype):
  return "dot_general", V.Call(
      (_x((2, 40, 128), 1, dtype), _x((128, 384), 2, dtype)),
      {"dimension_numbers": _DN, "precision": None,
       "preferred_element_type": None})


def _plans(kernel, call):
  if kernel == "gelu":
    return V.composite_plans("gelu", call, _gelu)
  return V.primitive_plans(kernel, call, _golden_dot)


def _named_shape(name: str, axes, call) -> list[tuple[int, ...]]:
  """The input shapes a joint variant's name says (axes it leaves out at
  one, or at their own length in a draw)."""
  said = dict((a, int(n)) for a, n in re.findall(r"([a-z_]+\d*)=(\d+)",
                                                 name))
  draw = name.startswith("draw=")
  shapes = [list(x.shape) for x in call.args]
  for ax in axes:
    n = said.get(ax.name, ax.size if draw else 1)
    for i, a in ax.where:
      shapes[i][a] = n
  return [tuple(s) for s in shapes]


def test_large_bands_come_early():
  first = L.lattice(64)[:16]  # one past each edge among the first eight
  for edge in (1024, 4096, 1 << 14, 1 << 15, 1 << 16):
    assert edge + 1 in first, (edge, first)
  assert first[:8] == [1, 129, 4097, 65537, 192, 1025, 32769, 16385]
  assert first[8:16] == [127, 128, 2, 7, 8, 9, 12, 3]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("make", [_rowwise, _gemm])
def test_only_joint_variants_reach_every_element_count_residue(make, dtype):
  kernel, call = make(dtype)
  plans = _plans(kernel, call)
  axes = (V.composite_axes(kernel, call) if kernel == "gelu" else
          V.primitive_axes(kernel, call)).axes()
  joint = [p for p in plans if p.family in ("joint", "tail")]
  counts = {p.name: math.prod(_named_shape(p.name, axes, call)[0])
            for p in joint}
  for m in (8, 16, 32, 128):
    assert {c % m for c in counts.values()} == set(range(m)), m
  # One axis at a time leaves every count of the GELU a multiple of 8
  # (its other axes keep 8 and 16 and 64): the escape joint variants close.
  if kernel == "gelu":
    single = [p for p in plans if p.family in ("batch", "rows", "length")
              and int(p.name.split("=")[1]) < 300]
    assert len(single) > 40
    assert {p.make(np.random.default_rng(0)).args[0].size % 8
            for p in single} == {0}
  # What the name says is what is built, within the cap, in the dtype.
  small = [p for p in joint if max(counts[p.name], 1) <= 5000][:40]
  small += [p for p in joint if p.name.startswith("draw=")]
  assert any(p.name.startswith("draw=") for p in small)
  for p in small:
    built = p.make(V.rng_of(0, "site", p.name))
    assert [x.shape for x in built.args] == _named_shape(p.name, axes,
                                                        call), p.name
    assert all(x.size <= V.MAX_ELEMENTS and x.dtype == dtype
               for x in built.args)
    again = p.make(V.rng_of(0, "site", p.name))
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip(built.args, again.args))


def test_the_tail_family_takes_the_residues_in_order():
  kernel, call = _rowwise(np.float32)
  tail = [p for p in _plans(kernel, call) if p.family == "tail"]
  counts = [math.prod(p.make(np.random.default_rng(0)).args[0].shape)
            for p in tail[:32]]
  for m in (8, 16, 32):
    assert {c % m for c in counts[:m]} == set(range(m)), m
  assert all(p.name.endswith(",rest=1") for p in tail)


def test_joint_draws_are_seeded_by_the_call():
  kernel, call = _gemm(np.float32)
  names = lambda plans: [p.name for p in plans if p.name.startswith("draw")]
  first = names(_plans(kernel, call))
  assert len(first) == L.JOINT_DRAWS == len(set(first))
  assert names(_plans(kernel, call)) == first
  assert names(V.primitive_plans("dot_general", call, _golden_dot,
                                 seed=1)) != first


@pytest.mark.parametrize("width,kept", [(64, 64), (1024, 341)])
def test_a_row_variant_keeps_the_width_where_the_bent_cap_allows(width,
                                                                 kept):
  call = V.Call((_x((4, 2, width), 3),), {})
  plans = {p.name: p for p in V.composite_plans("gelu", call, _gelu)}
  rows = plans["batch=98304"].make(np.random.default_rng(0)).args[0]
  assert rows.shape == (98304, 1, kept)
  assert rows.size <= L.BENT_ELEMENTS
  # A variant of the width itself cuts the rows to the cap, as before.
  wide = plans["len=98304"].make(np.random.default_rng(0)).args[0]
  assert wide.shape[-1] == 98304 and wide.size <= V.MAX_ELEMENTS


def _target(name, shape, n_plans=3):
  call = V.Call((_x(shape),), {})
  plans = [V.Plan(f"len={k}", "length", None) for k in range(n_plans)]
  site = SimpleNamespace(kernel="gelu", composite=True, name=name)
  return F.Target({}, site, call, None, plans)


def test_a_repeated_call_runs_after_every_first_site():
  a, b = _target("a", (2, 8)), _target("b", (2, 16))
  a2, b2 = _target("a2", (2, 8)), _target("b2", (2, 16))
  order = [(t.site.name, p.name) for t, p in F._order([a, a2, b, b2])]
  assert [s for s, _ in order[:6]] == ["a", "b"] * 3
  assert {s for s, _ in order[6:]} == {"a2", "b2"}
  assert len(order) == 12
  assert C.shape_key(a) == C.shape_key(a2) != C.shape_key(b)


def test_coverage_counts_classes_bands_and_element_residues():
  t = _target("a", (4, 8))
  t = t._replace(plans=[V.Plan(n, f, None) for n, f in (
      ("len=1", "length"), ("len=129", "length"), ("len=65537", "length"),
      ("len=130,rest=1", "tail"), ("len=131,rest=1", "tail"),
      ("draw=0(batch=3,len=129)", "joint"), ("scale=edge", "magnitude"))])
  ran = [{"site": "a", "variant": n, "family": f, "shapes": s}
         for n, f, s in (("len=129", "length", [[4, 129]]),
                         ("len=65537", "length", [[4, 65537]]),
                         ("len=130,rest=1", "tail", [[1, 130]]),
                         ("min:len=129:len=1", "length", [[1, 1]]),
                         ("draw=0(batch=3,len=129)", "joint", [[3, 129]]))]
  cov = C.coverage([t], ran)
  length, tail, joint = cov["length"], cov["tail"], cov["joint"]
  assert (length.planned, length.ran) == (3, 2)  # the shrunk one not
  assert length.residues == (1, 1)  # 1, 129 and 65537 are 1 mod 128
  assert length.bands == (2, 3) and length.large == (1024, 4096, 32768,
                                                       65536)
  assert length.element_residues[8] == 1  # 4 * 129 and 4 * 65537: 4 mod 8
  assert tail.residues == (1, 2) and tail.element_residues[128] == 1
  assert joint.residues == (2, 2) and joint.bands == (2, 2)
  assert cov["magnitude"].residues == (0, 0)
  line = C.coverage_line(cov)
  assert line.startswith("coverage: length 2/3 (1/1 residues, 2/3 bands, "
                         "past 65536)")


def test_rope_positions_follow_their_tokens_in_every_variant():
  x = _x((2, 64, 4, 32), 5)
  call = V.Call((x, np.arange(64, dtype=np.int32)), {"theta": 10000.0})
  plans = V.composite_plans("rope", call, lambda c: np.asarray(c.args[0]))
  for name in ("batch=65537", "heads=65537", "len=4097", "batch=3,rest=1",
               "head_dim=2,rest=1"):
    c = next(p for p in plans if p.name == name).make(
        np.random.default_rng(0))
    assert c.args[1].shape == (c.args[0].shape[1],), name
