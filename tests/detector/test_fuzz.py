"""Fuzzing analyze -> detect and inject over shapes, dtypes, special values.

Random shapes from a small set (compilation, not analysis, dominates the
cost: each shape/dtype compiles once), every float dtype, and values drawn
across the whole range with special values mixed in: NaN, +-Inf, subnormals,
-0.0, the format's max and smallest normal. Valid inputs must never raise;
invalid ones (mismatched shapes or dtypes, integer or empty arrays, unknown
models, models of the computation) may raise the documented PeatError only.
The slow tests run 10,000 examples in all (issue 10, part 4).
"""

import hypothesis
import hypothesis.strategies as st
import jax
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat

DTYPES = (np.float32, ml_dtypes.bfloat16, np.float16, np.float64)
FAST_SHAPES = ((3, 7),)
SLOW_SHAPES = ((5,), (3, 7), (2, 3, 16))
MODELS = set(peat.ERROR_MODELS) | {"unknown"}
VERDICTS = {"pass", "warn", "fail"}


def _specials(dtype) -> np.ndarray:
  fi = ml_dtypes.finfo(dtype)
  return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, float(fi.max),
                   -float(fi.max), float(fi.smallest_subnormal),
                   -float(fi.smallest_subnormal), float(fi.smallest_normal),
                   1.0, -1.0], np.float64)


def _values(rng, n, dtype, specials: int) -> np.ndarray:
  """float64 values spanning the dtype's range, with special values."""
  fi = ml_dtypes.finfo(dtype)
  top = int(np.log2(float(fi.max))) - 1
  low = int(np.log2(float(fi.smallest_subnormal)))
  x = rng.standard_normal(n) * np.exp2(
      rng.integers(max(low, -60), min(top, 60), n).astype(np.float64))
  pos = rng.choice(n, size=min(specials, n), replace=False)
  x[pos] = rng.choice(_specials(dtype), size=len(pos))
  return x


def _bitflip(rng, a: np.ndarray, count: int) -> np.ndarray:
  bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
  u = a.copy().view(bits).reshape(-1)
  for _ in range(count):
    i = rng.integers(u.size)
    u[i] ^= bits(1) << bits(rng.integers(8 * a.dtype.itemsize))
  return u.view(a.dtype).reshape(a.shape)


@st.composite
def pairs(draw, shapes, dtypes=DTYPES):
  """(test, golden, reference or None, context or None)."""
  dtype = draw(st.sampled_from(dtypes))
  shape = draw(st.sampled_from(shapes))
  n = int(np.prod(shape))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  g64 = _values(rng, n, dtype, draw(st.integers(0, 6)))
  with np.errstate(all="ignore"):
    g = g64.astype(dtype).reshape(shape)
    mode = draw(st.sampled_from(["equal", "noise", "scaled", "independent",
                                 "bitflip", "all_special"]))
    if mode == "equal":
      t = g.copy()
    elif mode == "noise":
      t = (g64 * (1 + 1e-3 * rng.standard_normal(n))).astype(dtype)
    elif mode == "scaled":
      t = (g64 * draw(st.sampled_from([2.0, -1.0, 1e30, 0.0]))).astype(dtype)
    elif mode == "independent":
      t = _values(rng, n, dtype, draw(st.integers(0, 6))).astype(dtype)
    elif mode == "bitflip":
      t = _bitflip(rng, g, draw(st.integers(1, 3)))
    else:
      t = rng.choice(_specials(dtype), size=n).astype(dtype)
    t = np.asarray(t).reshape(shape)
    ref = None
    if draw(st.booleans()):
      ref = g64.reshape(shape) * (1 + 1e-9 * rng.standard_normal(shape))
  ctx = draw(st.sampled_from([None, {"kernel": "dot_general",
                                     "reduction": int(rng.integers(1, 4096))},
                              {"kernel": "softmax"}]))
  return t, g, ref, ctx


def _check_analyze_detect(t, g, ref, ctx):
  sig = peat.analyze(t, g, ref)
  n = t.size
  with np.errstate(all="ignore"):
    t64, g64 = t.astype(np.float64), g.astype(np.float64)
  assert int(sig.n) == n
  assert 0 <= int(sig.n_bit_equal) <= n
  assert int(sig.n_nan_test) == int(np.isnan(t64).sum())
  assert int(sig.n_nan_golden) == int(np.isnan(g64).sum())
  assert int(sig.n_inf_test) == int(np.isinf(t64).sum())
  share = float(sig.share_differ)
  assert 0.0 <= share <= 1.0
  d = peat.detect(sig, context=ctx)
  assert d.model in MODELS, d.model
  assert 0.0 <= float(d.confidence) <= 1.0
  assert d.verdict in VERDICTS
  assert isinstance(d.evidence, str) and d.evidence
  if np.array_equal(t.view(np.uint8), g.view(np.uint8)):
    assert int(sig.n_bit_equal) == n and d.model == "exact"
  return sig, d


