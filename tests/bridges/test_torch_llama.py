"""torch KUTs at the Llama kernels' sites: rms_norm, silu, rope, GQA attention.

Each built-in spec (``torch:rms_norm`` = F.rms_norm, ``torch:silu`` =
F.silu, ``torch:rope`` = a rope written in torch, ``torch:attention`` =
SDPA with ``enable_gqa``) runs on seeded random float32 and bfloat16
inputs next to the golden JAX function, forward and backward (jax.grad
through the bridge: torch autograd), and must stay within a small multiple
of golden's own error to a float64 reference; grouped-query attention runs
with fewer kv heads than query heads.
"""

import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import peat_jax as peat
from peat_jax import bridges  # noqa: F401  (registers the torch: specs)
from peat_jax import kernels
from peat_jax.bridges import torch_kut as tk
from peat_jax.kernels.checks import rope_golden as golden_rope
from peat_jax.kernels.checks import silu_golden as golden_silu

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [jnp.float32, jnp.bfloat16]


def _ids(d):
  return jnp.dtype(d).name


def _rand(seed, shape, dtype=jnp.float32, scale=1.0, shift=0.0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(shift + scale * rng.standard_normal(shape), dtype)


def _f64(a):
  return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


# -------------------------------------------- golden (float64: reference)


def golden_rms_norm(x, scale, eps=1e-6):
  """nnx.RMSNorm(dtype=x.dtype): float32 statistics, one rounding."""
  if x.dtype == jnp.float64:  # the reference: the same math in float64
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * scale
  layer = nnx.RMSNorm(x.shape[-1], epsilon=eps, dtype=x.dtype,
                      param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  layer.scale[...] = scale
  return layer(x)


def golden_attention(q, k, v, mask=None, *, bias=None, scale=None,
                     is_causal=False):
  return jax.nn.dot_product_attention(q, k, v, bias, mask, scale=scale,
                                      is_causal=is_causal)


# ------------------------------------------------------------- helpers


def _value_and_grads(f, args, probe):
  floats = tuple(i for i, a in enumerate(args)
                 if jnp.issubdtype(a.dtype, jnp.floating))
  loss = lambda *a: jnp.sum(f(*a).astype(probe.dtype) * probe)  # noqa: E731
  return (jax.jit(f)(*args),
          jax.jit(jax.grad(loss, argnums=floats))(*args))


def _reference(f, args, probe):
  with jax.enable_x64(True):
    a64 = [jnp.asarray(_f64(a)) if jnp.issubdtype(a.dtype, jnp.floating)
           else a for a in args]
    return _value_and_grads(f, a64, jnp.asarray(_f64(probe)))


def _err(t, r):
  t, r = _f64(t), np.asarray(r, np.float64)
  return float(np.max(np.abs(t - r)) / np.max(np.abs(r)))


def _check(kut, golden, args, dtype, factor=3.0, floor_ulps=1.0):
  """KUT's value and gradients within factor x golden's error (float64)."""
  probe = _rand(99, jax.eval_shape(golden, *args).shape)
  got = _value_and_grads(kut, args, probe)
  gold = _value_and_grads(golden, args, probe)
  ref = _reference(golden, args, probe)
  assert got[0].dtype == jnp.dtype(dtype) and got[0].shape == gold[0].shape
  floor = floor_ulps * float(jnp.finfo(dtype).eps)
  for name, k, g, r in zip(["value"] + [f"grad{i}" for i in range(9)],
                           jax.tree.leaves(got), jax.tree.leaves(gold),
                           jax.tree.leaves(ref)):
    assert k.dtype == g.dtype, name
    ek, eg = _err(k, r), _err(g, r)
    assert ek <= factor * eg + floor, (name, ek, eg)
  return got


def _kut(spec):
  sub, = peat.resolve_kut(spec)
  return sub.kut


# ------------------------------------------------------ built-in specs


def test_llama_builtins_are_registered_at_their_kernels():
  want = {"torch:rms_norm": "rms_norm", "torch:silu": "silu",
          "torch:rope": "rope", "torch:attention": "attention"}
  for spec, kernel in want.items():
    sub, = peat.resolve_kut(spec)
    assert sub.kernel == kernel and sub.phase == "fwd"
    assert bridges.registered()[spec].kernel == kernel


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_torch_rms_norm_matches_golden(dtype):
  """F.rms_norm; the scale is the layer's float32 parameter, applied in
  x's dtype as nnx.RMSNorm(dtype=x.dtype) does."""
  x = _rand(1, (4, 6, 64), dtype, 1.3, 0.2)
  scale = _rand(2, (64,), scale=0.2, shift=1.0)
  kut = _kut("torch:rms_norm")
  _, (dx, dscale) = _check(lambda x, s: kut(x, s, 1e-6),
                           lambda x, s: golden_rms_norm(x, s, 1e-6),
                           (x, scale), dtype)
  assert dx.dtype == jnp.dtype(dtype) and dscale.dtype == jnp.float32
  # A layer without scale.
  np.testing.assert_allclose(
      _f64(kut(x, None, 1e-6)),
      _f64(golden_rms_norm(x, jnp.ones((64,)), 1e-6)),
      rtol=2 * float(jnp.finfo(dtype).eps), atol=1e-6)


@pytest.mark.parametrize("gated", [False, True], ids=["silu", "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_torch_silu_matches_golden(dtype, gated):
  """F.silu; at a SwiGLU site F.silu(x) * up (two roundings in bf16, as
  HF Llama's act_fn(gate) * up)."""
  x = _rand(3, (4, 8, 48), dtype, 2.0)
  args = (x, _rand(4, x.shape, dtype)) if gated else (x,)
  _check(_kut("torch:silu"), golden_silu, args, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_torch_rope_matches_golden(dtype):
  x = _rand(5, (2, 32, 3, 16), dtype)
  pos = jnp.arange(32, dtype=jnp.int32) + 3
  kut = _kut("torch:rope")
  _check(lambda x: kut(x, pos, theta=500.0),
         lambda x: golden_rope(x, pos, 500.0), (x,), dtype)
  # theta also by position (the marked function's own call).
  np.testing.assert_array_equal(
      _f64(jax.jit(lambda x: kut(x, pos, 500.0))(x)),
      _f64(jax.jit(lambda x: kut(x, pos, theta=500.0))(x)))


@pytest.mark.parametrize("dtype,case", [
    (jnp.float32, "mask"), (jnp.bfloat16, "mask"), (jnp.bfloat16, "causal"),
    (jnp.float32, "mha")], ids=["float32-mask", "bfloat16-mask",
                                "bfloat16-causal", "float32-mha"])
def test_torch_attention_with_fewer_kv_heads(dtype, case):
  """SDPA with enable_gqa=True: query head j uses kv head j // (H / Hk)."""
  hk = 4 if case == "mha" else 2
  q = _rand(6, (2, 12, 4, 8), dtype)
  k, v = _rand(7, (2, 12, hk, 8), dtype), _rand(8, (2, 12, hk, 8), dtype)
  kut = _kut("torch:attention")
  if case == "mask":
    mask = jnp.asarray(np.random.default_rng(9).random((2, 1, 12, 12)) > 0.3)
    mask = mask.at[..., 0].set(True)
    f = lambda fn: lambda q, k, v: fn(q, k, v, mask)  # noqa: E731
  elif case == "causal":
    f = lambda fn: lambda q, k, v: fn(q, k, v, is_causal=True)  # noqa: E731
  else:
    f = lambda fn: fn  # noqa: E731
  _, (dq, dk, dv) = _check(f(kut), f(golden_attention), (q, k, v), dtype)
  assert dk.shape == k.shape and dv.shape == v.shape


def test_torch_attention_refuses_heads_that_do_not_group():
  q = _rand(10, (1, 4, 4, 8))
  k, v = _rand(11, (1, 4, 3, 8)), _rand(12, (1, 4, 3, 8))
  with pytest.raises(peat.PeatError, match="4 query heads and 3 key"):
    _kut("torch:attention")(q, k, v)


# ------------------------- your own torch functions, their own signature


@pytest.fixture()
def torch_module(tmp_path, monkeypatch):
  """A kernel engineer's torch kernels, importable from the cwd."""
  (tmp_path / "my_llama_torch.py").write_text(textwrap.dedent("""
      import torch
      import torch.nn.functional as F

      def rms_norm(x, normalized_shape, weight, eps):
        xf = x.float()
        h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)          # HF LlamaRMSNorm

      def swiglu(gate, up):                    # a fused SwiGLU
        return (F.silu(gate.float()) * up.float()).to(gate.dtype)

      def rope_gptj(x, positions, theta):      # the interleaved layout
        d = x.shape[-1]
        inv = theta ** (-torch.arange(0, d, 2).float() / d)
        a = positions.float()[:, None] * inv
        c, s = a.cos()[None, :, None], a.sin()[None, :, None]
        xf = x.float()
        xe, xo = xf[..., 0::2], xf[..., 1::2]
        return torch.stack([xe * c - xo * s, xo * c + xe * s],
                           -1).flatten(-2).to(x.dtype)

      def sdpa_gqa(q, k, v, attn_mask=None, **kw):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              **kw)
      """))
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))
  yield "my_llama_torch"
  sys.modules.pop("my_llama_torch", None)


def _user(module, function, kernel):
  spec = kernels.parse_kut(f"torch:{module}:{function}", kernel=kernel)
  assert spec.spec == f"torch:{module}:{function}@{kernel}"
  return kernels.kut.kut_callable(spec)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_user_torch_functions_at_llama_sites(torch_module, dtype):
  x = _rand(20, (2, 16, 4, 8), dtype)
  up = _rand(21, x.shape, dtype)
  scale = _rand(22, (8,), scale=0.2, shift=1.0)
  pos = jnp.arange(16, dtype=jnp.int32)
  # HF's RMSNorm: correct (two roundings in bf16).
  hf = _user(torch_module, "rms_norm", "rms_norm")
  _check(lambda x, s: hf(x, s, 1e-6), lambda x, s: golden_rms_norm(x, s, 1e-6),
         (x, scale), dtype)
  # A fused SwiGLU gets (gate, up): two required positional arguments.
  sw = _user(torch_module, "swiglu", "silu")
  _check(sw, golden_silu, (x, up), dtype)
  # GQA through the user's SDPA wrapper.
  att = _user(torch_module, "sdpa_gqa", "attention")
  k, v = x[:, :, :2], up[:, :, :2]
  _check(lambda q, k, v: att(q, k, v, is_causal=True),
         lambda q, k, v: golden_attention(q, k, v, is_causal=True),
         (x, k, v), dtype)
  # A wrong rope (GPT-J layout) is far outside golden's error.
  gptj = _user(torch_module, "rope_gptj", "rope")
  r = golden_rope(jnp.asarray(_f64(x), jnp.float32), pos)
  assert _err(gptj(x, pos, theta=1e4), _f64(r)) > 0.3


def test_torch_kuts_run_at_marked_llama_sites():
  """peat.substitute with the built-in specs at silu, rope and attention
  sites of a bf16 function; forward and the KUT's VJP (backward="kut")."""

  @peat.composite("silu")
  def swiglu(gate, up):
    return golden_silu(gate, up)

  @peat.composite("rope")
  def rope(x, positions, theta=10000.0):
    return golden_rope(x, positions, theta)

  @peat.composite("attention")
  def attention(q, k, v, mask=None):
    return golden_attention(q, k, v, mask)

  pos = jnp.arange(8, dtype=jnp.int32)
  mask = jnp.tril(jnp.ones((8, 8), bool))[None, None]

  def step(q, k, v):
    def loss(q, k, v):
      h = attention(rope(q, pos, theta=100.0), rope(k, pos, theta=100.0), v,
                    mask)
      return jnp.sum(swiglu(h, h * 0.5).astype(jnp.float32))
    return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

  dt = jnp.bfloat16
  q = _rand(30, (2, 8, 4, 8), dt)
  k, v = _rand(31, (2, 8, 2, 8), dt), _rand(32, (2, 8, 2, 8), dt)
  subs = [s for spec in ("torch:silu", "torch:rope", "torch:attention")
          for s in peat.resolve_kut(spec, backward="kut")]
  got = jax.jit(peat.substitute(step, *subs))(q, k, v)
  gold = jax.jit(step)(q, k, v)
  with jax.enable_x64(True):
    ref = step(*(jnp.asarray(_f64(a)) for a in (q, k, v)))
  for kk, g, r in zip(jax.tree.leaves(got), jax.tree.leaves(gold),
                      jax.tree.leaves(ref)):
    assert kk.dtype == g.dtype
    assert _err(kk, r) <= 3 * _err(g, r) + 0.02
