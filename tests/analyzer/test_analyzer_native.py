"""The Analyzer's native CPU pass (csrc/signature.cc) against the pure-JAX pass.

Both produce a `SignatureState`. Counts, histograms, bit counts, hashes and
every other integer field must be equal; float fields must agree within the
tolerances documented in docs/signature.md ("Native pass"), because the two
sum in different orders, compute t / g and |d| / |g| from 1 / g (within
~1 ulp) and use different log2 implementations:

* maxima and minima: 2**-21 relative;
* nonnegative sums and scaled sums of squares: 1e-4 relative;
* signed sums: 1e-4 of a bound on the sum of the terms' magnitudes (for
  err_sum: sum |d|; mag_err_sum: rel_sum; logratio_sum: the float64 sum of
  |log2|t|| + |log2|g|| over its elements, times 2**-20 for float32 logs;
  slope sums: Cauchy-Schwarz bounds from sxx, syy and the element count);
* non-finite values (Inf, NaN) equal.

The pure-JAX pass gets its bit patterns from a separate executable
(`_bits_jit`), as the batched form does: see `_accumulate_bits`.
"""

import math
import os
import subprocess
import sys
import threading
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from peat_jax import analyzer
from peat_jax.analyzer.signature import _api as api
from peat_jax.analyzer.signature import _bits as bits
from peat_jax.analyzer.signature import _checks as checks
from peat_jax.analyzer.signature import _native as native_pass
from peat_jax.analyzer.signature import _signature as signature
from peat_jax.kernels import _ffi

DTYPES = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float64": np.float64,
}
# A subnormal of each dtype.
SUBNORMAL = {"float32": 1e-40, "bfloat16": 1e-40, "float16": 3e-6,
             "float64": 1e-310}
RTOL_SUM = 1e-4
RTOL_MAX = 2.0**-21
F = analyzer.SignatureState._fields
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}

_MAXMIN = ("row_abs_max", "rel_max", "g_absmax", "ratio_min", "ratio_max",
           "ref_t_max", "ref_g_max", "zeroed_g_max")
_NONNEG = ("row_abs_sum", "col_abs_sum", "rel_sum", "ref_t_rel_sum",
           "ref_g_rel_sum", "row_abs_sqs", "rel_sqs", "g_sqs", "ref_t_sqs",
           "ref_g_sqs")


def _x64(dtype):
  return jax.enable_x64(np.dtype(dtype) == np.float64)


