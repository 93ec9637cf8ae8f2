"""Records padded to a size bucket give the signature of their own shape.

On CPU the Analyzer runs every record flat in its size bucket with its
(R, C) as an operand (peat_jax/analyzer/signature/_layout.py); traced at
the record's own shape (the path of other platforms, ``signature_pure``
and the batched form) the same code sees static R and C and no padding.
Both must agree: counts, bits, shares and shapes exactly, float sums to
their summation order, and the Detector's diagnosis.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import kernels
from peat_jax.analyzer.signature import _api
from peat_jax.analyzer.signature import _layout

def _case(shape, dtype, fault, seed):
  rng = np.random.default_rng(seed)
  r = rng.standard_normal(shape)
  g = r.astype(dtype)
  t = (r * (1 + 2.0 ** -20 * rng.standard_normal(shape))).astype(dtype)
  if fault == "bitflip":
    flat = t.reshape(-1).copy()
    bits = flat.view(f"u{np.dtype(dtype).itemsize}")
    idx = rng.choice(flat.size, 3, replace=False)
    bits[idx] ^= np.array(1, bits.dtype) << (np.dtype(dtype).itemsize * 8 - 3)
    t = flat.reshape(shape)
  elif fault == "shift":
    t = np.roll(g, 1, axis=-1)
  elif fault == "zero":
    t = g.copy()
    t.reshape(-1)[::5] = 0
  return t, g, r


def _both(monkeypatch, fn):
  padded = jax.device_get(fn())
  monkeypatch.setattr(_api, "_bucketed", lambda: False)
  exact = jax.device_get(fn())
  monkeypatch.undo()
  return padded, exact


_F32, _BF16 = np.float32, ml_dtypes.bfloat16


@pytest.mark.parametrize("shape,dtype,fault", [
    ((7, 5), _F32, "bitflip"), ((7, 5), _BF16, "shift"),
    ((48, 130), _F32, "none"), ((48, 130), _BF16, "bitflip"),
    ((129, 129), _F32, "shift"), ((129, 129), _BF16, "zero"),
    ((3, 2, 40), _F32, "zero"), ((3, 2, 40), _BF16, "none"),
    ((1, 70000), _F32, "bitflip"), ((70000, 1), _BF16, "bitflip"),
    ((70000, 1), _F32, "shift"), ((33,), _BF16, "bitflip")])
def test_padded_record_is_its_own_shape(monkeypatch, same_but_order,
                                        shape, dtype, fault):
  if not _api._bucketed():
    pytest.skip("records are padded to size buckets on CPU")
  t, g, r = _case(shape, dtype, fault, seed=len(shape) + shape[0])
  padded, exact = _both(monkeypatch, lambda: peat.analyze(t, g, r))
  same_but_order(padded, exact)
  assert np.shape(padded.row_ndiff) == (_layout.view2d(shape)[0],)
  dp, de = peat.detect(padded), peat.detect(exact)
  assert (dp.model, dp.verdict) == (de.model, de.verdict)
  if fault == "bitflip":
    assert dp.model == "bitflip" and dp.verdict == "fail"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_screen_decomposition_and_no_reference_padded(monkeypatch,
                                                     same_but_order, dtype):
  if not _api._bucketed():
    pytest.skip("records are padded to size buckets on CPU")
  t, g, r = _case((40, 150), dtype, "bitflip", seed=5)
  for fn in (lambda: peat.analyzer.screen(t, g, r)[0],
             lambda: peat.analyzer.screen(t, g, r)[1],
             lambda: peat.analyzer.decomposition(t, g, r),
             lambda: peat.analyze(t, g)):
    same_but_order(*_both(monkeypatch, fn))


def test_many_records_at_their_shapes_bitwise_those_alone(same_but_order):
  """The many-record calls run every record at its own shape, whatever
  the count: a record's fields are bitwise those of a call with it alone;
  `analyze` of it alone (its size bucket's) agrees but for the order of
  its sums."""
  cases = [_case(s, d, f, seed=i) for i, (s, d, f) in enumerate(
      [((16, 64), np.float32, "none"), ((300, 70), ml_dtypes.bfloat16,
                                        "bitflip"),
       ((5000,), np.float32, "shift")])]
  halves = [(r.astype(np.float32),
             (r - r.astype(np.float32)).astype(np.float32))
            for _, _, r in cases]
  args = ([t for t, _, _ in cases], [g for _, g, _ in cases],
          [h for h, _ in halves], [lo for _, lo in halves])
  alone = lambda fn, i: fn(*[[a[i]] for a in args], to_host=True)[0]
  for fn in (peat.analyzer.analyze_split_many,
             peat.analyzer.screen_split_many,
             peat.analyzer.decompose_split_many):
    many = fn(*args, to_host=True)
    assert len(many) == len(cases)
    for i, got in enumerate(many):
      want = jax.tree.leaves(alone(fn, i))
      assert len(jax.tree.leaves(got)) == len(want) > 0
      for a, b in zip(jax.tree.leaves(got), want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for (t, g, r), got in zip(cases, peat.analyzer.analyze_split_many(
      *args, to_host=True)):
    same_but_order(jax.device_get(peat.analyze(t, g, r)), got)


def test_bucket():
  assert _layout.bucket(1) == _layout.MIN_BUCKET
  assert _layout.bucket(4096) == 4096
  assert _layout.bucket(4097) == 8192
  assert _layout.bucket(1 << 20) == 1 << 20


def test_native_pass_reads_only_the_record_and_checks_its_dims():
  """The handler reads R x C elements of a padded buffer: garbage in the
  padding changes nothing; dims beyond the buffer are refused."""
  if jax.default_backend() != "cpu":
    pytest.skip("the native pass is the CPU path")
  rng = np.random.default_rng(0)
  g = rng.standard_normal(600).astype(np.float32)
  t = (g * np.float32(1 + 2 ** -20)).astype(np.float32)
  dims = np.array([20, 30], np.int32)

  def run(tail):
    tp = np.concatenate([t, np.full(424, tail, np.float32)])
    gp = np.concatenate([g, np.full(424, -tail, np.float32)])
    return jax.device_get(kernels.signature_pass(
        jnp.asarray(tp), jnp.asarray(gp), None, None, dims, rows_cap=1024,
        cols_cap=1024, tiles_cap=16))

  a, b = run(np.nan), run(7.0)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert int(np.asarray(a[3])[20:].sum()) == 0  # row_ndiff beyond R
  with pytest.raises(Exception, match="at most the buffers"):
    jax.block_until_ready(kernels.signature_pass(
        jnp.asarray(t), jnp.asarray(g), None, None,
        np.array([30, 30], np.int32), rows_cap=30, cols_cap=30, tiles_cap=9))
