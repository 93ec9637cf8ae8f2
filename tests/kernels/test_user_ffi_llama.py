"""ffi: KUTs at the Llama kernels' sites: silu (SwiGLU), rope, GQA attention.

A small XLA FFI library is compiled here from the source below (g++
against jax.ffi.include_dir()), outside peat_jax's registry, with handlers
of the silu and rope FFI calling conventions of docs/kernels.md: correct
ones (float32 and bfloat16, forward and backward) must match the golden
kernel within its own rounding, wrong ones (gate and up swapped, the GPT-J
rotary layout) must stand far outside it, and dtypes a handler or the
convention does not take must give the named error before anything runs.
"""

import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import kernels
from peat_jax.kernels import _ffi
from peat_jax.kernels.checks import rope_golden as golden_rope
from peat_jax.kernels.checks import silu_golden as golden_silu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "docs", "examples")

SOURCE = r"""
// silu: x [N][, up [N]] -> y [N]; backward x[, up], dy -> dx[, dup].
// rope: x [B, T, H, D], positions int32 [T] -> y; attribute theta (f32);
//       backward x, positions, dy -> dx.
// float32 and bfloat16 (AnyBuffer), float32 arithmetic inside (double for
// the rotary angles), one rounding to the operands' dtype.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using ffi::AnyBuffer;

namespace {

float FromBf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t ToBf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

bool Supported(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16;
}

float Load(const AnyBuffer& b, size_t i) {
  if (b.element_type() == ffi::DataType::F32)
    return static_cast<const float*>(b.untyped_data())[i];
  return FromBf16(static_cast<const uint16_t*>(b.untyped_data())[i]);
}

void Store(AnyBuffer& b, size_t i, float v) {
  if (b.element_type() == ffi::DataType::F32)
    static_cast<float*>(b.untyped_data())[i] = v;
  else
    static_cast<uint16_t*>(b.untyped_data())[i] = ToBf16(v);
}

ffi::Error BadDtype(const char* what) {
  return ffi::Error::InvalidArgument(std::string(what) +
                                     ": expected float32 or bfloat16");
}

float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// ------------------------------------------------------------------ silu

template <bool kSwap>
ffi::Error SiluFwd(AnyBuffer x, ffi::RemainingArgs rest,
                   ffi::Result<AnyBuffer> y) {
  if (!Supported(x.element_type())) return BadDtype("MySilu");
  if (rest.size() > 1)
    return ffi::Error::InvalidArgument("MySilu: operands x[, up]");
  const size_t n = x.element_count();
  if (rest.size() == 0) {
    for (size_t i = 0; i < n; ++i) {
      const float v = Load(x, i);
      Store(*y, i, v * Sigmoid(v));
    }
    return ffi::Error::Success();
  }
  auto up = rest.get<AnyBuffer>(0);
  if (up.has_error()) return up.error();
  for (size_t i = 0; i < n; ++i) {
    float g = Load(x, i), u = Load(*up, i);
    if (kSwap) std::swap(g, u);  // the wrong one: silu(up) * x
    Store(*y, i, g * Sigmoid(g) * u);
  }
  return ffi::Error::Success();
}

ffi::Error SiluBwd(ffi::RemainingArgs args, ffi::RemainingRets rets) {
  // args: x[, up], dy; rets: dx[, dup]
  const bool gated = args.size() == 3;
  auto x = args.get<AnyBuffer>(0);
  auto dy = args.get<AnyBuffer>(gated ? 2 : 1);
  auto dx = rets.get<AnyBuffer>(0);
  if (x.has_error()) return x.error();
  if (dy.has_error()) return dy.error();
  if (dx.has_error()) return dx.error();
  if (!Supported(x->element_type())) return BadDtype("MySiluBwd");
  const size_t n = x->element_count();
  for (size_t i = 0; i < n; ++i) {
    const float v = Load(*x, i), s = Sigmoid(v), g = Load(*dy, i);
    const float dsilu = s * (1.0f + v * (1.0f - s));
    if (!gated) {
      Store(**dx, i, g * dsilu);
      continue;
    }
    auto up = args.get<AnyBuffer>(1);
    auto dup = rets.get<AnyBuffer>(1);
    if (up.has_error()) return up.error();
    if (dup.has_error()) return dup.error();
    const float u = Load(*up, i);
    Store(**dx, i, g * u * dsilu);
    Store(**dup, i, g * v * s);
  }
  return ffi::Error::Success();
}

// A handler of float32 only (binds Buffer<F32>) and one operand only.
ffi::Error SiluF32(ffi::Buffer<ffi::F32> x,
                   ffi::ResultBuffer<ffi::F32> y) {
  for (size_t i = 0; i < x.element_count(); ++i) {
    const float v = x.typed_data()[i];
    y->typed_data()[i] = v * Sigmoid(v);
  }
  return ffi::Error::Success();
}

// ------------------------------------------------------------------ rope

template <bool kInterleaved, bool kBackward>
ffi::Error Rope(AnyBuffer x, ffi::Buffer<ffi::S32> positions,
                AnyBuffer dy_or_x, ffi::Result<AnyBuffer> y, float theta) {
  // Forward: x, positions -> y (dy_or_x unused, == x). Backward: x,
  // positions, dy -> dx: the rotation by the negated angle applied to dy.
  if (!Supported(x.element_type())) return BadDtype("MyRope");
  auto d = x.dimensions();
  if (d.size() != 4 || d[3] % 2)
    return ffi::Error::InvalidArgument("MyRope: x [B, T, H, D], D even");
  const int64_t b = d[0], t = d[1], h = d[2], dim = d[3], half = dim / 2;
  const AnyBuffer& in = kBackward ? dy_or_x : x;
  const int32_t* pos = positions.typed_data();
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t it = 0; it < t; ++it)
      for (int64_t ih = 0; ih < h; ++ih) {
        const size_t row = ((ib * t + it) * h + ih) * dim;
        for (int64_t i = 0; i < half; ++i) {
          const double inv = std::pow(static_cast<double>(theta),
                                      -2.0 * i / static_cast<double>(dim));
          const double a = pos[it] * inv;
          const double c = std::cos(a), s = kBackward ? -std::sin(a)
                                                      : std::sin(a);
          const size_t j1 = kInterleaved ? row + 2 * i : row + i;
          const size_t j2 = kInterleaved ? row + 2 * i + 1 : row + i + half;
          const double x1 = Load(in, j1), x2 = Load(in, j2);
          Store(*y, j1, static_cast<float>(x1 * c - x2 * s));
          Store(*y, j2, static_cast<float>(x2 * c + x1 * s));
        }
      }
  return ffi::Error::Success();
}

ffi::Error RopeFwd(AnyBuffer x, ffi::Buffer<ffi::S32> p,
                   ffi::Result<AnyBuffer> y, float theta) {
  return Rope<false, false>(x, p, x, y, theta);
}

ffi::Error RopeInterleavedFwd(AnyBuffer x, ffi::Buffer<ffi::S32> p,
                              ffi::Result<AnyBuffer> y, float theta) {
  return Rope<true, false>(x, p, x, y, theta);
}

ffi::Error RopeBwd(AnyBuffer x, ffi::Buffer<ffi::S32> p, AnyBuffer dy,
                   ffi::Result<AnyBuffer> dx, float theta) {
  return Rope<false, true>(x, p, dy, dx, theta);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MySilu, SiluFwd<false>,
                              ffi::Ffi::Bind().Arg<AnyBuffer>()
                                  .RemainingArgs().Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MySiluSwapped, SiluFwd<true>,
                              ffi::Ffi::Bind().Arg<AnyBuffer>()
                                  .RemainingArgs().Ret<AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MySiluBwd, SiluBwd,
                              ffi::Ffi::Bind().RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MySiluF32, SiluF32,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyRope, RopeFwd,
                              ffi::Ffi::Bind().Arg<AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<AnyBuffer>().Attr<float>("theta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyRopeInterleaved, RopeInterleavedFwd,
                              ffi::Ffi::Bind().Arg<AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<AnyBuffer>().Attr<float>("theta"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyRopeBwd, RopeBwd,
                              ffi::Ffi::Bind().Arg<AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<AnyBuffer>()
                                  .Ret<AnyBuffer>().Attr<float>("theta"));
"""