@st.composite
def invalid(draw):
  """Inputs analyze must refuse with PeatError."""
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  g = rng.standard_normal((3, 7)).astype(np.float32)
  kind = draw(st.sampled_from(["shape", "dtype", "int", "empty", "ref"]))
  if kind == "shape":
    return g[:, :6], g, None
  if kind == "dtype":
    return g.astype(np.float16), g, None
  if kind == "int":
    return g.astype(np.int32), g.astype(np.int32), None
  if kind == "empty":
    return g[:0], g[:0], None
  return g, g, np.zeros((2, 2))


def _params(name, rng, x) -> dict:
  """Random parameters for the models that require some (others: defaults)."""
  if name == "stuck_at":
    return {"bit": int(rng.integers(8 * x.dtype.itemsize)),
            "value": int(rng.integers(2))}
  return {}


def _check_inject(name, seed, x, **params):
  key = jax.random.key(seed)
  try:
    y = peat.inject(name, key, x, **params)
  except peat.PeatError as err:
    # Documented refusals: a model of the computation, an unknown name,
    # parameters the array cannot take (a count beyond its size, an axis it
    # lacks), each saying what was expected.
    assert "expected" in str(err) or "injecting_kernel" in str(err), err
    return None
  y = np.asarray(y)
  assert y.shape == x.shape and y.dtype == x.dtype
  if name == "exact":
    assert np.array_equal(y.view(np.uint8), np.asarray(x).view(np.uint8))
  again = np.asarray(peat.inject(name, key, x, **params))
  assert np.array_equal(y.view(np.uint8), again.view(np.uint8))  # same key
  return y


# ------------------------------------------------------------------ fast


@hypothesis.settings(max_examples=30, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(pairs(FAST_SHAPES, dtypes=(np.float32,)))
def test_fuzz_analyze_detect_fast(pair):
  t, g, _, ctx = pair
  _check_analyze_detect(t, g, None, ctx)


@hypothesis.settings(max_examples=10, deadline=None, derandomize=True)
@hypothesis.given(invalid())
def test_fuzz_invalid_input_raises_peat_error_only(args):
  with pytest.raises(peat.PeatError):
    peat.analyze(*args)


@hypothesis.settings(max_examples=12, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(st.sampled_from(["exact", "bitflip", "nan", "zero",
                                   "accumulation:bf16", "no_such_model"]),
                  st.integers(0, 2**31 - 1))
def test_fuzz_inject_fast(name, seed):
  rng = np.random.default_rng(seed)
  x = _values(rng, 21, np.float32, 4).astype(np.float32).reshape(3, 7)
  y = _check_inject(name, seed, x)
  if name in ("accumulation:bf16", "no_such_model"):
    assert y is None  # documented refusals
  else:
    t = np.asarray(y)
    _check_analyze_detect(t, x, None, None)


# ------------------------------------------------------------------ slow


@pytest.mark.slow
@hypothesis.settings(max_examples=6000, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(pairs(SLOW_SHAPES))
def test_fuzz_analyze_detect_slow(pair):
  _check_analyze_detect(*pair)


@pytest.mark.slow
@hypothesis.settings(max_examples=4000, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(st.sampled_from(peat.ERROR_MODELS),
                  st.sampled_from(SLOW_SHAPES),
                  st.sampled_from(DTYPES[:3]), st.integers(0, 2**31 - 1),
                  st.integers(0, 6))
def test_fuzz_inject_then_analyze_detect_slow(name, shape, dtype, seed,
                                              specials):
  rng = np.random.default_rng(seed)
  n = int(np.prod(shape))
  with np.errstate(all="ignore"):
    x = _values(rng, n, dtype, specials).astype(dtype).reshape(shape)
  y = _check_inject(name, seed, x, **_params(name, rng, x))
  if name in peat.COMPUTATION_ERROR_MODELS and (
      name not in peat.TENSOR_ERROR_MODELS):
    assert y is None
  if name == "stuck_at":
    assert y is not None  # with its required parameters it always applies
  if y is not None:
    _check_analyze_detect(y, x, None, None)
