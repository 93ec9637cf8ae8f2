"""The Llama kernels' plain-JAX ports (peat_jax.kernels.ports) vs golden.

Every port runs on seeded random inputs (never zeros), float32 and
bfloat16, next to the golden kernel and a float64 reference of the golden
computation: the correct ports (BENIGN_PORTS, expected ``reordering``) stay
within a small multiple of golden's own error; each slip (LLAMA_PORTS) is
off by what its error model predicts: ``parameter`` and ``indexing`` slips
equal the reference of the golden computation with another constant or
golden's values in other places, ``accumulation:bf16`` grows with the row
length from bf16 rounding, ``precision:bf16`` is bf16 rounding.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import peat_jax as peat
from peat_jax.kernels import ports

DTYPES = [jnp.float32, jnp.bfloat16]
U_BF16 = 2.0 ** -8
LLAMA_KINDS = ("rms_norm", "silu", "rope", "attention")


def _ids(d):
  return jnp.dtype(d).name


def _u(dtype) -> float:
  return float(jnp.finfo(dtype).eps) / 2


def _f64(a) -> np.ndarray:
  return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def _rand(seed, shape, dtype=jnp.float32, scale=1.0, shift=0.0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(shift + scale * rng.standard_normal(shape), dtype)


def _err(t, r) -> tuple[float, float]:
  """(max, RMS) of |t - r|, relative to max |r| and RMS r."""
  d = _f64(t) - r
  return (float(np.max(np.abs(d)) / np.max(np.abs(r))),
          float(np.sqrt(np.mean(d * d)) / np.sqrt(np.mean(r * r))))


# ------------------------------------------------ golden and float64


def golden_rms_norm(x, scale, eps=1e-6):
  """flax nnx.RMSNorm(dtype=x.dtype): float32 statistics, one rounding."""
  layer = nnx.RMSNorm(x.shape[-1], epsilon=eps, dtype=x.dtype,
                      param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  layer.scale[...] = scale
  return layer(x)


def ref_rms_norm(x, scale, eps=1e-6, *, centred=False):
  x = _f64(x)
  if centred:  # a layer norm without bias
    x = x - np.mean(x, -1, keepdims=True)
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * _f64(scale)


def golden_silu(x, up=None):
  """jax.nn.silu in x's dtype; SwiGLU: float32 inside, one rounding."""
  if up is None:
    return jax.nn.silu(x)
  return (jax.nn.silu(x.astype(jnp.float32))
          * up.astype(jnp.float32)).astype(x.dtype)


def ref_silu(x, up=None):
  x = _f64(x)
  y = x / (1.0 + np.exp(-x))
  return y if up is None else y * _f64(up)


def golden_rope(x, positions, theta=10000.0):
  d = x.shape[-1]
  h = d // 2
  inv = theta ** (-jnp.arange(h, dtype=jnp.float32) * (2.0 / d))
  ang = positions.astype(jnp.float32)[:, None] * inv[None, :]
  cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
  xf = x.astype(jnp.float32)
  x1, x2 = xf[..., :h], xf[..., h:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                         -1).astype(x.dtype)