DTYPES = [jnp.float32, jnp.bfloat16]


def _compile(source_path: str, out: str) -> str:
  if _ffi.jax_platform() != "cpu":
    pytest.skip(f"g++ builds CPU handlers; jax computes on "
                f"{_ffi.jax_platform()}, where load_user_library refuses "
                "them (test_user_platform.py)")
  gxx = shutil.which("g++")
  if gxx is None:
    pytest.skip("g++ is not installed: cannot build the FFI library")
  subprocess.run([gxx, "-std=c++17", "-O2", "-fPIC", "-shared",
                  f"-isystem{jax.ffi.include_dir()}", source_path, "-o",
                  out], check=True)
  return out


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
  d = tmp_path_factory.mktemp("ffi_llama")
  src = d / "llama_kernels.cc"
  src.write_text(SOURCE)
  return _compile(str(src), str(d / "libllama_kernels.so"))


@pytest.fixture(scope="module")
def example_lib(tmp_path_factory):
  """docs/examples/ffi_kernels.cc (float32 attention and rms norm)."""
  d = tmp_path_factory.mktemp("ffi_examples")
  return _compile(os.path.join(EXAMPLES, "ffi_kernels.cc"),
                  str(d / "libffi_kernels.so"))


def _kut(spec: str, kernel: str):
  return kernels.kut.kut_callable(kernels.parse_kut(spec, kernel=kernel))