def _pair(name, shape, seed):
  """A seeded (test, golden, reference) triple with special values.

  Rows cycle through relative errors 0, 1e-6, 1e-3 and 0.5 (fast path,
  log1p series, full logs); magnitudes stay below 448 except in the last
  third of the rows (exponents +-30: the general path); about one element
  in 300 of each array is special (0, -0, NaN, +-Inf, subnormal, 448,
  65504, 1e5). At most one element has a huge relative error (golden 0 or
  subnormal, test finite and nonzero): float sums of several such terms
  overflow in an order-dependent way.
  """
  dtype = DTYPES[name]
  rng = np.random.default_rng(seed)
  n = math.prod(shape)
  rows = max(1, n // shape[-1])
  g = rng.standard_normal(n) * np.exp2(rng.integers(-8, 5, n))
  row = np.arange(n) // max(1, n // rows)
  wide = row >= 2 * rows // 3
  g = np.where(wide, g * np.exp2(rng.integers(-30, 30, n)), g)
  noise = np.array([0.0, 1e-6, 1e-3, 0.5])[row % 4]
  t = g * (1 + noise * rng.standard_normal(n))
  specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, SUBNORMAL[name],
                       -SUBNORMAL[name], 448.0, 65504.0, 1e5])
  for arr in (t, g):
    pos = rng.choice(n, size=min(n, max(len(specials), n // 300)),
                     replace=False)
    arr[pos] = np.resize(specials, pos.size)
  with np.errstate(over="ignore", invalid="ignore"):
    tt, gg = t.astype(dtype), g.astype(dtype)
  tiny = float(ml_dtypes.finfo(dtype).tiny)
  gd, td = gg.astype(np.float64), tt.astype(np.float64)
  huge = np.nonzero((np.abs(gd) < tiny) & np.isfinite(td) & (td != 0))[0]
  tt[huge[1:]] = gg[huge[1:]]
  ref = np.where(np.isfinite(gd), gd * (1 + 1e-9 * rng.standard_normal(n)),
                 gd)
  return tt.reshape(shape), gg.reshape(shape), ref.reshape(shape)


def _states(t, g, ref):
  """(native, pure-JAX) SignatureStates of one record."""
  with _x64(t.dtype):
    hi = lo = None
    if ref is not None:
      hi, lo = checks.split_reference(ref, t.shape, batched=False)
    native = jax.jit(native_pass._accumulate_native)(t, g, hi, lo)
    hb = None if hi is None else api._bits_jit(jnp.asarray(hi))
    pure = api._accumulate_bits_jit(api._bits_jit(jnp.asarray(t)),
                                  api._bits_jit(jnp.asarray(g)), hb, lo,
                                  dtype=np.dtype(t.dtype))
    return jax.device_get(native), jax.device_get(pure)


def _log_bound(t, g):
  """Sum of |log2|t|| + |log2|g|| over the elements of logratio_sum."""
  nb = np.dtype(t.dtype).itemsize * 8
  ui = {16: np.uint16, 32: np.uint32, 64: np.uint64}[nb]
  ut, ug = t.reshape(-1).view(ui), g.reshape(-1).view(ui)
  finfo = ml_dtypes.finfo(t.dtype)
  mag = ui((1 << (nb - 1)) - 1)
  gexp = (ug & mag) >> ui(finfo.nmant)
  td, gd = t.reshape(-1).astype(np.float64), g.reshape(-1).astype(np.float64)
  ok = (np.isfinite(td) & np.isfinite(gd) & (gexp != 0) & ((ut & mag) != 0))
  with np.errstate(divide="ignore"):
    return float(np.sum(np.abs(np.log2(np.abs(td[ok]))) +
                        np.abs(np.log2(np.abs(gd[ok])))))


def _assert_states_match(nat, ref, t, g):
  """Exact integers; floats within the module docstring's tolerances."""
  st = {f: np.asarray(getattr(ref, f)) for f in F}
  nl = float(st["flags"][signature._F_LOG_OK])
  sx, sy, sxy, sxx, syy = (float(v) for v in st["slope_sums"])
  bx = math.sqrt(max(nl * sxx, 0.0)) + nl
  by = math.sqrt(max(nl * syy, 0.0)) + nl
  slope_bound = np.array([bx, by, math.sqrt(max(sxx * syy, 0.0)) + bx + by,
                          sxx + bx, syy + by])
  bounds = {
      "err_sum": float(np.sum(st["row_abs_sum"], dtype=np.float64)),
      "mag_err_sum": float(st["rel_sum"]),
      "logratio_sum": _log_bound(t, g) * 2.0**-20 / RTOL_SUM,
      "slope_sums": slope_bound,
  }
  for name in F:
    a = np.asarray(getattr(nat, name))
    b = st[name]
    assert a.shape == b.shape and a.dtype == b.dtype, (
        name, a.shape, b.shape, a.dtype, b.dtype)
    if not np.issubdtype(a.dtype, np.floating):
      np.testing.assert_array_equal(a, b, err_msg=name)
      continue
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nonfinite = ~np.isfinite(a64) | ~np.isfinite(b64)
    np.testing.assert_array_equal(a64[nonfinite], b64[nonfinite],
                                  err_msg=name)
    a64, b64 = np.where(nonfinite, 0.0, a64), np.where(nonfinite, 0.0, b64)
    if name in _MAXMIN:
      tol = RTOL_MAX * np.abs(b64) + np.finfo(a.dtype).tiny
    elif name in _NONNEG:
      tol = RTOL_SUM * np.abs(b64) + np.finfo(a.dtype).tiny
    elif name in bounds:
      with np.errstate(over="ignore"):
        tol = RTOL_SUM * (np.abs(b64) + np.abs(bounds[name])) + 1e-30
    else:
      raise AssertionError(f"float field {name} has no stated tolerance")
    err = np.abs(a64 - b64)
    bad = ~nonfinite & ~(err <= tol)
    assert not bad.any(), (name, a64[bad][:4], b64[bad][:4], tol)


def _assert_signatures_match(nat, ref):
  """The derived Signature's integer and bool fields are equal."""
  sa, sb = api._finalize_jit(nat), api._finalize_jit(ref)
  for name in analyzer.Signature._fields:
    a, b = np.asarray(getattr(sa, name)), np.asarray(getattr(sb, name))
    if not np.issubdtype(a.dtype, np.floating):
      np.testing.assert_array_equal(a, b, err_msg=name)


def _bit_counts(t, g):
  """Zero, subnormal and sign counts from the bit patterns (NumPy)."""
  nb = np.dtype(t.dtype).itemsize * 8
  ui = {16: np.uint16, 32: np.uint32, 64: np.uint64}[nb]
  ut, ug = t.reshape(-1).view(ui), g.reshape(-1).view(ui)
  nmant = ml_dtypes.finfo(t.dtype).nmant
  mag, sign = ui((1 << (nb - 1)) - 1), ui(1 << (nb - 1))
  inf = ui(((1 << (nb - 1 - nmant)) - 1) << nmant)
  mt, mg = ut & mag, ug & mag
  fin_t, fin_g = mt < inf, mg < inf
  t0, g0 = mt == 0, mg == 0
  gsub = (mg >> ui(nmant) == 0) & ~g0
  return {
      signature._F_ZEROED: fin_g & ~g0 & t0,
      signature._F_FLUSHED: gsub & t0,
      signature._F_GOLDEN_SUBNORMAL: gsub,
      signature._F_GOLDEN_ZERO: g0,
      signature._F_SIGN_FLIP: (fin_t & fin_g & ~t0 & ~g0 &
                       (((ut ^ ug) & sign) != 0)),
  }


@pytest.mark.parametrize("name", list(DTYPES))
def test_native_equals_pure_jax_with_reference(name):
  # 512 elements: one block of the pure-JAX counting scan (quick to compile).
  t, g, ref = _pair(name, (16, 32), seed=11)
  nat, pure = _states(t, g, ref)
  _assert_states_match(nat, pure, t, g)
  # The data reached every special kind.
  flags = np.asarray(nat.flags)
  for k in (signature._F_NAN_T, signature._F_INF_G, signature._F_GOLDEN_SUBNORMAL, signature._F_ZEROED,
            signature._F_RATIO_OK, signature._F_LOG_OK):
    assert flags[k] > 0, k
  assert int(nat.ref_n) > 0
  # Zero and subnormal tests are bit tests in both passes (on CPU a float
  # comparison would read a subnormal t as zero under XLA's flushing).
  for k, mask in _bit_counts(t, g).items():
    assert int(nat.flags[k]) == int(mask.sum()), k
    assert int(pure.flags[k]) == int(mask.sum()), k


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("shape,with_ref", [
    ((600, 700), False),   # threads, units, sampled statistics
    ((70001,), True),      # 1-D: one row, column chunks, sampled
    ((3, 37, 45), False),  # ragged rows, tile edges, masked tails
    ((7,), True),          # shorter than one vector
])
def test_native_equals_pure_jax_shapes(name, shape, with_ref):
  t, g, ref = _pair(name, shape, seed=zlib.crc32(f"{name}{shape}".encode()))
  nat, pure = _states(t, g, ref if with_ref else None)
  _assert_states_match(nat, pure, t, g)
  with _x64(t.dtype):
    _assert_signatures_match(nat, pure)


def _repr_groups(name):
  """Records whose representability is worth counting one by one: every
  bit pattern of a 16-bit dtype; else range edges, seeded random values,
  and the same values rounded to each narrow format (exactly representable
  there) and nudged one ulp up (mostly not)."""
  dtype = DTYPES[name]
  if np.dtype(dtype).itemsize == 2:
    return [np.arange(1 << 16, dtype=np.uint16).view(dtype)]
  rng = np.random.default_rng(23)
  edges = [0.0, -0.0, 1e-40, 1e-45, 2.0**-24, 2.0**-25, 2.0**-9, 2.0**-10,
           2.0**-133, 2.0**-149, 448.0, 464.0, 480.0, 57344.0, 61440.0,
           65504.0, 65520.0, 1 + 2.0**-10, 1 + 2.0**-11, 3e38, np.inf,
           -np.inf, np.nan, 1e-310, 1e300]
  x = rng.standard_normal(4000) * np.exp2(rng.integers(-150, 40, 4000))
  groups = [np.array(edges), x]
  with np.errstate(over="ignore", invalid="ignore"):
    for fmt in (ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn,
                ml_dtypes.float8_e5m2):
      r = x.astype(fmt).astype(np.float64)
      groups.append(r)
      groups.append(np.nextafter(r.astype(dtype), dtype(np.inf)))
    return [g.astype(dtype) for g in groups]


@pytest.mark.parametrize("name", list(DTYPES))
def test_native_representability_counts_are_the_rule(name):
  """The native pass's representability counts (vectorized) equal the
  per-element rule (`_representable`, tested against exact round trips),
  format by format, on every bit pattern of the 16-bit dtypes and on
  crafted float32 / float64 values; all elements are sampled (n <= 65536)."""
  nf = len(analyzer.NARROW_FORMATS)
  yes, total = np.zeros(nf, np.int64), 0
  for x in _repr_groups(name):
    t = x.reshape(1, -1)
    g = t[:, ::-1].copy()
    u = UINT[x.itemsize]
    with _x64(x.dtype):
      counts = np.asarray(jax.jit(lambda a, b: _ffi.signature_pass(
          a, b, None, None)[-1])(jnp.asarray(t), jnp.asarray(g)))
      rule = np.asarray(jax.jit(lambda v: bits._representable(v, x.dtype))(
          jnp.asarray(x.view(u))))
    assert counts[1] == x.size  # every element sampled
    want = rule.sum(axis=1)  # g holds the same values: equal counts
    np.testing.assert_array_equal(counts[2:2 + nf], want)
    np.testing.assert_array_equal(counts[2 + nf:2 + 2 * nf], want)
    yes += want
    total += x.size
  # Both outcomes were reached for every format.
  assert (yes > 0).all() and (yes < total).all(), (yes, total)


def test_native_is_bitwise_deterministic_across_threads():
  """Several units on several threads; concurrent calls perturb the thread
  timing. Every call gives the same bits."""
  t, g, _ = _pair("float32", (1024, 768), seed=3)
  fn = jax.jit(lambda a, b: native_pass._accumulate_native(a, b, None, None))
  tj, gj = jnp.asarray(t), jnp.asarray(g)
  first = [np.asarray(x) for x in jax.tree.leaves(fn(tj, gj))]
  results = []

  def run():
    results.append([np.asarray(x) for x in jax.tree.leaves(fn(tj, gj))])

  threads = [threading.Thread(target=run) for _ in range(3)]
  for th in threads:
    th.start()
  for th in threads:
    th.join()
  assert len(results) == 3
  for res in results:
    for x, y in zip(first, res):
      assert x.tobytes() == y.tobytes()


def test_analyze_uses_the_native_pass_on_cpu():
  """On CPU the jitted pass is the custom call; there is no pure-JAX scan."""
  if jax.default_backend() != "cpu":
    pytest.skip("the native pass is the CPU path")
  x = jnp.ones((4096,), jnp.float32)
  dims = np.array([16, 32], np.int32)
  text = api._PAD_PACKED_JIT["signature"].lower(
      x, x, None, None, dims, lines=512).as_text()
  assert "peat_signature" in text
  assert "stablehlo.while" not in text


def test_handler_rejects_bad_buffers():
  """The handler validates dtypes itself (a direct FFI call)."""
  x = jnp.ones((4, 8), jnp.int32)
  with pytest.raises(Exception, match="expected float32, bfloat16"):
    jax.block_until_ready(_ffi.signature_pass(x, x, None, None))


# Each instruction-set level of the native pass (AVX-512, AVX2, baseline:
# vectors of 64, 32 and 16 bytes) in a child process that picks it with
# $PEAT_SIGNATURE_ISA: the states of the records below, one .npz per level.
_LEVEL_SHAPES = (((16, 32), True), ((300, 257), True), ((7,), False))
_LEVEL_CHILD = r"""
import importlib.util, sys
import jax, numpy as np
spec = importlib.util.spec_from_file_location("native_test", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = {}
for name in mod.DTYPES:
  for i, (shape, with_ref) in enumerate(mod._LEVEL_SHAPES):
    t, g, ref = mod._pair(name, shape, seed=5 + i)
    with mod._x64(t.dtype):
      hi = lo = None
      if with_ref:
        hi, lo = mod.checks.split_reference(ref, t.shape, batched=False)
      st = jax.device_get(jax.jit(mod.native_pass._accumulate_native)(
          t, g, hi, lo))
    for f in mod.F:
      out[f"{name}/{i}/{f}"] = np.asarray(getattr(st, f))
np.savez(sys.argv[2], **out)
"""


def _run_level_child(level, out):
  """The child process at ``level``, writing its states to ``out``."""
  env = dict(os.environ, PEAT_SIGNATURE_ISA=level)
  return subprocess.run([sys.executable, "-c", _LEVEL_CHILD, __file__,
                         str(out)], env=env, capture_output=True, text=True,
                        timeout=600, check=False)


def _level_states(level, tmp_path):
  """The child's states at ``level`` (None: the level this CPU lacks)."""
  out = tmp_path / f"{level}.npz"
  run = _run_level_child(level, out)
  if "is not an instruction-set level this CPU runs" in run.stderr:
    return None
  assert run.returncode == 0, run.stderr[-3000:]
  with np.load(out) as z:
    return {k: z[k] for k in z.files}


def _state_of(states, name, i):
  return analyzer.SignatureState(**{f: states[f"{name}/{i}/{f}"] for f in F})


def test_every_instruction_set_level_equals_pure_jax(tmp_path):
  """Each level this CPU runs (the baseline always) against the pure-JAX
  pass within the stated tolerances, and against the others: integer
  fields (counts, bit counts, hashes, histograms) bitwise, floats within
  the tolerances (their lane sums group elements differently). Threads,
  ragged tails and a record shorter than one vector at every width."""
  if jax.default_backend() != "cpu":
    pytest.skip("the native pass is the CPU path")
  levels = {lv: _level_states(lv, tmp_path)
            for lv in ("avx512", "avx2", "base")}
  ran = {lv: st for lv, st in levels.items() if st is not None}
  assert "base" in ran
  first = next(iter(ran))
  for name in DTYPES:
    for i, (shape, with_ref) in enumerate(_LEVEL_SHAPES):
      t, g, ref = _pair(name, shape, seed=5 + i)
      if i == 0:  # the pure-JAX pass compiles quickly at this size only
        _, pure = _states(t, g, ref if with_ref else None)
      for lv, st in ran.items():
        nat = _state_of(st, name, i)
        if i == 0:
          _assert_states_match(nat, pure, t, g)
        _assert_states_match(nat, _state_of(ran[first], name, i), t, g)


def test_an_instruction_set_level_the_cpu_lacks_is_refused(tmp_path):
  run = _run_level_child("sse9", tmp_path / "x.npz")
  assert run.returncode != 0
  assert ("PEAT_SIGNATURE_ISA=sse9 is not an instruction-set level this CPU "
          "runs; expected one of") in run.stderr
  assert "base" in run.stderr.split("expected one of")[1]