def ref_rope(x, positions, theta=10000.0):
  x = _f64(x)
  d = x.shape[-1]
  h = d // 2
  ang = np.asarray(positions, np.float64)[:, None] * theta ** (
      -2.0 * np.arange(h) / d)
  cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
  x1, x2 = x[..., :h], x[..., h:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def golden_attention(q, k, v, mask=None, *, bias=None, scale=None,
                     is_causal=False):
  return jax.nn.dot_product_attention(q, k, v, bias, mask, scale=scale,
                                      is_causal=is_causal)


def ref_attention(q, k, v, mask=None, *, kv_head=None):
  """float64 GQA attention; ``kv_head(h, hk)``: query head -> kv head."""
  q, k, v = _f64(q), _f64(k), _f64(v)
  h, hk = q.shape[2], k.shape[2]
  idx = (np.arange(h) // (h // hk)) if kv_head is None else kv_head(h, hk)
  s = np.einsum("bthd,bshd->bhts", q, k[:, :, idx]) / np.sqrt(q.shape[-1])
  if mask is not None:
    s = np.where(np.asarray(mask), s, -np.inf)
  p = np.exp(s - np.max(s, -1, keepdims=True))
  p /= np.sum(p, -1, keepdims=True)
  return np.einsum("bhts,bshd->bthd", p, v[:, :, idx])


# --------------------------------------------------------------- cases


def _bf16_exact(a):
  """a rounded to bf16, held in float32 (a parameter both paths agree on)."""
  return jnp.asarray(a, jnp.bfloat16).astype(jnp.float32)


def _case(kind: str, dtype, variant: str = ""):
  """(args, kwargs, golden, float64 reference) of a site of ``kind``."""
  if kind == "rms_norm":
    x = _rand(1, (32, 256), dtype, 1.5, 0.3)
    scale = _bf16_exact(_rand(2, (256,), scale=0.2, shift=1.0))
    return ((x, scale, 1e-6), {}, golden_rms_norm,
            ref_rms_norm(x, scale, 1e-6))
  if kind == "silu":
    x = _rand(3, (8, 32, 96), dtype, 2.0)
    if variant == "plain":
      return (x,), {}, golden_silu, ref_silu(x)
    up = _rand(4, x.shape, dtype)
    return (x, up), {}, golden_silu, ref_silu(x, up)
  if kind == "rope":
    x = _rand(5, (2, 64, 4, 32), dtype)
    pos = jnp.arange(64, dtype=jnp.int32) + 7
    return ((x, pos), {"theta": 10000.0}, golden_rope,
            ref_rope(x, pos, 10000.0))
  if kind == "attention":
    q = _rand(6, (2, 24, 8, 16), dtype)
    k, v = _rand(7, (2, 24, 2, 16), dtype), _rand(8, (2, 24, 2, 16), dtype)
    mask = jnp.tril(jnp.ones((24, 24), bool))[None, None]
    return (q, k, v, mask), {}, golden_attention, ref_attention(q, k, v, mask)
  raise ValueError(kind)


def _run(fn, args, kwargs):
  """fn(*args, **kwargs) jitted, its non-array arguments static."""
  where = [i for i, a in enumerate(args) if hasattr(a, "shape")]

  def call(*arrays):
    full = list(args)
    for i, a in zip(where, arrays):
      full[i] = a
    return fn(*full, **kwargs)

  return jax.jit(call)(*[args[i] for i in where])


# -------------------------------------------------------- the registries


def test_registries_name_every_llama_port_and_its_model():
  benign = {n: k for n, (k, _) in ports.BENIGN_PORTS.items()}
  assert {n for n, k in benign.items() if k in LLAMA_KINDS} == {
      "rms_norm_hf", "rms_norm_l2", "rms_norm_two_pass", "rms_norm_welford",
      "silu_f32", "rope_f32_tables", "gqa_repeat"}
  for name, kernel in benign.items():
    assert ports.EXPECTED_ERROR_MODEL[kernel][name] == "reordering"
  want = {
      "rms_norm_acc_bf16": "accumulation:bf16", "rms_norm_eps": "parameter",
      "rms_norm_as_layer_norm": "parameter", "silu_bf16": "precision:bf16",
      "swiglu_swapped": "indexing", "rope_interleaved": "indexing",
      "rope_theta_500k": "parameter", "rope_offset": "parameter",
      "gqa_wrong_group": "indexing"}
  got = {n: ports.EXPECTED_ERROR_MODEL[k][n]
         for k, ps in ports.LLAMA_PORTS.items() for n in ps}
  assert got == want
  # The kinds the composed calibration runs on are unchanged.
  assert set(ports.PORTS) == {"layer_norm", "softmax", "attention", "gelu"}


# ------------------------------------------------------- correct ports


BENIGN_CASES = [(n, k, v) for n, (k, _) in ports.BENIGN_PORTS.items()
                if k in LLAMA_KINDS
                for v in (("plain", "gated") if k == "silu" else ("",))]


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("name,kind,variant", BENIGN_CASES,
                         ids=[f"{n}{'-' + v if v else ''}"
                              for n, _, v in BENIGN_CASES])
def test_correct_port_is_within_golden_error(name, kind, variant, dtype):
  fn = ports.BENIGN_PORTS[name][1]
  args, kwargs, golden, r = _case(kind, dtype, variant)
  t, g = _run(fn, args, kwargs), _run(golden, args, kwargs)
  assert t.shape == g.shape and t.dtype == g.dtype
  (tmax, trms), (gmax, grms) = _err(t, r), _err(g, r)
  floor = 0.25 * _u(dtype)
  assert tmax <= 3 * gmax + floor, (tmax, gmax)
  assert trms <= 2 * grms + floor, (trms, grms)
  assert not np.array_equal(_f64(t), np.zeros_like(r))


# --------------------------------------------------------------- slips


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_acc_bf16_grows_with_the_row_length(dtype):
  """accumulation:bf16: from about one bf16 rounding at n = 64, growing
  with n (stagnation of a bf16 sum), within the n u(bf16) bound."""
  errs = {}
  for n in (64, 1024):
    x = _rand(10 + n, (32, n), dtype, 1.0, 0.2)
    scale = _bf16_exact(_rand(11, (n,), scale=0.2, shift=1.0))
    r = ref_rms_norm(x, scale)
    t = jax.jit(ports.rms_norm_acc_bf16)(x, scale, 1e-6)
    g = jax.jit(golden_rms_norm)(x, scale, 1e-6)
    errs[n] = _err(t, r)[1]
    assert 0.25 * U_BF16 <= errs[n] <= n * U_BF16
    assert errs[n] >= (1.5 if dtype == jnp.bfloat16 else 1e3) * _err(g, r)[1]
  assert errs[1024] >= 4 * errs[64], errs


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_eps_slip_is_the_predicted_per_row_factor(dtype):
  """parameter: each row is golden times sqrt((ms + eps) / (ms +
  port_eps)), i.e. a relative error of about (1e-5 - 1e-6) / (2 ms)."""
  row_scale = np.geomspace(0.003, 0.012, 16)[:, None]
  x = jnp.asarray(_f64(_rand(20, (16, 128))) * row_scale, dtype)
  scale = _bf16_exact(_rand(21, (128,), scale=0.1, shift=1.0))
  fn = ports.LLAMA_PORTS["rms_norm"]["rms_norm_eps"]
  t = _f64(jax.jit(fn)(x, scale, 1e-6))
  r = ref_rms_norm(x, scale, 1e-6)
  ms = np.mean(_f64(x) ** 2, -1)
  factor = np.sum(t * r, -1) / np.sum(r * r, -1)  # per row, least squares
  predicted = np.sqrt((ms + 1e-6) / (ms + 1e-5))
  assert np.all(np.abs(factor - predicted) <= 0.03 * (1 - predicted)
                + 4 * _u(dtype) / np.sqrt(128)), (factor, predicted)
  first_order = (1e-5 - 1e-6) / (2 * ms)
  small = first_order < 0.05
  np.testing.assert_allclose(1 - factor[small], first_order[small], rtol=0.1)
  assert np.min(1 - predicted) > 4 * _u(dtype)  # visible in this dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_rms_norm_as_layer_norm_is_the_centred_norm(dtype):
  """parameter: a layer norm without bias, off golden by the row mean."""
  x = jnp.asarray(_f64(_rand(30, (32, 256))) + np.linspace(-1, 1, 32)[:, None],
                  dtype)
  scale = _bf16_exact(_rand(31, (256,), scale=0.2, shift=1.0))
  t = jax.jit(ports.rms_norm_as_layer_norm)(x, scale, 1e-6)
  g = jax.jit(golden_rms_norm)(x, scale, 1e-6)
  r = ref_rms_norm(x, scale)
  r_ln = ref_rms_norm(x, scale, centred=True)
  gmax, grms = _err(g, r)
  tmax, trms = _err(t, r_ln)
  assert tmax <= 3 * gmax + 0.25 * _u(dtype) and trms <= 2 * grms
  # The whole difference to golden is the centring.
  d_t, d_ln = _f64(t) - r, r_ln - r
  assert abs(np.linalg.norm(d_t) / np.linalg.norm(d_ln) - 1) < 0.05
  assert _err(t, r)[1] > 50 * grms


@pytest.mark.parametrize("variant", ["plain", "gated"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_silu_bf16_is_bf16_rounding(dtype, variant):
  """precision:bf16: an RMS error of a few bf16 roundings at any site
  (at a float32 site thousands of times golden's; jax.nn.silu in bf16,
  golden of a bf16 plain SiLU site, rounds every operation too)."""
  args, _, golden, r = _case("silu", dtype, variant)
  t, g = jax.jit(ports.silu_bf16)(*args), jax.jit(golden)(*args)
  assert t.dtype == g.dtype
  trms, grms = _err(t, r)[1], _err(g, r)[1]
  assert 0.25 * U_BF16 <= trms <= 4 * U_BF16, trms
  if dtype == jnp.float32:
    assert trms > 1e3 * grms
  elif variant == "gated":
    assert trms > 1.3 * grms, (trms, grms)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_swiglu_swapped_is_golden_of_swapped_operands(dtype):
  (x, up), _, golden, r = _case("silu", dtype, "gated")
  t = jax.jit(ports.swiglu_swapped)(x, up)
  np.testing.assert_array_equal(_f64(t), _f64(golden(up, x)))
  assert _err(t, r)[1] > 0.3
  # No up operand: the plain SiLU, within golden's rounding.
  (x,), _, golden, r = _case("silu", dtype, "plain")
  assert _err(ports.swiglu_swapped(x), r)[0] <= 3 * _err(golden(x), r)[0]


def _far(t, r, g):
  """t is far from the reference: beyond 50 x golden's error and 0.1."""
  e = _err(t, r)[1]
  assert e > 0.1 and e > 50 * _err(g, r)[1], e


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_rope_slips_are_golden_with_another_constant_or_layout(dtype):
  (x, pos), kw, golden, r = _case("rope", dtype)
  g = jax.jit(lambda x: golden(x, pos, **kw))(x)
  gmax, grms = _err(g, r)
  within = lambda t, r_alt: (  # noqa: E731
      _err(t, r_alt)[0] <= 3 * gmax + 0.25 * _u(dtype)
      and _err(t, r_alt)[1] <= 2 * grms + 0.25 * _u(dtype))
  # indexing: golden's rotation of (x[2i], x[2i+1]) pairs, i.e. golden on
  # the de-interleaved features, interleaved back.
  d = x.shape[-1]
  perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
  t = jax.jit(lambda x: ports.rope_interleaved(x, pos, **kw))(x)
  assert within(t, ref_rope(x[..., perm], pos)[..., np.argsort(perm)])
  _far(t, r, g)
  # parameter: another base, other positions.
  t = jax.jit(lambda x: ports.rope_theta_500k(x, pos, **kw))(x)
  assert within(t, ref_rope(x, pos, 500000.0))
  _far(t, r, g)
  t = jax.jit(lambda x: ports.rope_offset(x, pos, **kw))(x)
  assert within(t, ref_rope(x, pos + 1, 10000.0))
  _far(t, r, g)
  # theta by position works as by keyword (the marked function's own call).
  np.testing.assert_array_equal(
      _f64(jax.jit(lambda x: ports.rope_offset(x, pos, 10000.0))(x)),
      _f64(t))


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_gqa_wrong_group_uses_the_tiled_kv_heads(dtype):
  (q, k, v, mask), _, golden, r = _case("attention", dtype)
  g = jax.jit(golden)(q, k, v, mask)
  t = jax.jit(ports.gqa_wrong_group)(q, k, v, mask)
  gmax, grms = _err(g, r)
  r_tiled = ref_attention(q, k, v, mask, kv_head=lambda h, hk: np.arange(h) % hk)
  tmax, trms = _err(t, r_tiled)
  assert tmax <= 3 * gmax + 0.25 * _u(dtype) and trms <= 2 * grms
  _far(t, r, g)
  # Head 0 (and head 5: 5 % 2 == 5 // 4) is golden's; the others are not.
  for head in (0, 5):
    assert _err(t[:, :, head], r[:, :, head])[0] <= 3 * gmax + _u(dtype)
  # With as many kv heads as query heads there is nothing to group.
  k8, v8 = _rand(9, q.shape, dtype), _rand(10, q.shape, dtype)
  r8 = ref_attention(q, k8, v8, mask)
  assert _err(jax.jit(ports.gqa_wrong_group)(q, k8, v8, mask), r8)[0] <= (
      3 * _err(jax.jit(golden)(q, k8, v8, mask), r8)[0] + _u(dtype))


def test_gqa_ports_take_the_other_attention_arguments():
  """is_causal, scale and bias as golden's jax.nn.dot_product_attention."""
  q = _rand(40, (1, 8, 4, 8))
  k, v = _rand(41, (1, 8, 2, 8)), _rand(42, (1, 8, 2, 8))
  bias = _rand(43, (1, 4, 8, 8), scale=0.5)
  for kw in ({"is_causal": True}, {"scale": 0.3}, {"bias": bias}):
    np.testing.assert_allclose(
        np.asarray(_run(ports.gqa_repeat, (q, k, v), kw)),
        np.asarray(_run(golden_attention, (q, k, v), kw)), rtol=2e-5,
        atol=2e-6)
  with pytest.raises(ValueError, match="multiple"):
    ports.gqa_repeat(q, _rand(44, (1, 8, 3, 8)), _rand(45, (1, 8, 3, 8)))


def test_rms_norm_ports_take_a_float32_scale_and_no_scale():
  """A bf16 site's scale is the layer's float32 parameter (applied in
  bf16 as nnx.RMSNorm(dtype=bf16) does); a layer may have none."""
  x = _rand(50, (4, 64), jnp.bfloat16)
  scale = _rand(51, (64,), scale=0.2, shift=1.0)  # not bf16-exact
  g = _run(golden_rms_norm, (x, scale), {})
  for name in ("rms_norm_l2", "rms_norm_two_pass", "rms_norm_welford"):
    t = _run(ports.BENIGN_PORTS[name][1], (x, scale, 1e-6), {})
    assert t.dtype == jnp.bfloat16
    np.testing.assert_allclose(_f64(t), _f64(g), rtol=2 * U_BF16, atol=1e-6)
  no_scale = ref_rms_norm(x, np.ones(64))
  for fn in (ports.rms_norm_hf, ports.rms_norm_welford, ports.rms_norm_l2):
    np.testing.assert_allclose(_f64(_run(fn, (x, None, 1e-6), {})), no_scale,
                               rtol=2 * U_BF16, atol=1e-6)


# ----------------------------------------------------- as KUTs at sites


@peat.composite("silu")
def _swiglu_site(gate, up):
  return golden_silu(gate, up)


@peat.composite("rope")
def _rope_site(x, positions, theta=10000.0):
  return golden_rope(x, positions, theta)


@peat.composite("attention")
def _gqa_site(q, k, v, mask=None):
  return golden_attention(q, k, v, mask)


def _site_fns():
  """kind -> (step with one site of that kind, its arguments, the KUT's
  arguments at that site as (args, kwargs))."""
  rms = nnx.RMSNorm(32, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                    rngs=nnx.Rngs(0))
  rms.scale[...] = _rand(60, (32,), scale=0.2, shift=1.0)
  x = _rand(61, (4, 6, 32), jnp.bfloat16)
  up = _rand(62, (4, 6, 32), jnp.bfloat16)
  xr = _rand(63, (2, 6, 4, 8), jnp.bfloat16)
  pos = jnp.arange(6, dtype=jnp.int32)
  k, v = _rand(64, (2, 6, 2, 8), jnp.bfloat16), _rand(65, (2, 6, 2, 8),
                                                       jnp.bfloat16)
  mask = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  return {
      "rms_norm": (lambda x: rms(x), (x,),
                   ((x, rms.scale[...], rms.epsilon), {})),
      "silu": (_swiglu_site, (x, up), ((x, up), {})),
      "rope": (lambda x: _rope_site(x, pos, theta=500.0), (xr,),
               ((xr, pos), {"theta": 500.0})),
      "attention": (lambda q, k, v: _gqa_site(q, k, v, mask), (xr, k, v),
                    ((xr, k, v, mask), {})),
  }


ALL_LLAMA = sorted(
    [(k, n, fn) for n, (k, fn) in ports.BENIGN_PORTS.items()
     if k in LLAMA_KINDS]
    + [(k, n, fn) for k, ps in ports.LLAMA_PORTS.items()
       for n, fn in ps.items()], key=lambda c: (c[0], c[1]))


def test_every_llama_port_runs_as_a_kut_at_its_site():
  """register_kut + substitute: each port takes its site's arguments (a
  bf16 model's: nnx.RMSNorm's float32 scale, theta by keyword) and gives
  there what it gives when called directly."""
  sites = _site_fns()
  for kind, name, fn in ALL_LLAMA:
    f, args, (kargs, kkw) = sites[kind]
    peat.register_kut(f"test_llama:{name}", fn, kernel=kind)
    sub, = peat.resolve_kut(f"test_llama:{name}")
    assert sub.kernel == kind
    got = jax.jit(peat.substitute(f, sub))(*args)
    assert got.dtype == jnp.bfloat16, name
    np.testing.assert_array_equal(_f64(got), _f64(_run(fn, kargs, kkw)),
                                  err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_acc_bf16_error_keeps_growing_to_long_rows(dtype):
  """accumulation:bf16 up to Llama's width (4096): the error keeps growing
  with n (a 4096-step scan: about 1.5 s)."""
  errs = []
  for n in (256, 1024, 4096):
    x = _rand(70 + n, (8, n), dtype, 1.0, 0.2)
    scale = jnp.ones((n,), jnp.float32)
    errs.append(_err(jax.jit(ports.rms_norm_acc_bf16)(x, scale, 1e-6),
                     ref_rms_norm(x, scale))[1])
  assert errs[0] < errs[1] < errs[2] <= 4096 * U_BF16, errs


# ------------------------------------- the bf16 rounding survives XLA


def _hard_floats(seed: int) -> np.ndarray:
  """float32 values where a rounding to bf16 can go wrong: every scale,
  exact ties (even and odd), the ends of bf16's range, float32
  subnormals, signed zeros and infinities."""
  rng = np.random.default_rng(seed)
  mant = rng.uniform(1.0, 2.0, 4096)
  expo = rng.integers(-149, 128, 4096)
  wide = (rng.choice([-1.0, 1.0], 4096) * mant * 2.0 ** expo.astype(
      np.float64)).astype(np.float32)
  # bf16 ties: the 16 dropped bits 0x8000 over a kept last bit 0 or 1.
  kept = rng.integers(0, 1 << 16, 2048, dtype=np.uint32) << 16
  ties = (kept | 0x8000).view(np.float32)
  ties = ties[np.isfinite(ties)]
  bf16_max = float(jnp.finfo(jnp.bfloat16).max)
  edge = np.array([bf16_max, np.nextafter(np.float32(bf16_max), np.inf),
                   3.3961514e38, 3.4028235e38, 2.0 ** -126, 2.0 ** -133,
                   1e-45, 2.0 ** -149 * 3, 0.0, -0.0, np.inf, -np.inf],
                  np.float32)
  return np.concatenate([wide, ties, edge, -edge])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_ports_bf16_rounding_is_a_convert_round_trip_bit_for_bit(seed):
  x = jnp.asarray(_hard_floats(seed))
  want = jax.jit(lambda a: a.astype(jnp.bfloat16).astype(jnp.float32))(x)
  got = jax.jit(ports._rb)(x)
  np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                np.asarray(want).view(np.uint32))
  nan = jax.jit(ports._rb)(jnp.asarray([np.nan, -np.nan], jnp.float32))
  assert np.isnan(np.asarray(nan)).all()


@pytest.mark.parametrize("name", ["silu_bf16", "rms_norm_acc_bf16"])
def test_the_ports_bf16_roundings_are_in_the_compiled_program(name):
  """Each of the port's bf16 roundings is a reduce-precision XLA keeps
  after optimizing (on a GPU a convert pair would be removed)."""
  fn = getattr(ports, name)
  x = _rand(60, (4, 64))
  args = (x, None) if name == "silu_bf16" else (x, None, 1e-6)
  hlo = jax.jit(fn).lower(*args).compile().as_text()
  assert hlo.count("reduce-precision(") >= 2, hlo[:2000]
