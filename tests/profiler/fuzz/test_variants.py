"""Fuzz variants of captured inputs: shapes, masks, magnitudes, determinism.

Unit tests of ``peat_jax.profiler.fuzz._variants`` / ``_attention`` on
seeded inputs (no training run): what each family builds, that a cut keeps
real slices and a growth draws only the input's own values, that a variant
is the same arrays whatever order it is built in, and that masks keep their
structure.
"""

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from peat_jax.core import PeatError
from peat_jax.profiler.fuzz import _attention as A
from peat_jax.profiler.fuzz import _lattice as L
from peat_jax.profiler.fuzz import _variants as V

_DN = (((2,), (0,)), ((), ()))


def _x(shape, seed=0, dtype=np.float32):
  r = np.random.default_rng(seed)
  x = r.standard_normal(shape) * 2.0 + 0.25
  return x.astype(np.float32).astype(dtype)


def _golden_dot(call):
  return lax.dot_general(*[np.asarray(a) for a in call.args],
                         call.kwargs["dimension_numbers"])


def _dot_base(dtype=np.float32):
  return V.Call((_x((2, 40, 128), 1, dtype), _x((128, 384), 2, dtype)),
                {"dimension_numbers": _DN, "precision": None,
                 "preferred_element_type": None})


def _by_name(plans):
  return {p.name: p for p in plans}


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_cut_keeps_real_slices_and_growth_draws_real_values(dtype):
  x = _x((6, 10), 3, dtype)
  rng = np.random.default_rng(0)
  cut = V.resize([x], [1], 4, rng)[0]
  cols = {x[:, j].tobytes(): j for j in range(10)}
  order = [cols[cut[:, j].tobytes()] for j in range(4)]
  assert order == sorted(order)  # real columns, in order
  grown = V.resize([x], [1], 25, np.random.default_rng(1))[0]
  assert grown.shape == (6, 25)
  np.testing.assert_array_equal(grown[:, :10], x)
  real = set(np.asarray(x, np.float64).ravel().tolist())
  assert set(np.asarray(grown, np.float64).ravel().tolist()) <= real
  assert np.count_nonzero(np.asarray(grown, np.float64)) == grown.size


def test_coupled_axes_share_their_cut():
  a, b = _x((3, 50), 4), _x((50, 7), 5)
  a2, b2 = V.resize([a, b], [1, 0], 20, np.random.default_rng(2))
  idx = [int(np.where((a.T == c).all(1))[0][0]) for c in a2.T]
  np.testing.assert_array_equal(b2, b[idx])


