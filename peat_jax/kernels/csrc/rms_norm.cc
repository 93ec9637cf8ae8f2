// RMS norm kernels under test (CPU, XLA FFI), over the last axis.
//
//   peat_rms_norm_fwd(x (..., D), scale (..., D))
//       -> (y (..., D), mean (rows,) f32, rstd (rows,) f32)
//   peat_rms_norm_bwd(x, scale, mean, rstd, dy) -> (dx (..., D), dscale)
//
// y = x * rsqrt(mean(x^2) + eps) * scale, float32 inside, rounded once to
// y's dtype (the golden flax nnx.RMSNorm computes in float32 and rounds
// once). x and scale may have different dtypes (a bf16 model keeps its
// float32 scale). scale holds S rows of D with S dividing the R rows of x;
// row r of x uses scale row r / (R / S) (vmap with broadcast_all). mean is
// the row mean the layer_norm variant subtracts (0 for the others); rstd is
// 1 / sqrt(mean square + eps). The backward is the exact gradient of the
// variant's own formula, in float32, from the saved mean and rstd; acc_bf16
// accumulates its backward sums in bfloat16 too. Attributes: variant
// (int32), eps (float32).
//
// Variants:
//   default     sequential float32 sum of squares
//   pairwise    pairwise (tree) float32 sum of squares
//   hf          Hugging Face Llama: x * rstd rounded to x's dtype, times the
//               scale rounded to x's dtype, the product in x's dtype
//   acc_bf16    squares and their running sum rounded to bf16 at each add
//   eps         the port's own eps 1e-5 (the eps attribute is ignored)
//   layer_norm  subtracts the row mean first (a LayerNorm without bias)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "llama_body.h"
#include "peat_cpu.h"
#include "peat_numerics.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

using llama::IsRmsNormVariant;

struct Row {
  const float* v;
  PEAT_HD float operator()(int64_t i) const { return v[i]; }
};

struct Product {
  const float* a;
  const float* b;
  PEAT_HD float operator()(int64_t i) const { return a[i] * b[i]; }
};

void Load(const ffi::AnyBuffer& b, Elem t, int64_t off, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) out[i] = LoadElem(b.untyped_data(), off + i, t);
}

void Store(const float* v, int64_t d, ffi::AnyBuffer* b, Elem t, int64_t off) {
  for (int64_t i = 0; i < d; ++i) {
    StoreElem(b->untyped_data(), off + i, t, static_cast<double>(v[i]),
              Rounding::kNearest, false);
  }
}

struct Shape {
  int64_t d, rows, srows;
};

ffi::Error CheckShapes(const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale,
                       Shape* s) {
  auto dx = x.dimensions();
  if (dx.size() < 1 || scale.dimensions().size() < 1) {
    return ffi::Error::InvalidArgument("peat rms_norm: expected rank >= 1");
  }
  const int64_t d = dx.back();
  if (scale.dimensions().back() != d) {
    return ffi::Error::InvalidArgument(
        "peat rms_norm: scale must end in D = " + std::to_string(d) +
        ", got " + DimsString(scale.dimensions()));
  }
  const int64_t rows = d ? static_cast<int64_t>(x.element_count()) / d : 0;
  const int64_t srows = d ? static_cast<int64_t>(scale.element_count()) / d : 1;
  if (srows < 1 || rows % srows != 0) {
    return ffi::Error::InvalidArgument(
        "peat rms_norm: scale rows must divide x rows, got x " +
        DimsString(x.dimensions()) + " and scale " +
        DimsString(scale.dimensions()));
  }
  *s = {d, rows, srows};
  return ffi::Error::Success();
}

ffi::Error VariantError(int32_t variant) {
  return ffi::Error::InvalidArgument("peat rms_norm: unknown variant code " +
                                     std::to_string(variant));
}

ffi::Error DtypeError() {
  return ffi::Error::InvalidArgument(
      "peat rms_norm: supported dtypes are float32, bfloat16, float16 "
      "(mean and rstd float32)");
}

