// RMS norm kernels under test, CUDA (and HIP through csrc/hip/rms_norm.hip).
// Same targets, signatures and variants as rms_norm.cc, the same arithmetic
// (llama_body.h): one thread per row for y and dx, one thread per column of
// each scale row for dscale (rows added in order, as on the CPU).

#include <cstdint>
#include <string>

#include "peat_gpu.h"  // first: the HIP runtime defines __forceinline__
#include "llama_body.h"

namespace peat {
namespace {

struct Rows {
  int64_t d, rows, srows;
};

// Element i of a row starting at `off`, as float.
struct RowAt {
  const void* base;
  int64_t off;
  Elem t;
  PEAT_HD float operator()(int64_t i) const { return LoadElem(base, off + i, t); }
};

// The backward's terms of element i of a row.
struct GradAt {
  int32_t variant;
  const void* x;
  const void* dy;
  const void* scale;
  int64_t off, soff;
  Elem tx, tdy, ts;
  float mean, rstd;
  PEAT_HD llama::RmsGrad Terms(int64_t i) const {
    return llama::RmsGradTerms(
        variant, LoadElem(x, off + i, tx), LoadElem(dy, off + i, tdy),
        llama::RmsScale(variant, LoadElem(scale, soff + i, ts), tx), mean,
        rstd, tx);
  }
};

// g_i * xhat_i (the terms of mean(g * xhat)).
struct GradProduct {
  GradAt at;
  PEAT_HD float operator()(int64_t i) const {
    const llama::RmsGrad t = at.Terms(i);
    return t.g * t.xhat;
  }
};

__global__ void FwdKernel(int32_t variant, float eps, Rows s, const void* x,
                          Elem tx, const void* scale, Elem ts, void* y,
                          Elem ty, float* mean, float* rstd) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= s.rows) return;
  const int64_t off = r * s.d, soff = (r / (s.rows / s.srows)) * s.d;
  float m, rs;
  llama::RmsRowStats(variant, eps, RowAt{x, off, tx}, s.d, &m, &rs);
  for (int64_t i = 0; i < s.d; ++i) {
    const float sc = llama::RmsScale(variant, LoadElem(scale, soff + i, ts), tx);
    const float v = llama::RmsOut(variant, LoadElem(x, off + i, tx), m, rs, sc, tx);
    StoreElem(y, off + i, ty, v, Rounding::kNearest, false);
  }
  mean[r] = m;
  rstd[r] = rs;
}

__global__ void DxKernel(int32_t variant, Rows s, const void* x, Elem tx,
                         const void* scale, Elem ts, const float* mean,
                         const float* rstd, const void* dy, Elem tdy,
                         void* dx, Elem tdx) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= s.rows) return;
  const int64_t off = r * s.d, soff = (r / (s.rows / s.srows)) * s.d;
  const GradAt at{variant, x, dy, scale, off, soff, tx, tdy, ts, mean[r], rstd[r]};
  const float inv_d = 1.0f / static_cast<float>(s.d);
  const float mean_gx = llama::RowSum(variant, GradProduct{at}, s.d) * inv_d;
  float mean_g = 0.0f;
  if (variant == kLayerNorm) {
    for (int64_t i = 0; i < s.d; ++i) mean_g += at.Terms(i).g;
    mean_g *= inv_d;
  }
  for (int64_t i = 0; i < s.d; ++i) {
    const llama::RmsGrad t = at.Terms(i);
    StoreElem(dx, off + i, tdx, llama::RmsDx(at.rstd, t.g, t.xhat, mean_g, mean_gx),
              Rounding::kNearest, false);
  }
}

__global__ void DscaleKernel(int32_t variant, Rows s, const void* x, Elem tx,
                             const void* scale, Elem ts, const float* mean,
                             const float* rstd, const void* dy, Elem tdy,
                             void* dscale, Elem tds) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= s.srows * s.d) return;
  const int64_t i = idx % s.d, sr = idx / s.d, per = s.rows / s.srows;
  float ds = 0.0f;
  for (int64_t r = sr * per; r < (sr + 1) * per; ++r) {
    const GradAt at{variant, x, dy, scale, r * s.d, sr * s.d, tx, tdy, ts,
                    mean[r], rstd[r]};
    ds = llama::RmsAddScaleGrad(variant, ds, LoadElem(dy, r * s.d + i, tdy),
                                at.Terms(i).n);
  }
  StoreElem(dscale, idx, tds, ds, Rounding::kNearest, false);
}

