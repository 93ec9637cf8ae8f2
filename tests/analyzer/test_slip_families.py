"""The slip grammar's float64 machinery (peat_jax.analyzer.slips).

* every kind's family, with the golden hooks, is the kind's float64
  reference (``peat.analyzer.TRACED_REFERENCES``) to float64 rounding;
* rounding into a narrow format agrees bitwise with the formats' own
  casts (ml_dtypes) and with the injectors' rounding modes;
* the library's bound is its largest member's error, and each member is
  near the function it replaces;
* every slip name round-trips (category, base), and a carried name
  (``only=``) makes that slip alone;
* the search names its own emulation of a slip exactly (the grammar's
  round trip: any failure here is a generator's bug, not the Detector's).
"""

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import core
from peat_jax.analyzer import slips
from peat_jax.analyzer.slips import _library as lib  # pylint: disable=protected-access
from peat_jax.analyzer.slips import _numerics as num  # pylint: disable=protected-access


def _calls(seed):
  """kind -> (args, kwargs) of realistic float64 calls (odd lengths)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(7, 45)) * 1.7 + 0.2
  q = rng.normal(size=(2, 11, 4, 8))
  k = rng.normal(size=(2, 11, 2, 8))
  v = rng.normal(size=(2, 11, 2, 8))
  mask = rng.random((2, 1, 11, 11)) > 0.3
  labels = rng.integers(0, 45, 7).astype(np.int32)
  return [
      ("softmax", (x,), {}), ("log_softmax", (x,), {}),
      ("layer_norm", (x, rng.normal(size=45), rng.normal(size=45)),
       {"eps": 1e-5}),
      ("rms_norm", (x, 1 + 0.1 * rng.normal(size=45)), {"eps": 1e-6}),
      ("rms_norm", (x, None), {"eps": 1e-6}),
      ("attention", (q, k, v), {"is_causal": True}),
      ("attention", (q, k, v, mask), {"scale": 0.3}),
      ("gelu", (x,), {}), ("gelu", (x,), {"approximate": True}),
      ("silu", (x,), {}), ("silu", (x, rng.normal(size=x.shape)), {}),
      ("rope", (q, np.arange(11, dtype=np.int32)), {"theta": 1e4}),
      ("cross_entropy", (x, labels), {}),
      ("cross_entropy", (x, labels), {"reduction": "none"}),
  ]


@pytest.mark.parametrize("case", range(14))
def test_family_with_golden_hooks_is_the_reference(case):
  kind, args, kwargs = _calls(0)[case]
  h = slips.evaluate_family(kind, args, kwargs)
  ref = peat.analyzer.TRACED_REFERENCES[kind]
  r = peat.reference(lambda *a: ref(*a, **kwargs), *args)
  scale = max(float(np.max(np.abs(r))), 1e-300)
  assert np.shape(h) == np.shape(r)
  assert float(np.max(np.abs(h - r))) / scale < 1e-13


@pytest.mark.parametrize("case", range(14))
def test_every_slip_of_every_kind_evaluates(case):
  """No slip of the grammar fails on a call it applies to (the probe
  drops a hypothesis that raises: a bug would go unseen there)."""
  kind, args, kwargs = _calls(1)[case]
  t = slips.evaluate_family(kind, args, kwargs) * 1.01
  every = slips.slip_variants(kind, args, kwargs, t)
  assert every, kind
  for v in every:
    h = np.asarray(v.fn())
    assert h.shape == np.shape(t), v.name
    assert np.isfinite(h).all(), v.name  # moderate inputs: finite outputs


@pytest.mark.parametrize("fmt,dtype", [("bf16", ml_dtypes.bfloat16),
                                       ("fp16", np.float16)])
def test_round_nearest_is_the_formats_cast(fmt, dtype):
  rng = np.random.default_rng(3)
  x = (rng.normal(size=50000) * np.exp(rng.normal(size=50000) * 6)).astype(
      np.float32).astype(np.float64)
  with np.errstate(over="ignore"):
    want = x.astype(np.float32).astype(dtype).astype(np.float64)
  got = num.round_nearest(x, fmt)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", ["tf32", "bf16", "fp16"])
@pytest.mark.parametrize("mode", core.SLIP_MODES)
def test_round_mode_is_the_injectors(fmt, mode):
  rng = np.random.default_rng(4)
  x = (rng.normal(size=20000) * 30).astype(np.float32)
  want = np.asarray(peat.injectors.round_to(jnp.asarray(x), core.FORMATS[fmt],
                                            mode), np.float64)
  got = num.round_mode(x.astype(np.float64), fmt, mode)
  np.testing.assert_array_equal(got, want)


def test_library_bound_is_its_largest_member_error():
  a = np.linspace(-6.0, 6.0, 4001)
  errs = {"gelu_tanh": lib._act_error(lib.gelu_tanh, lib.gelu_erf, a),
          "gelu_sigmoid": lib._act_error(lib.gelu_sigmoid, lib.gelu_erf, a)}
  assert 1e-4 < errs["gelu_tanh"] < 1e-3  # the forms differ by ~2e-4
  assert errs["gelu_sigmoid"] < lib.LIBRARY_BOUND
  x = np.linspace(-20.0, 0.0, 4001)
  for name in ("exp_schraudolph", "exp_poly3", "exp_table64"):
    e = float(np.max(np.abs(lib.MEMBERS[name].fn(x) / np.exp(x) - 1)))
    assert 1e-7 < e <= lib.LIBRARY_BOUND, name
  v = np.exp(np.linspace(-10.0, 10.0, 4001))
  assert np.max(np.abs(lib.rsqrt_newton1(v) * np.sqrt(v) - 1)) < 2e-3
  assert np.max(np.abs(lib.rcp_newton1(v) * v - 1)) < 3e-3
  assert math.isclose(lib.LIBRARY_BOUND, lib._library_bound())


@pytest.mark.parametrize("name,category", [
    ("operand:reverse:1:0,1", "operand"), ("blocked:drop:last:w32", "blocked"),
    ("acc_bf16", "accumulate"), ("eps", "constant"),
    ("gelu_tanh", "approximation"), ("exp_fitted", "approximation"),
    ("inputs_tf32", None), ("kv_group", None)])
def test_names_know_their_category(name, category):
  assert slips.category_of(name) == category


def test_a_base_splits_off_its_name():
  base, own = slips.split_name("inputs_tf32_toward_zero+operand:drop:0:1:"
                               "last:w1")
  assert (base.fmt, base.mode, own) == ("tf32", "toward_zero",
                                        "operand:drop:0:1:last:w1")
  slip = core.Slip("operand", "drop", arg=0, axes=(1,), where="last",
                   width=1, base=base)
  assert slip.name == "inputs_tf32_toward_zero+" + own
  assert slips.split_name("eps") == (None, "eps")


def _dot_call(seed):
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(13, 37)).astype(np.float32)
  b = rng.normal(size=(37, 9)).astype(np.float32)
  kw = {"dimension_numbers": (((1,), (0,)), ((), ())), "precision": None,
        "preferred_element_type": np.float32}
  return a, b, kw


def test_only_makes_the_named_slip_alone():
  a, b, kw = _dot_call(1)
  t = a @ b
  ref = lambda x, y: peat.reference_dot_general(x, y, kw["dimension_numbers"])
  every = slips.slip_variants("dot_general", (a, b), kw, t, ref)
  names = [v.name for v in every]
  assert len(names) == len(set(names)), "slip names are unique"
  for name in ("operand:drop:0:1:last:w1", "blocked:twice:first:w8",
               "acc_bf16", "inputs_tf32+operand:reverse:1:0"):
    got = slips.slip_variants("dot_general", (a, b), kw, t, ref, only=name)
    assert [v.name for v in got] == [name]


def _probe(kind, args, kwargs, t, g, ref):
  return peat.analyzer.port_probe(kind, args, kwargs, t, g, ref(*args),
                                  reference_fn=ref, signature=False)


@pytest.mark.parametrize("name", ["operand:drop:0:1:last:w1",
                                  "operand:reverse:1:0",
                                  "blocked:twice:first:w16",
                                  "acc_fp16"])
def test_the_search_names_its_own_emulation_of_a_dot_slip(name):
  a, b, kw = _dot_call(2)
  ref = lambda x, y: peat.reference_dot_general(x, y, kw["dimension_numbers"])
  g = (a.astype(np.float64) @ b).astype(np.float32)
  v, = slips.slip_variants("dot_general", (a, b), kw, g, ref, only=name)
  t = np.asarray(v.fn(), np.float64).astype(np.float32)
  found = _probe("dot_general", (a, b), kw, t, g, ref)
  # The same slip read on the other operand predicts the same output: it
  # is named beside it.
  named = [found["name"]] + found["equivalent"]
  assert found["explains"] and name in named, found["evidence"]
  assert found["runners_up"], "the evidence shows the next best"


@pytest.mark.parametrize("kind,name", [
    ("layer_norm", "operand:swap:1,2"), ("layer_norm", "ddof"),
    ("softmax", "blocked:norescale:sum:w16"), ("softmax", "temperature"),
    ("attention", "operand:mask_shift:+1"), ("attention", "fill"),
    ("cross_entropy", "smoothing"), ("rms_norm", "rsqrt_newton1"),
    ("gelu", "gelu_sigmoid"), ("silu", "beta")])
def test_the_search_names_its_own_emulation_of_a_composite_slip(kind, name):
  calls = {k: (a, kw) for k, a, kw in _calls(5)}
  calls["attention"] = _calls(5)[5][1:]
  args, kwargs = calls[kind]
  args = tuple(a.astype(np.float32) if getattr(a, "dtype", None) == np.float64
               else a for a in args)
  ref = lambda *a: peat.reference(
      lambda *b: peat.analyzer.TRACED_REFERENCES[kind](*b, **kwargs), *a)
  g = np.asarray(ref(*args)).astype(np.float32)
  truth = {"ddof": 1.0, "temperature": 1.3, "fill": -12.0,
           "smoothing": 0.1, "beta": 1.702}
  if name in truth:
    t = slips.evaluate_family(kind, args, kwargs,
                              slips.Hooks(params={name: truth[name]}))
  else:
    v, = slips.slip_variants(kind, args, kwargs, g, None, only=name)
    t = v.fn()
  t = np.asarray(t, np.float64).astype(np.float32)
  found = _probe(kind, args, kwargs, t, g, ref)
  assert found["explains"] and found["name"] == name, found["evidence"]
  if name in truth:
    assert found["estimate"] == pytest.approx(truth[name], rel=0.02)
