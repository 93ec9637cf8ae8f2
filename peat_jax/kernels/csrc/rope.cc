// Rotary position embedding kernels under test (CPU, XLA FFI).
//
//   peat_rope_fwd(x (..., T, H, D), positions int32 (..., T)) -> y
//   peat_rope_bwd(dy (..., T, H, D), positions) -> dx
//
// Rotation of the two halves (GPT-NeoX / Llama-HF layout): h = D / 2,
// inv_freq[i] = theta ** (-2i / D), angle = position * inv_freq[i] (float32),
//   y[..., i]     = x[..., i] * cos - x[..., i + h] * sin
//   y[..., i + h] = x[..., i + h] * cos + x[..., i] * sin
// in float32, rounded once to y's dtype. positions holds P rows of T with P
// dividing the G = prod(...) leading groups of x; group g uses positions row
// g / (G / P) (P = 1: one position vector for the batch; vmap with
// broadcast_all gives positions x's vmapped dims). The backward is the
// inverse rotation (angle -> -angle) with the variant's own layout, base,
// offset and roundings. Attributes: variant (int32), theta (float32).
//
// Variants (llama_body.h):
//   default     float32 tables, inv_freq correctly rounded from double
//   hf          Hugging Face: inv_freq = 1 / base ** (2i / D) in float32,
//               cos and sin rounded to x's dtype, products and sums in x's
//               dtype (q * cos + rotate_half(q) * sin)
//   interleaved GPT-J layout: rotates pairs (2i, 2i + 1) by inv_freq[i]
//   theta_500k  base 500000 whatever theta is given (Llama 3's base)
//   offset      positions + 1

#include <cstdint>
#include <string>
#include <vector>

#include "llama_body.h"
#include "peat_cpu.h"
#include "peat_numerics.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

ffi::Error Fail(const std::string& what) {
  return ffi::Error::InvalidArgument("peat rope: " + what);
}

struct Shape {
  int64_t groups, t, h, d, prows;
};

ffi::Error CheckShapes(const ffi::AnyBuffer& x,
                       const ffi::Buffer<ffi::S32>& positions,
                       const ffi::AnyBuffer& y, int32_t variant, float theta,
                       Shape* s) {
  if (!llama::IsRopeVariant(variant)) {
    return Fail("unknown variant code " + std::to_string(variant));
  }
  if (!(theta > 0.0f) || !std::isfinite(theta)) {
    return Fail("theta must be positive and finite, got " +
                std::to_string(theta));
  }
  auto dx = x.dimensions();
  if (dx.size() < 3) {
    return Fail("expected x (..., T, H, D) of rank >= 3, got " +
                DimsString(dx));
  }
  const int64_t t = dx[dx.size() - 3], h = dx[dx.size() - 2],
                d = dx[dx.size() - 1];
  if (d % 2 != 0) {
    return Fail("head dim D must be even, got x " + DimsString(dx));
  }
  auto dp = positions.dimensions();
  if (dp.size() < 1 || dp.back() != t) {
    return Fail("positions must be (..., T) with T = " + std::to_string(t) +
                ", got " + DimsString(dp) + " for x " + DimsString(dx));
  }
  if (!(y.dimensions() == dx)) {
    return Fail("the result must have x's shape " + DimsString(dx));
  }
  const int64_t per_group = t * h * d;
  const int64_t groups =
      per_group ? static_cast<int64_t>(x.element_count()) / per_group
                : Prod(dx, 0, dx.size() - 3);
  const int64_t prows =
      t ? static_cast<int64_t>(positions.element_count()) / t
        : Prod(dp, 0, dp.size() - 1);
  if (prows < 1 || groups % prows != 0) {
    return Fail("positions rows must divide the leading groups of x, got "
                "positions " + DimsString(dp) + " for x " + DimsString(dx));
  }
  *s = {groups, t, h, d, prows};
  return ffi::Error::Success();
}

ffi::Error Rope(const ffi::AnyBuffer& x, const ffi::Buffer<ffi::S32>& positions,
                ffi::AnyBuffer* y, int32_t variant, float theta, float sign) {
  ScopedIeeeSubnormals ieee;
  Shape s{};
  if (auto e = CheckShapes(x, positions, *y, variant, theta, &s); e.failure()) {
    return e;
  }
  Elem tx, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(y->element_type(), &ty)) {
    return Fail("supported dtypes are float32, bfloat16, float16 (positions "
                "int32)");
  }
  const int64_t half = s.d / 2;
  std::vector<float> inv(half), c(half), sn(half);
  for (int64_t i = 0; i < half; ++i) {
    inv[i] = llama::RopeInvFreq(variant, theta, i, s.d);
  }
  const int32_t* pos = positions.typed_data();
  const int64_t per = s.groups / s.prows;
  const void* in = x.untyped_data();
  void* out = y->untyped_data();
  for (int64_t g = 0; g < s.groups; ++g) {
    for (int64_t t = 0; t < s.t; ++t) {
      const float p = llama::RopePosition(variant, pos[(g / per) * s.t + t]);
      for (int64_t i = 0; i < half; ++i) {
        llama::RopeCosSin(variant, p, inv[i], sign, tx, &c[i], &sn[i]);
      }
      for (int64_t hh = 0; hh < s.h; ++hh) {
        const int64_t base = ((g * s.t + t) * s.h + hh) * s.d;
        for (int64_t i = 0; i < half; ++i) {
          int64_t a, b;
          llama::RopePair(variant, i, s.d, &a, &b);
          float oa, ob;
          llama::RopeRotate(variant, tx, LoadElem(in, base + a, tx),
                            LoadElem(in, base + b, tx), c[i], sn[i], &oa, &ob);
          StoreElem(out, base + a, ty, oa, Rounding::kNearest, false);
          StoreElem(out, base + b, ty, ob, Rounding::kNearest, false);
        }
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error RopeFwdImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> positions,
                       ffi::Result<ffi::AnyBuffer> y, int32_t variant,
                       float theta) {
  return Rope(x, positions, &(*y), variant, theta, 1.0f);
}

ffi::Error RopeBwdImpl(ffi::AnyBuffer dy, ffi::Buffer<ffi::S32> positions,
                       ffi::Result<ffi::AnyBuffer> dx, int32_t variant,
                       float theta) {
  return Rope(dy, positions, &(*dx), variant, theta, -1.0f);
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatRopeFwd);
PEAT_EXPORT_HANDLER(PeatRopeBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatRopeFwd, peat::RopeFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<float>("theta"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatRopeBwd, peat::RopeBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<float>("theta"));