ffi::Error GetRows(const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale,
                   Rows* s) {
  if (x.dimensions().size() < 1 || scale.dimensions().size() < 1 ||
      scale.dimensions().back() != x.dimensions().back()) {
    return ffi::Error::InvalidArgument(
        "peat rms_norm: expected x (..., D) and scale (..., D)");
  }
  const int64_t d = x.dimensions().back();
  const int64_t rows = d ? static_cast<int64_t>(x.element_count()) / d : 0;
  const int64_t srows = d ? static_cast<int64_t>(scale.element_count()) / d : 1;
  if (srows < 1 || rows % srows != 0) {
    return ffi::Error::InvalidArgument("peat rms_norm: scale rows must divide x rows");
  }
  *s = {d, rows, srows};
  return ffi::Error::Success();
}

ffi::Error FwdImpl(gpuStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                   ffi::Result<ffi::AnyBuffer> y,
                   ffi::Result<ffi::Buffer<ffi::F32>> mean,
                   ffi::Result<ffi::Buffer<ffi::F32>> rstd, int32_t variant,
                   float eps) {
  if (!llama::IsRmsNormVariant(variant)) {
    return ffi::Error::InvalidArgument("peat rms_norm: unknown variant code " +
                                       std::to_string(variant));
  }
  Rows s{};
  if (auto e = GetRows(x, scale, &s); e.failure()) return e;
  Elem tx, ts, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(y->element_type(), &ty)) {
    return ffi::Error::InvalidArgument("peat rms_norm: unsupported dtype");
  }
  if (!(y->dimensions() == x.dimensions()) ||
      static_cast<int64_t>(mean->element_count()) != s.rows ||
      static_cast<int64_t>(rstd->element_count()) != s.rows) {
    return ffi::Error::InvalidArgument("peat rms_norm: bad result shapes");
  }
  if (s.rows == 0) return ffi::Error::Success();
  const int threads = 128;
  FwdKernel<<<Blocks(s.rows, threads), threads, 0, stream>>>(
      variant, eps, s, x.untyped_data(), tx, scale.untyped_data(), ts,
      y->untyped_data(), ty, mean->typed_data(), rstd->typed_data());
  return LastError("peat rms_norm fwd");
}

ffi::Error BwdImpl(gpuStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                   ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> rstd,
                   ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx,
                   ffi::Result<ffi::AnyBuffer> dscale, int32_t variant) {
  if (!llama::IsRmsNormVariant(variant)) {
    return ffi::Error::InvalidArgument("peat rms_norm: unknown variant code " +
                                       std::to_string(variant));
  }
  Rows s{};
  if (auto e = GetRows(x, scale, &s); e.failure()) return e;
  if (!(x.dimensions() == dy.dimensions()) ||
      !(x.dimensions() == dx->dimensions()) ||
      !(scale.dimensions() == dscale->dimensions()) ||
      static_cast<int64_t>(mean.element_count()) != s.rows ||
      static_cast<int64_t>(rstd.element_count()) != s.rows) {
    return ffi::Error::InvalidArgument("peat rms_norm: bad shapes");
  }
  Elem tx, ts, tdy, tdx, tds;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(dy.element_type(), &tdy) || !ToElem(dx->element_type(), &tdx) ||
      !ToElem(dscale->element_type(), &tds)) {
    return ffi::Error::InvalidArgument("peat rms_norm: unsupported dtype");
  }
  if (s.rows == 0) return ffi::Error::Success();
  const int threads = 128;
  DxKernel<<<Blocks(s.rows, threads), threads, 0, stream>>>(
      variant, s, x.untyped_data(), tx, scale.untyped_data(), ts,
      mean.typed_data(), rstd.typed_data(), dy.untyped_data(), tdy,
      dx->untyped_data(), tdx);
  DscaleKernel<<<Blocks(s.srows * s.d, threads), threads, 0, stream>>>(
      variant, s, x.untyped_data(), tx, scale.untyped_data(), ts,
      mean.typed_data(), rstd.typed_data(), dy.untyped_data(), tdy,
      dscale->untyped_data(), tds);
  return LastError("peat rms_norm bwd");
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatRmsNormFwd);
PEAT_EXPORT_HANDLER(PeatRmsNormBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatRmsNormFwd, peat::FwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
        .Attr<int32_t>("variant")
        .Attr<float>("eps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatRmsNormBwd, peat::BwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant"));