def test_lattice_takes_every_tile_class_and_seeded_draws():
  got = L.lattice(64, rng=np.random.default_rng(3))
  want = {1, 2, 3}
  for j in range(3, 17):
    p = 1 << j
    want |= {p - 1, p, p + 1, p + p // 2}
  want.discard(64)
  assert want <= set(got) and 64 not in got
  assert len(got) == len(set(got)) and max(got) <= L.LONGEST
  drawn = set(got) - want
  assert len(drawn) <= L.RANDOM_DRAWS and all(4 <= n for n in drawn)
  assert L.lattice(64, rng=np.random.default_rng(3)) == got  # seeded
  # The large bands first, then the tiles: a budget of a dozen sees 1,
  # one past 128, 4096, 65536, 1024, 32768, 16384, and 192, 127, 128, 2.
  assert got[:12] == [1, 129, 4097, 65537, 192, 1025, 32769, 16385, 127,
                      128, 2, 7]
  assert L.lattice(5, longest=16) == [1, 2, 7, 8, 9, 12, 3, 15, 16]


def test_dot_general_plans_shapes_and_memory():
  base = _dot_base()
  plans = _by_name(V.primitive_plans("dot_general", base, _golden_dot))
  assert {"batch=1", "batch=3", "batch=7", "rows=1", "len=16385",
          "len=65536", "scale=edge"} <= set(plans)
  assert "len=1048576" not in plans  # the output loses the axis
  one = plans["rows=1"].make(np.random.default_rng(0))
  assert one.args[0].shape == (1, 1, 128) and one.args[1].shape == (128, 384)
  big = plans["len=65536"].make(np.random.default_rng(0))
  assert big.args[0].shape[2] == big.args[1].shape[0] == 65536
  assert all(a.size <= V.MAX_ELEMENTS for a in big.args)
  out = _golden_dot(big)
  assert out.shape[-1] == big.args[1].shape[1]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_variants_are_the_same_arrays_in_any_order(dtype):
  base = _dot_base(dtype)
  names = ["len=4097", "batch=3", "rows=1", "scale=edge"]
  first = {}
  for name in names:
    p = _by_name(V.primitive_plans("dot_general", base, _golden_dot))[name]
    first[name] = p.make(V.rng_of(7, "site", name))
  for name in reversed(names):
    p = _by_name(V.primitive_plans("dot_general", base, _golden_dot))[name]
    again = p.make(V.rng_of(7, "site", name))
    for a, b in zip(first[name].args, again.args):
      assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
  other = _by_name(V.primitive_plans("dot_general", base, _golden_dot))[
      "len=4097"].make(V.rng_of(8, "site", "len=4097"))
  assert other.args[0].tobytes() != first["len=4097"].args[0].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_magnitudes_reach_the_edge_with_a_finite_golden(dtype):
  base = _dot_base(dtype)
  plans = _by_name(V.primitive_plans("dot_general", base, _golden_dot))
  up = plans["scale=edge"].make(None)
  out = np.asarray(_golden_dot(up), np.float64)
  assert np.isfinite(out).all()
  fmax = float(ml_dtypes.finfo(dtype).max)
  assert np.abs(out).max() > fmax / 2 ** 40  # far above the captured scale
  den = [p for n, p in plans.items() if n.startswith("scale=2^-")][0]
  x = np.abs(np.asarray(den.make(None).args[0], np.float64))
  tiny = float(ml_dtypes.finfo(dtype).smallest_normal)
  assert x.max() <= tiny and np.count_nonzero(x) > 0


def test_magnitude_scale_ignores_mask_fills():
  x = _x((4, 8, 16), 6)
  x[..., 8:] = np.finfo(np.float32).min  # a masked logit
  plans = _by_name(V.composite_plans(
      "softmax", V.Call((x,), {}),
      lambda c: jax.nn.softmax(np.asarray(c.args[0]), axis=-1)))
  den = [n for n in plans if n.startswith("scale=2^-")][0]
  assert int(den.split("^")[1]) > -140  # from the real logits, not the fill


def test_layer_norm_length_couples_scale_and_bias():
  x, s, b = _x((2, 5, 128), 1), _x((128,), 2), _x((128,), 3)
  plans = _by_name(V.composite_plans("layer_norm", V.Call((x, s, b, 1e-6),
                                                          {}), None))
  call = plans["len=4097"].make(np.random.default_rng(0))
  assert call.args[0].shape[-1] == call.args[1].shape[0] == 4097
  assert call.args[2].shape == (4097,) and call.args[3] == 1e-6
  wide = plans["len=1048576"].make(np.random.default_rng(0))
  assert wide.args[0].shape == (1, 1, 1 << 20)  # one row


def test_attention_variants_keep_the_mask_structure():
  b, t, h, d = 2, 40, 4, 32
  q, k, v = _x((b, t, h, d), 1), _x((b, t, h, d), 2), _x((b, t, h, d), 3)
  mask = np.broadcast_to(A.causal(t, t), (1, 1, t, t)).copy()
  assert A.mask_kind(mask) == "causal"
  plans = _by_name(A.plans(V.Call((q, k, v, mask), {}), None))
  assert {"q_len<kv_len", "q_len>kv_len", "len=64", "masked_rows",
          "packed=2", "kv_heads=2", "kv_heads=1", "head_dim=64",
          "head_dim=128", "head_dim=256", "batch=1", "len=128"} <= set(plans)
  short = plans["q_len<kv_len"].make(np.random.default_rng(0))
  assert short.args[0].shape[1] == 20 and short.args[1].shape[1] == 40
  np.testing.assert_array_equal(short.args[3][0, 0], A.causal(20, 40, 20))
  rows = plans["masked_rows"].make(np.random.default_rng(0))
  full = ~rows.args[3][0, 0].any(-1)
  assert 1 <= full.sum() <= t // 8
  packed = plans["packed=2"].make(np.random.default_rng(0)).args[3][0, 0]
  assert not packed[30, :20].any() and packed[30, 20:31].all()
  gqa = plans["kv_heads=2"].make(np.random.default_rng(0))
  assert gqa.args[1].shape[2] == gqa.args[2].shape[2] == 2
  hd = plans["head_dim=256"].make(np.random.default_rng(0))
  assert {a.shape[3] for a in hd.args[:3]} == {256}
  n64 = plans["len=64"].make(np.random.default_rng(0))
  assert n64.args[0].shape[1] % 128 == 64 == n64.args[1].shape[1] % 128


def test_interleave_covers_every_family_first():
  plans = V.primitive_plans("dot_general", _dot_base(), _golden_dot)
  out = V.interleave(plans)
  assert [p.family for p in out[:7]] == ["batch", "rows", "length",
                                         "joint", "tail", "features",
                                         "magnitude"]
  # Started at another family, the same plans, that family first.
  later = V.interleave(plans, start=2)
  assert [p.family for p in later[:8]] == ["length", "joint", "tail",
                                           "features", "magnitude",
                                           "denormal", "batch", "rows"]
  assert sorted(p.name for p in later) == sorted(p.name for p in plans)
  # Within a family every axis comes before an axis' second length.
  rows = [p.name for p in out if p.family == "rows"]
  assert {rows[0].split("=")[0], rows[1].split("=")[0]} == {"m", "rows"}
  assert sorted(p.name for p in out) == sorted(p.name for p in plans)


def test_unknown_kind_is_refused():
  with pytest.raises(PeatError, match="no fuzz variants for composite kind"):
    V.composite_plans("my_kernel", V.Call((_x((2, 3)),), {}), None)


def _attention_site():
  from peat_jax.sites import _discovery  # pylint: disable=import-outside-toplevel
  return _discovery.Site("fwd/Gpt/attention:0", "attention", "fwd", "Gpt",
                         0, True, (), (), (), (), ("composite",), False, ())


def _masked_rows_case():
  from peat_jax.models import layers  # pylint: disable=import-outside-toplevel
  b, t, h, d = 2, 40, 4, 32
  q, k, v = _x((b, t, h, d), 1), _x((b, t, h, d), 2), _x((b, t, h, d), 3)
  mask = np.broadcast_to(A.causal(t, t), (1, 1, t, t)).copy()
  rows = _by_name(A.plans(V.Call((q, k, v, mask), {}), None))["masked_rows"]
  call = rows.make(np.random.default_rng(0))
  golden = np.asarray(layers.attention(*call.args))
  full = ~np.broadcast_to(call.args[3], (b, h, t, t)).any(-1)  # [B, H, T]
  return call, golden, np.transpose(full, (0, 2, 1))  # [B, T, H]


def test_zeros_in_fully_masked_rows_are_a_convention_not_an_error():
  """torch and flash-attention write 0 where every key is masked, jax
  averages v: a KUT with exactly that difference is compared on the other
  rows; any other value in those rows is compared as it is."""
  from peat_jax.profiler.fuzz import _fuzz  # pylint: disable=import-outside-toplevel
  call, golden, rows = _masked_rows_case()
  assert rows.any() and np.all(golden[rows] != 0)  # jax averages v there
  torch_like = golden.copy()
  torch_like[rows] = 0.0
  torch_like[~rows] *= np.float32(1 + 2 ** -20)  # the other rows' noise
  out, note = _fuzz._masked_rows_convention(  # pylint: disable=protected-access
      _attention_site(), call, [golden], [torch_like])
  assert note and f"{int(rows.sum())} fully masked" in note
  np.testing.assert_array_equal(out[0][rows], golden[rows])
  np.testing.assert_array_equal(out[0][~rows], torch_like[~rows])
  for bad in (np.nan, 1.0):  # NaN, or garbage, in the masked rows
    wrong = golden.copy()
    wrong[rows] = bad
    out, note = _fuzz._masked_rows_convention(  # pylint: disable=protected-access
        _attention_site(), call, [golden], [wrong])
    assert note is None and out[0] is wrong


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_scaling_keeps_mask_fills_and_non_finite_values(dtype):
  """A mask fill scaled by 2^-129 would be -0.5 (a weight of its own);
  fills and infinities stay, every other value is scaled exactly."""
  fill = ml_dtypes.finfo(dtype).min
  x = _x((4, 16), 5, dtype)
  x[:, 8:] = fill
  x[0, 0] = -np.inf
  for k in (-129, -20, 40):
    y = V.scaled(x, k)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y[:, 8:], x[:, 8:])
    assert y[0, 0] == -np.inf
    body = x[1:, :8].astype(np.float64) * 2.0 ** k
    np.testing.assert_array_equal(y[1:, :8], body.astype(dtype))
