"""The port probe's host arithmetic: the exact median and the deferred,
batched re-based signatures give the values of the plain computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import analyzer
from peat_jax.analyzer.signature import _select
from peat_jax.analyzer.signature import split_reference
from peat_jax.injectors import round_nearest
from peat_jax import core


def _arrays():
  rng = np.random.default_rng(7)
  out = []
  for i, n in enumerate([1, 2, 3, 1000, 16384, 16385, 40000, 131071,
                         262144, 300001]):
    x = rng.standard_normal(n)
    kind = i % 5
    if kind == 1:  # ratios: nonnegative, with infinities
      x = np.abs(x)
      x[rng.random(n) < 0.3] = np.inf
    elif kind == 2:  # heavy ties
      x = np.round(x * 3)
    elif kind == 3:  # sorted: the strided sample sees a biased order
      x = np.sort(x)
    elif kind == 4:  # wide range
      x = np.exp(20 * x)
    out.append(x)
  # Adversarial: the strided sample holds only the smallest values, so the
  # bracket misses and the fallback must answer.
  y = np.sort(rng.standard_normal(65536))
  adv = np.empty_like(y)
  step = 65536 // 4096
  adv[::step] = y[:4096]
  rest = np.ones(65536, bool)
  rest[::step] = False
  adv[rest] = y[4096:]
  out.append(adv)
  return out


@pytest.mark.parametrize("i", range(11))
def test_median_is_numpy_median_bitwise(i):
  x = _arrays()[i]
  keep = x.copy()
  got = _select.median(x)
  want = float(np.median(x))
  assert got == want or (np.isnan(got) and np.isnan(want))
  np.testing.assert_array_equal(x, keep)  # not modified


def test_median_float32_and_errors():
  x = np.random.default_rng(3).standard_normal(50001).astype(np.float32)
  assert _select.median(x) == float(np.median(x))
  assert np.isnan(_select.median(np.zeros(0)))
  with pytest.raises(ValueError, match="expected 1-D"):
    _select.median(np.ones((4, 4)))


def _record(seed, shape, out_dtype=np.float32):
  """A matmul whose KUT rounds its inputs to bf16: the probe's
  ``inputs_bf16`` hypothesis explains it; a few elements are faulted on
  top, so the re-based signature has outliers."""
  rng = np.random.default_rng(seed)
  m, k, n = shape
  a = rng.standard_normal((m, k)).astype(np.float32)
  b = rng.standard_normal((k, n)).astype(np.float32)
  bf = lambda x: np.asarray(round_nearest(jnp.asarray(x),
                                          core.FORMATS["bf16"]), np.float64)
  r = a.astype(np.float64) @ b.astype(np.float64)
  t = (bf(a) @ bf(b)).astype(out_dtype)
  t.reshape(-1)[rng.choice(t.size, 5, replace=False)] *= 3
  g = (a @ b).astype(out_dtype)
  ref_fn = lambda x, y: np.asarray(x, np.float64) @ np.asarray(y, np.float64)
  return (a, b), t, g, r, ref_fn


def _probe(rec, signature):
  args, t, g, r, ref_fn = rec
  return analyzer.port_probe("dot_general", args, {}, t, g, r,
                             reference_fn=ref_fn, signature=signature)


def test_probe_ratio_is_the_median_over_differing_elements():
  """``ratio`` = np.median(|t - h| / |t - r|) where t != r, as written
  out here from the definition."""
  rec = _record(1, (96, 64, 80))
  args, t, _, r, ref_fn = rec
  p = _probe(rec, True)
  assert p is not None and p["name"] == "inputs_bf16" and p["explains"]
  h = ref_fn(*[np.asarray(round_nearest(jnp.asarray(x), core.FORMATS["bf16"]))
               for x in args])
  t64 = t.astype(np.float64)
  keep = t64 != r
  ratio = np.abs(t64 - h)[keep] / np.abs(t64 - r)[keep]
  assert p["ratio"] == float(np.median(ratio))


def test_deferred_probe_signatures_equal_the_probe_own(same_but_order):
  """``signature="defer"`` + ``probe_signatures`` (one executable for
  all) == ``port_probe``'s own Signature == the record against the
  hypothesis analyzed at its own shape, field for field, bitwise; `analyze`
  of it (its size bucket's executable) to the order of its sums."""
  recs = [_record(s, shape, dt) for s, shape, dt in [
      (2, (64, 32, 48), np.float32), (3, (64, 32, 48), np.float32)]]
  want = [_probe(rec, True) for rec in recs]
  got = [_probe(rec, "defer") for rec in recs] + [None]
  assert all("hypothesis" in p and "signature" not in p for p in got[:-1])
  # The definition: the output against the hypothesis rounded to its
  # dtype, the hypothesis as the reference, one record at a time.
  hyps = [(rec[1], p["hypothesis"]) for rec, p in zip(recs, got)]
  defs = [analyzer.analyze_split_many(
      [t], [h.astype(t.dtype)], *map(list, zip(
          split_reference(h, t.shape, batched=False))),
      to_host=True)[0] for t, h in hyps]
  alone = [jax.device_get(analyzer.analyze(t, h.astype(t.dtype), h))
           for t, h in hyps]
  analyzer.probe_signatures(got, [rec[1] for rec in recs] + [None])
  assert got[-1] is None
  for w, p, d, a in zip(want, got, defs, alone):
    assert "hypothesis" not in p
    assert set(w) == set(p)
    for name in analyzer.Signature._fields:
      np.testing.assert_array_equal(
          np.asarray(getattr(p["signature"], name)),
          np.asarray(getattr(w["signature"], name)), err_msg=name)
      np.testing.assert_array_equal(
          np.asarray(getattr(p["signature"], name)),
          np.asarray(getattr(d, name)), err_msg=name)
    same_but_order(p["signature"], a)
    for key in set(w) - {"signature"}:
      assert w[key] == p[key], key


@pytest.mark.slow  # compiles the x64 analyzer (~10 s)
def test_deferred_probe_signature_of_a_float64_output_is_float64():
  """A float64 output is analyzed in float64 (as ``analyze`` of the host
  arrays), not narrowed to float32 on its way to the device."""
  rec = _record(5, (40, 64, 72), np.float64)
  p = _probe(rec, "defer")
  analyzer.probe_signatures([p], [rec[1]])
  want = _probe(rec, True)["signature"]
  assert int(want.dtype_code) == int(analyzer.analyze(
      rec[1], rec[1], rec[1]).dtype_code)  # float64's code
  for name in analyzer.Signature._fields:
    np.testing.assert_array_equal(np.asarray(getattr(p["signature"], name)),
                                  np.asarray(getattr(want, name)),
                                  err_msg=name)