def _rand(seed, shape, dtype, scale=1.0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(scale * rng.standard_normal(shape), dtype)


# ------------------------------------------------------------- goldens


def _f64(a):
  return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def _value_and_grads(f, args, probe):
  """f(*args) and the gradient of <f(*args), probe> for the float args."""
  n = len(args)
  loss = lambda *a: jnp.sum(f(*a).astype(jnp.float32) * probe)  # noqa: E731
  return jax.jit(f)(*args), jax.jit(jax.grad(loss, argnums=tuple(range(n))))(
      *args)


def _ref64(f, args, probe):
  """Value and gradients of f in float64 (the reference)."""
  with jax.enable_x64(True):
    a64 = [jnp.asarray(_f64(a)) for a in args]
    return _value_and_grads(f, a64, jnp.asarray(_f64(probe)))


def _err(t, r):
  t, r = _f64(t), np.asarray(r, np.float64)
  return np.max(np.abs(t - r)) / np.max(np.abs(r))


def _check_within_golden(kut_out, gold_out, ref_out, factor=3.0,
                         floor=0.0):
  """Each leaf of the KUT within ``factor`` x golden's error to float64."""
  for k, g, r in zip(jax.tree.leaves(kut_out), jax.tree.leaves(gold_out),
                     jax.tree.leaves(ref_out)):
    ek, eg = _err(k, r), _err(g, r)
    assert ek <= factor * eg + floor, (ek, eg)


# ---------------------------------------------------------------- silu


@pytest.mark.parametrize("gated", [False, True], ids=["silu", "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_silu_handler_matches_golden_forward_and_backward(lib, dtype, gated):
  kut = _kut(f"ffi:{lib}:MySilu:MySiluBwd", "silu")
  x = _rand(1, (4, 16, 48), dtype, 2.0)
  args = (x, _rand(2, x.shape, dtype)) if gated else (x,)
  probe = _rand(3, x.shape, jnp.float32)
  got = _value_and_grads(kut, args, probe)
  gold = _value_and_grads(golden_silu, args, probe)
  ref = _ref64(golden_silu, args, probe)
  assert got[0].dtype == jnp.dtype(dtype)
  u = float(jnp.finfo(dtype).eps) / 2
  # Forward: one rounding of a float32 computation; backward: a formula of
  # its own (float32) against JAX's autodiff rounded in x's dtype.
  _check_within_golden(got, gold, ref, factor=3.0, floor=4 * u)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_silu_handler_runs_at_a_swiglu_site_with_its_vjp(lib, dtype):
  """Through peat.substitute at a marked SwiGLU site, backward="kut"."""

  @peat.composite("silu")
  def swiglu(gate, up):
    return golden_silu(gate, up)

  x, up = _rand(4, (2, 8, 32), dtype, 2.0), _rand(5, (2, 8, 32), dtype)
  probe = _rand(6, x.shape, jnp.float32)

  def step(x, up, loss_dtype=jnp.float32):
    loss = lambda x, up: jnp.sum(  # noqa: E731
        swiglu(x, up).astype(loss_dtype) * probe.astype(loss_dtype))
    return jax.value_and_grad(loss, argnums=(0, 1))(x, up)

  kinds = {(s.kernel, s.phase) for s in peat.discover_sites(step, x, up)}
  assert {("silu", "fwd"), ("silu", "bwd")} <= kinds
  spec = kernels.parse_kut(f"ffi:{lib}:MySilu:MySiluBwd", kernel="silu")
  got = jax.jit(peat.substitute(step, *peat.resolve_kut(spec,
                                                        backward="kut")))(
                                                            x, up)
  gold = jax.jit(step)(x, up)
  with jax.enable_x64(True):  # float64 throughout: a float32 loss there
    # made golden's loss the reference's bit for bit (error 0), and the
    # KUT's one-ulp sum differences failed a floor of 2 eps by 2%
    ref = step(jnp.asarray(_f64(x)), jnp.asarray(_f64(up)), jnp.float64)
  _check_within_golden(got, gold, ref, factor=3.0,
                       floor=2 * float(jnp.finfo(dtype).eps))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_a_wrong_silu_handler_is_far_outside_golden(lib, dtype):
  wrong = _kut(f"ffi:{lib}:MySiluSwapped", "silu")
  x, up = _rand(7, (4, 64), dtype, 2.0), _rand(8, (4, 64), dtype)
  r = golden_silu(jnp.asarray(_f64(x)), jnp.asarray(_f64(up)))
  eg = _err(golden_silu(x, up), r)
  ew = _err(wrong(x, up), r)
  assert ew > 0.3 and ew > 50 * eg, (ew, eg)
  # At a plain SiLU site the swap does not exist: exact as the right one.
  right = _kut(f"ffi:{lib}:MySilu", "silu")
  np.testing.assert_array_equal(np.asarray(wrong(x), np.float32),
                                np.asarray(right(x), np.float32))


def test_silu_dtype_errors_are_named(lib):
  x = _rand(9, (3, 8), jnp.float32)
  # The handler binds F32 only: a bf16 site fails at the probe, named.
  f32_only = _kut(f"ffi:{lib}:MySiluF32", "silu")
  np.testing.assert_allclose(np.asarray(f32_only(x)),
                             np.asarray(jax.nn.silu(x)), rtol=1e-6,
                             atol=1e-7)
  sub = jax.jit(peat.substitute(lambda x: _marked_silu(x), *peat.resolve_kut(
      kernels.parse_kut(f"ffi:{lib}:MySiluF32", kernel="silu"))))
  with pytest.raises(peat.PeatError) as err:
    sub(x.astype(jnp.bfloat16))
  text = str(err.value)
  assert "MySiluF32 failed on the operands of a silu call" in text
  assert "bfloat16[24]" in text and "silu FFI calling convention" in text
  # ... and a SwiGLU site (two operands) too.
  with pytest.raises(peat.PeatError, match="MySiluF32 failed"):
    f32_only(x, x)
  # The convention takes one float dtype: x and up of two dtypes are refused
  # before any call, float16 by the handler's own InvalidArgument.
  kut = _kut(f"ffi:{lib}:MySilu", "silu")
  with pytest.raises(peat.PeatError, match="silu FFI convention takes "
                     "operands of one float dtype"):
    kut(x, x.astype(jnp.bfloat16))
  with pytest.raises(peat.PeatError, match="expected float32 or bfloat16"):
    kut(x.astype(jnp.float16))
  with pytest.raises(peat.PeatError, match="x and up of one shape"):
    kut(x, x[:, :4])


@peat.composite("silu")
def _marked_silu(x):
  return jax.nn.silu(x)


# ---------------------------------------------------------------- rope


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_rope_handler_matches_golden_forward_and_backward(lib, dtype):
  kut = _kut(f"ffi:{lib}:MyRope:MyRopeBwd", "rope")
  x = _rand(10, (2, 24, 3, 16), dtype)
  pos = jnp.arange(24, dtype=jnp.int32) + 5
  probe = _rand(11, x.shape, jnp.float32)
  f = lambda fn: lambda x: fn(x, pos, theta=500.0)  # noqa: E731
  got = _value_and_grads(f(kut), (x,), probe)
  gold = _value_and_grads(f(golden_rope), (x,), probe)
  ref = _ref64(f(golden_rope), (x,), probe)
  assert got[0].dtype == jnp.dtype(dtype)
  _check_within_golden(got, gold, ref, factor=3.0,
                       floor=float(jnp.finfo(dtype).eps))


def test_rope_handler_runs_at_a_rope_site_with_its_vjp(lib):

  @peat.composite("rope")
  def rope(x, positions, theta=10000.0):
    return golden_rope(x, positions, theta)

  x = _rand(12, (2, 10, 2, 8), jnp.bfloat16)
  pos = jnp.arange(10, dtype=jnp.int32)

  def step(x):
    return jax.value_and_grad(lambda x: jnp.sum(jnp.sin(
        rope(x, pos, theta=100.0).astype(jnp.float32))))(x)

  spec = kernels.parse_kut(f"ffi:{lib}:MyRope:MyRopeBwd", kernel="rope")
  assert spec.spec.endswith("@rope")
  got = jax.jit(peat.substitute(step, *peat.resolve_kut(spec,
                                                        backward="kut")))(x)
  gold = jax.jit(step)(x)
  with jax.enable_x64(True):
    ref = step(jnp.asarray(_f64(x)))
  _check_within_golden(got, gold, ref, factor=3.0, floor=0.02)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_a_wrong_rope_handler_is_far_outside_golden(lib, dtype):
  wrong = _kut(f"ffi:{lib}:MyRopeInterleaved", "rope")
  x = _rand(13, (2, 16, 2, 8), dtype)
  pos = jnp.arange(16, dtype=jnp.int32)
  r = golden_rope(jnp.asarray(_f64(x)), pos)
  eg, ew = _err(golden_rope(x, pos), r), _err(wrong(x, pos, theta=1e4), r)
  assert ew > 0.3 and ew > 50 * eg, (ew, eg)
  # It is golden's rotation of the halves in GPT-J's places: golden on the
  # de-interleaved features, interleaved back.
  perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])
  back = golden_rope(x[..., perm], pos)[..., np.argsort(perm)]
  assert _err(wrong(x, pos, theta=1e4), _f64(back)) <= 3 * eg + 1e-6


def test_rope_dtype_and_shape_errors_are_named(lib):
  kut = _kut(f"ffi:{lib}:MyRope:MyRopeBwd", "rope")
  x = _rand(14, (1, 6, 2, 4), jnp.float32)
  pos = jnp.arange(6, dtype=jnp.int32)
  with pytest.raises(peat.PeatError, match="integer positions of shape "
                     r"\[length\] = \[6\]; got float32\[6\]"):
    kut(x, pos.astype(jnp.float32))
  with pytest.raises(peat.PeatError, match=r"got int32\[1, 6\]"):
    kut(x, pos[None])
  with pytest.raises(peat.PeatError, match="even head_dim"):
    kut(x[..., :3], pos)
  with pytest.raises(peat.PeatError, match="MyRope failed on the operands "
                     "of a rope call.*float16.*expected float32 or bfloat16"):
    kut(x.astype(jnp.float16), pos)
  # A handler of another convention (silu's) at a rope site.
  with pytest.raises(peat.PeatError, match="MySiluF32 failed on the operands "
                     "of a rope call"):
    _kut(f"ffi:{lib}:MySiluF32", "rope")(x, pos)
  # int64-like positions of another integer type are cast to int32.
  np.testing.assert_allclose(
      np.asarray(kut(x, pos.astype(jnp.int16))),
      np.asarray(golden_rope(x, pos)), rtol=1e-5, atol=1e-6)


# ------------------------------------------- GQA and rms_norm conventions


def test_gqa_attention_through_the_ffi_convention(example_lib):
  """k and v with fewer heads reach the handler repeated to q's heads
  (query head j -> kv head j // (H / Hk)); dk, dv sum over the group."""
  kut = _kut(f"ffi:{example_lib}:MyAttention:MyAttentionBwd", "attention")
  q = _rand(20, (2, 6, 4, 8), jnp.float32)
  k, v = _rand(21, (2, 7, 2, 8), jnp.float32), _rand(22, (2, 7, 2, 8),
                                                      jnp.float32)
  mask = jnp.asarray(np.random.default_rng(23).random((2, 1, 6, 7)) > 0.3)
  mask = mask.at[..., 0].set(True)
  gold = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
      q, k, v, mask=mask)
  probe = _rand(24, q.shape, jnp.float32)
  got = _value_and_grads(lambda q, k, v: kut(q, k, v, mask), (q, k, v), probe)
  want = _value_and_grads(gold, (q, k, v), probe)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5,
                               atol=2e-5)
  with pytest.raises(peat.PeatError, match="4 query heads and 3 key"):
    kut(q, _rand(25, (2, 7, 3, 8), jnp.float32),
        _rand(26, (2, 7, 3, 8), jnp.float32))


def test_rms_norm_scale_is_applied_in_x_dtype(example_lib):
  """A site's scale parameter of another float dtype (a bf16 model's
  float32 parameter) is cast to x's dtype, as nnx.RMSNorm(dtype=x.dtype)
  applies it; here a bf16 scale reaches the float32 handler."""
  kut = _kut(f"ffi:{example_lib}:MyRmsNorm:MyRmsNormBwd", "rms_norm")
  x = _rand(30, (4, 16), jnp.float32)
  scale = _rand(31, (16,), jnp.bfloat16)
  want = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * (
      scale.astype(jnp.float32))
  np.testing.assert_allclose(np.asarray(kut(x, scale, 1e-6)),
                             np.asarray(want), rtol=2e-6, atol=1e-6)
  ds = jax.grad(lambda s: jnp.sum(kut(x, s, 1e-6)))(scale)
  assert ds.dtype == jnp.bfloat16
