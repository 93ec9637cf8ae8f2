"""Rounding into a narrow format by operations every XLA backend keeps.

``precision:<fmt>`` injections, the runtime yardstick "one format below"
and the ports round float32 data to a narrower format and keep it in
float32. A convert to the format and back does that on the CPU, but
XLA:GPU removes such a pair where it allows excess precision (its
default): on the first GPU check the yardstick rounded nothing and a
correct bf16 kernel got a warn. ``kept_rounding`` rounds by a
``reduce_precision`` and exact arithmetic instead: the same bits as the
convert pair (float32) and as ml_dtypes' one rounding (float32 and
float64), on values chosen where a rounding goes wrong, and in the
compiled program no convert to the narrow format is left to remove.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from peat_jax import injectors
from peat_jax.injectors import _rounding as fm
from peat_jax.profiler.runtime_fi import _weights

FORMATS = ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]
#: Each format's element type as compiled HLO text writes it.
HLO_TYPE = {"bf16": "bf16[", "fp16": "f16[", "fp8_e4m3": "f8e4m3fn[",
            "fp8_e5m2": "f8e5m2["}


def _hard(seed: int, dtype) -> np.ndarray:
  """Values at every scale of ``dtype``, the format's ties (random bit
  patterns with a dropped half), the ends of each format's range,
  subnormals of float32 and of the formats, signed zeros, infinities."""
  rng = np.random.default_rng(seed)
  n = 20000
  lo, hi = (-149, 128) if dtype == np.float32 else (-160, 140)
  wide = rng.choice([-1.0, 1.0], n) * rng.uniform(1.0, 2.0, n) * 2.0 ** (
      rng.integers(lo, hi, n).astype(np.float64))
  bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
  with np.errstate(invalid="ignore"):
    raw = bits.view(np.float32).astype(np.float64)
  edges = []
  for name in FORMATS:
    f = fm.FORMATS[name]
    sub = f.min_normal * 2.0 ** -f.mantissa_bits
    edges += [f.max, f.max * (1 + 2.0 ** -(f.mantissa_bits + 1)),
              f.max * (1 + 2.0 ** -f.mantissa_bits), f.min_normal,
              f.min_normal - sub / 2, sub, sub / 2, 1.5 * sub, 2.5 * sub]
  edges += [0.0, -0.0, np.inf, -np.inf, 1e-45, 2.0 ** -133]
  edges = np.array(edges)
  with np.errstate(over="ignore"):
    x = np.concatenate([wide, raw, edges, -edges]).astype(dtype)
  return x[~np.isnan(x)]


def _same(a, b) -> np.ndarray:
  a, b = np.asarray(a), np.asarray(b)
  u = np.uint32 if a.dtype == np.float32 else np.uint64
  return (a.view(u) == b.view(u)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("seed", [0, 1])
def test_float32_rounding_is_the_convert_pair_bit_for_bit(name, seed):
  f = fm.FORMATS[name]
  x = _hard(seed, np.float32)
  got = jax.jit(lambda v: fm.kept_rounding(v, f))(jnp.asarray(x))
  pair = jax.jit(lambda v: v.astype(f.dtype).astype(jnp.float32))(
      jnp.asarray(x))
  with np.errstate(over="ignore"):
    numpy = x.astype(f.dtype).astype(np.float32)
  assert _same(got, pair).all(), x[~_same(got, pair)][:8]
  assert _same(got, numpy).all(), x[~_same(got, numpy)][:8]


@pytest.mark.parametrize("name", FORMATS)
def test_float64_rounding_is_one_rounding(name):
  """float64 data is rounded once, as ml_dtypes does (XLA's convert of
  float64 to bfloat16 goes by way of float32: two roundings)."""
  f = fm.FORMATS[name]
  x = _hard(2, np.float64)
  with jax.enable_x64(True):
    got = np.asarray(jax.jit(lambda v: fm.kept_rounding(v, f))(
        jnp.asarray(x)))
  with np.errstate(over="ignore"):
    want = x.astype(f.dtype).astype(np.float64)
  assert _same(got, want).all(), x[~_same(got, want)][:8]


@pytest.mark.parametrize("name", FORMATS)
def test_no_convert_to_the_format_is_left_to_remove(name):
  f = fm.FORMATS[name]
  x = jnp.asarray(_hard(3, np.float32)[:4096])
  hlo = jax.jit(lambda v: fm.kept_rounding(v, f)).lower(x).compile(
      ).as_text()
  assert "reduce-precision(" in hlo
  assert HLO_TYPE[name] not in hlo


def test_a_precision_injection_and_the_yardstick_round_in_the_program():
  x = jnp.asarray(np.random.default_rng(4).standard_normal((64, 48)),
                  jnp.float32)
  inj = jax.jit(lambda v: injectors.inject("precision:bf16",
                                           jax.random.key(0), v))
  np.testing.assert_array_equal(
      np.asarray(inj(x)), np.asarray(x).astype(ml_dtypes.bfloat16).astype(
          np.float32))
  assert "reduce-precision(" in inj.lower(x).compile().as_text()
  xb = x.astype(jnp.bfloat16) * 3
  scaled = jax.jit(_weights._fp8_scaled)
  xf = np.asarray(xb, np.float32)
  scale = np.float32(np.max(np.abs(xf)) / np.float32(448.0))
  want = ((xf / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
          * scale).astype(ml_dtypes.bfloat16)
  got = np.asarray(scaled(xb))
  np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
  assert len(np.unique(np.asarray(got, np.float32))) > 40  # not flat
  assert "reduce-precision(" in scaled.lower(xb).compile().as_text()


def _rtz_reference(x: np.ndarray, f) -> np.ndarray:
  """Toward zero in ``f`` by ml_dtypes: the nearest value, one step back
  toward zero where it lies farther out than ``x`` (NumPy, exact)."""
  c = np.clip(np.where(np.isfinite(x), x, 0), -f.max, f.max)
  n = c.astype(f.dtype)
  u = {1: np.uint8, 2: np.uint16}[np.dtype(f.dtype).itemsize]
  stepped = (n.view(u) - u(1)).view(f.dtype)
  up = np.abs(n.astype(x.dtype)) > np.abs(c)
  y = np.where(up, stepped, n).astype(x.dtype)
  return np.where(np.isfinite(x), y, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", FORMATS)
def test_truncation_is_one_step_toward_zero_from_the_nearest(name, dtype):
  f = fm.FORMATS[name]
  x = _hard(5, dtype)
  with jax.enable_x64(dtype == np.float64):
    fn = jax.jit(lambda v: fm.round_toward_zero(v, f))
    got = np.asarray(fn(jnp.asarray(x)))
    hlo = fn.lower(jnp.asarray(x[:4096])).compile().as_text()
  with np.errstate(over="ignore", invalid="ignore"):
    want = _rtz_reference(x, f)
  assert _same(got, want).all(), x[~_same(got, want)][:8]
  assert (np.abs(got[np.isfinite(x)]) <= np.abs(x[np.isfinite(x)])).all()
  assert HLO_TYPE[name] not in hlo


def _emulated_attention_acc_bf16(q, k, v) -> np.ndarray:
  """models.layers.attention with both products accumulated in bf16 in
  16-term chunks (each chunk's sum and the running sum rounded to bf16),
  the scaled scores and the softmax rounded to bf16 as the layer's dtype
  does: NumPy and ml_dtypes, float64 chunk sums."""
  bf = ml_dtypes.bfloat16
  rb = lambda a: a.astype(np.float32).astype(bf).astype(np.float32)

  def acc(lhs, rhs, n):
    out = 0.0
    for i in range(-(-n // 16)):
      s = slice(16 * i, 16 * (i + 1))
      p = np.sum(lhs[..., s].astype(np.float64) * rhs[..., s], -1)
      out = rb(out + rb(p))
    return out

  q, k, v = (np.asarray(a, np.float32).transpose(0, 2, 1, 3)
             for a in (q, k, v))  # (b, h, t, d)
  d, t = q.shape[-1], k.shape[2]
  s = rb(acc(q[:, :, :, None], k[:, :, None], d) / np.float32(np.sqrt(d)))
  e = np.exp(s - s.max(-1, keepdims=True))
  p = rb(e / e.sum(-1, keepdims=True))
  o = acc(v.transpose(0, 1, 3, 2)[:, :, :, None], p[:, :, None], t)
  return o.transpose(0, 3, 1, 2)  # (b, t, h, d)


def test_a_bf16_attentions_accumulation_rounds_where_xla_fuses():
  """Inside a bf16 attention XLA:CPU too dropped the convert pairs the
  accumulation emulation used to round with (next to its own bf16
  upcasts): 9,126 of 16,640 outputs of a (4, 65, 4, 16) case differed
  from this emulation (up to 2^-6). Now at most the softmax's float32
  exp and division differ, by a bf16 ulp."""
  from peat_jax.models import layers  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(6)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 65, 2, 16)), jnp.bfloat16)
             for _ in range(3))
  kut = injectors.injecting_kernel("accumulation:bf16",
                                   layers.attention.__wrapped__, chunk=16)
  got = np.asarray(jax.jit(lambda *a: kut(*a, inject_key=jax.random.PRNGKey(
      5)))(q, k, v), np.float32)
  want = _emulated_attention_acc_bf16(q, k, v)
  off = got != want
  assert off.sum() <= 4, (off.sum(), np.abs(got - want).max())
  assert np.abs(got - want).max() <= 2.0 ** -9
