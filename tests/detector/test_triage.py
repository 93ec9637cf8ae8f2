"""The triage screen decides only what the full Detector would.

``peat.detector.triage`` clears a screened record as ``reordering`` (pass)
without the noise-aware decomposition. For correct kernels of another
summation order (float32 and bf16 outputs) and for faults that stay
inside the golden kernel's rounding envelope (round toward zero, a stuck
low bit, a sparse flip of a low bit, signed zeros, values flushed to zero) and beyond it (a
narrower format, a NaN, two values exchanged), every record the screen
decides gets the same model and verdict from the full path
(``peat.analyze`` with the decomposition, then ``peat.detect``); the
faults are never cleared.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat

BF16 = ml_dtypes.bfloat16


def _gemm(seed: int, dtype, m=48, k=256, n=80):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((m, k)).astype(dtype)
  b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
  g = np.asarray(jax.jit(lambda x, y: jnp.dot(
      x, y, preferred_element_type=jnp.float32).astype(x.dtype))(a, b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  return a, b, g, r


def _split_k(a, b, parts: int):
  """A correct matmul of another order: K in ``parts`` chunks, float32."""
  k = a.shape[1] // parts
  acc = sum(np.asarray(jnp.dot(jnp.asarray(a[:, i * k:(i + 1) * k]),
                               jnp.asarray(b[i * k:(i + 1) * k]),
                               preferred_element_type=jnp.float32))
            for i in range(parts))
  return acc.astype(a.dtype)


def _bits(x, fn):
  u = np.ascontiguousarray(x).view(
      {2: np.uint16, 4: np.uint32}[x.dtype.itemsize]).copy()
  return fn(u).view(x.dtype)


def _rtz(r, dtype):
  """The exact result rounded toward zero into float32."""
  t = r.astype(np.float32)
  over = np.abs(t.astype(np.float64)) > np.abs(r)
  t[over] = np.nextafter(t[over], np.float32(0))
  return t.astype(dtype)


def _cases(seed: int, dtype):
  a, b, g, r = _gemm(seed, dtype)
  rng = np.random.default_rng(seed + 100)
  flip = rng.choice(g.size, 5, replace=False)
  swap = rng.choice(g.size, 2, replace=False)
  out = {
      "split_k_2": ("benign", _split_k(a, b, 2)),
      "split_k_8": ("benign", _split_k(a, b, 8)),
      "stuck_low_bit": ("fault", _bits(g, lambda u: u | 1)),
      "sparse_low_flip": ("fault", _bits(g, lambda u: _flat_xor(u, flip, 3))),
      "nan": ("fault", _nan_at(g, int(flip[0]))),
      "exchanged": ("fault", _swap(g, swap)),
      "narrow_output": ("fault", g.astype(np.float32).astype(
          np.float16).astype(dtype) if dtype == np.float32 else None),
      "round_toward_zero": ("fault", _rtz(r, dtype) if dtype == np.float32
                            else None),
  }
  return {k: v for k, v in out.items() if v[1] is not None}, g, r


def _flat_xor(u, idx, bit):
  f = u.reshape(-1)
  f[idx] ^= type(f[0])(1 << bit)
  return u


def _nan_at(g, i):
  t = g.copy()
  t.reshape(-1)[i] = np.nan
  return t


def _swap(g, idx):
  t = g.copy().reshape(-1)
  t[idx[0]], t[idx[1]] = t[idx[1]], t[idx[0]]
  return t.reshape(g.shape)


def _both(t, g, r):
  sig, screen = jax.device_get(peat.analyzer.screen(t, g, r))
  quick = peat.detector.triage(sig, screen)
  full = peat.detect(peat.analyze(t, g, r))
  return quick, full


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bf16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_what_the_screen_decides_the_full_path_decides_too(seed, dtype):
  cases, g, r = _cases(seed, dtype)
  cleared = 0
  for name, (kind, t) in cases.items():
    quick, full = _both(t, g, r)
    if quick is None:
      continue
    cleared += 1
    assert (quick.model, quick.verdict) == (full.model, full.verdict), name
    assert quick.params["path"] == "screen"
    assert kind == "benign", f"{name}: a fault cleared by the screen"
  # The correct kernels of another order are the screen's to decide.
  assert cleared >= 1


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bf16"])
def test_faults_inside_the_envelope_are_flagged(dtype):
  cases, g, r = _cases(3, dtype)
  for name, (kind, t) in cases.items():
    if kind != "fault":
      continue
    quick, full = _both(t, g, r)
    assert quick is None, (name, quick)
    assert full.model not in ("exact", "reordering") or full.verdict != \
        "pass", (name, full.model)


@pytest.mark.parametrize("dtype,tiny", [(np.float32, 3e-8), (BF16, 3e-5)],
                         ids=["float32", "bf16"])
def test_values_flushed_to_zero_inside_the_envelope_are_flagged(dtype, tiny):
  """Tiny outputs (below fp16's smallest normal, 6.1e-5) that
  a KUT of another order flushes to zero: inside the envelope at their
  row's scale, yet never cleared."""
  a, b, g, r = _gemm(11, dtype)
  idx = np.random.default_rng(12).choice(g.size, 24, replace=False)
  g, r = g.copy(), r.copy()
  g.reshape(-1)[idx] = tiny
  r.reshape(-1)[idx] = float(np.asarray(tiny, dtype))
  t = _split_k(a, b, 2)
  t.reshape(-1)[idx] = 0
  sig, screen = jax.device_get(peat.analyzer.screen(t, g, r))
  assert int(screen.n_beyond) == 0  # inside the envelope
  assert peat.detector.triage(sig, screen) is None
  full = peat.detect(peat.analyze(t, g, r))
  assert (full.model, full.verdict) != ("reordering", "pass")


def test_bitwise_equal_is_exact_and_signed_zeros_are_flagged():
  _, _, g, r = _gemm(5, np.float32)
  sig, screen = jax.device_get(peat.analyzer.screen(g, g, r))
  assert peat.detector.triage(sig, screen).model == "exact"
  g0 = g.copy()
  g0.reshape(-1)[:4] = 0.0
  t0 = g0.copy()
  t0.reshape(-1)[:4] = -0.0
  sig, screen = jax.device_get(peat.analyzer.screen(t0, g0, r))
  assert peat.detector.triage(sig, screen) is None
  assert peat.detect(peat.analyze(t0, g0, r)).model == "exact"


def test_the_screen_and_the_decomposition_make_analyzes_signature():
  a, b, g, r = _gemm(7, np.float32)
  t = _split_k(a, b, 4)
  sig, _ = jax.device_get(peat.analyzer.screen(t, g, r))
  assert not bool(sig.decomposed)
  whole = peat.analyzer.with_decomposition(
      sig, jax.device_get(peat.analyzer.decomposition(t, g, r)))
  ref = jax.device_get(peat.analyze(t, g, r))
  for name in ref._fields:
    np.testing.assert_array_equal(np.asarray(getattr(whole, name)),
                                  np.asarray(getattr(ref, name)),
                                  err_msg=name)