ffi::Error RmsNormFwdImpl(ffi::AnyBuffer x, ffi::AnyBuffer scale,
                          ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::Buffer<ffi::F32>> mean,
                          ffi::Result<ffi::Buffer<ffi::F32>> rstd,
                          int32_t variant, float eps) {
  ScopedIeeeSubnormals ieee;
  if (!IsRmsNormVariant(variant)) return VariantError(variant);
  Shape s{};
  if (auto e = CheckShapes(x, scale, &s); e.failure()) return e;
  Elem tx, ts, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(y->element_type(), &ty)) {
    return DtypeError();
  }
  if (!(y->dimensions() == x.dimensions()) ||
      static_cast<int64_t>(mean->element_count()) != s.rows ||
      static_cast<int64_t>(rstd->element_count()) != s.rows) {
    return ffi::Error::InvalidArgument(
        "peat rms_norm: y must match x and mean/rstd must have one entry "
        "per row");
  }
  std::vector<float> vx(s.d), vs(s.d), out(s.d);
  const int64_t per = s.rows / s.srows;
  float* mean_out = mean->typed_data();
  float* rstd_out = rstd->typed_data();
  for (int64_t r = 0; r < s.rows; ++r) {
    if (r % per == 0) {
      Load(scale, ts, (r / per) * s.d, s.d, vs.data());
      for (int64_t i = 0; i < s.d; ++i) vs[i] = llama::RmsScale(variant, vs[i], tx);
    }
    Load(x, tx, r * s.d, s.d, vx.data());
    float m, rs;
    llama::RmsRowStats(variant, eps, Row{vx.data()}, s.d, &m, &rs);
    for (int64_t i = 0; i < s.d; ++i) {
      out[i] = llama::RmsOut(variant, vx[i], m, rs, vs[i], tx);
    }
    Store(out.data(), s.d, &(*y), ty, r * s.d);
    mean_out[r] = m;
    rstd_out[r] = rs;
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormBwdImpl(ffi::AnyBuffer x, ffi::AnyBuffer scale,
                          ffi::Buffer<ffi::F32> mean,
                          ffi::Buffer<ffi::F32> rstd, ffi::AnyBuffer dy,
                          ffi::Result<ffi::AnyBuffer> dx,
                          ffi::Result<ffi::AnyBuffer> dscale,
                          int32_t variant) {
  ScopedIeeeSubnormals ieee;
  if (!IsRmsNormVariant(variant)) return VariantError(variant);
  Shape s{};
  if (auto e = CheckShapes(x, scale, &s); e.failure()) return e;
  if (!(x.dimensions() == dy.dimensions()) ||
      !(x.dimensions() == dx->dimensions()) ||
      !(scale.dimensions() == dscale->dimensions()) ||
      static_cast<int64_t>(mean.element_count()) != s.rows ||
      static_cast<int64_t>(rstd.element_count()) != s.rows) {
    return ffi::Error::InvalidArgument(
        "peat rms_norm: dy and dx must match x, dscale must match scale and "
        "mean/rstd must have one entry per row");
  }
  Elem tx, ts, tdy, tdx, tds;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(dy.element_type(), &tdy) || !ToElem(dx->element_type(), &tdx) ||
      !ToElem(dscale->element_type(), &tds)) {
    return DtypeError();
  }
  std::vector<float> vx(s.d), vs(s.d), vdy(s.d), xhat(s.d), g(s.d), out(s.d);
  std::vector<float> ds(s.d);
  const int64_t per = s.rows / s.srows;
  const float inv_d = 1.0f / static_cast<float>(s.d);
  for (int64_t r = 0; r < s.rows; ++r) {
    if (r % per == 0) {
      Load(scale, ts, (r / per) * s.d, s.d, vs.data());
      for (int64_t i = 0; i < s.d; ++i) vs[i] = llama::RmsScale(variant, vs[i], tx);
      std::fill(ds.begin(), ds.end(), 0.0f);
    }
    Load(x, tx, r * s.d, s.d, vx.data());
    Load(dy, tdy, r * s.d, s.d, vdy.data());
    const float m = mean.typed_data()[r], rs = rstd.typed_data()[r];
    for (int64_t i = 0; i < s.d; ++i) {
      const llama::RmsGrad t =
          llama::RmsGradTerms(variant, vx[i], vdy[i], vs[i], m, rs, tx);
      xhat[i] = t.xhat;
      g[i] = t.g;
      ds[i] = llama::RmsAddScaleGrad(variant, ds[i], vdy[i], t.n);
    }
    const float mean_gx =
        llama::RowSum(variant, Product{g.data(), xhat.data()}, s.d) * inv_d;
    float mean_g = 0.0f;
    if (variant == kLayerNorm) {
      for (int64_t i = 0; i < s.d; ++i) mean_g += g[i];
      mean_g *= inv_d;
    }
    for (int64_t i = 0; i < s.d; ++i) {
      out[i] = llama::RmsDx(rs, g[i], xhat[i], mean_g, mean_gx);
    }
    Store(out.data(), s.d, &(*dx), tdx, r * s.d);
    if ((r + 1) % per == 0) {
      Store(ds.data(), s.d, &(*dscale), tds, (r / per) * s.d);
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatRmsNormFwd);
PEAT_EXPORT_HANDLER(PeatRmsNormBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatRmsNormFwd, peat::RmsNormFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<int32_t>("variant")
                                  .Attr<float>("eps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatRmsNormBwd, peat::RmsNormBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant"));
