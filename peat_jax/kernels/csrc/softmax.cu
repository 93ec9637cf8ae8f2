// Softmax kernels under test, CUDA (and HIP through csrc/hip/softmax.hip).
// Same targets, signatures and variants as softmax.cc; one thread per row.
// fast_exp uses the hardware approximation __expf (what a CUDA port's
// -use_fast_math does) instead of the CPU's cubic.

#include <cstdint>
#include <string>

#include "peat_gpu.h"

namespace peat {
namespace {

__device__ __forceinline__ float DevExp(float x) { return expf(x); }
__device__ __forceinline__ double DevExp(double x) { return exp(x); }

template <typename T>
struct Arith {
  int32_t variant;
  __device__ T Add(T s, T v) const {
    if (variant == kAccBf16) return RoundBf16(static_cast<float>(s + v));
    if (variant == kFtz) return FlushF32(static_cast<float>(s + v));
    return s + v;
  }
  __device__ T Fl(T v) const {
    return variant == kFtz ? static_cast<T>(FlushF32(static_cast<float>(v))) : v;
  }
  __device__ T Exp(T v) const {
    if (variant == kFastExp) return __expf(static_cast<float>(v));
    return DevExp(v);
  }
};

template <typename T>
__global__ void FwdKernel(int32_t variant, int64_t tile, int64_t rows,
                          int64_t d, const void* x, Elem tx, void* y,
                          Elem ty) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  Arith<T> ar{variant};
  const Rounding mode = variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
  auto in = [&](int64_t i) -> T {
    return PrepareInput(LoadElem(x, r * d + i, tx), variant);
  };
  if (variant == kTiled) {  // online softmax over tiles
    T m = -INFINITY, s = 0;
    for (int64_t t0 = 0; t0 < d; t0 += tile) {
      const int64_t t1 = t0 + tile < d ? t0 + tile : d;
      T tm = -INFINITY;
      for (int64_t i = t0; i < t1; ++i) tm = fmax(tm, in(i));
      const T nm = fmax(m, tm);
      T ts = 0;
      for (int64_t i = t0; i < t1; ++i) ts += DevExp(in(i) - nm);
      s = s * DevExp(m - nm) + ts;
      m = nm;
    }
    for (int64_t i = 0; i < d; ++i) {
      StoreElem(y, r * d + i, ty, DevExp(in(i) - m) / s, mode, false);
    }
    return;
  }
  T m = -INFINITY;
  for (int64_t i = 0; i < d; ++i) m = fmax(m, in(i));
  T s = 0;
  for (int64_t i = 0; i < d; ++i) s = ar.Add(s, ar.Fl(ar.Exp(ar.Fl(in(i) - m))));
  const T inv = T(1) / s;
  for (int64_t i = 0; i < d; ++i) {
    const T e = ar.Fl(ar.Exp(ar.Fl(in(i) - m)));
    const T v = variant == kRecip ? e * inv : ar.Fl(e / s);
    StoreElem(y, r * d + i, ty, static_cast<double>(v), mode, variant == kFtz);
  }
}

template <typename T>
__global__ void BwdKernel(int32_t variant, int64_t rows, int64_t d,
                          const void* y, Elem ty, const void* dy, Elem tdy,
                          void* dx, Elem tdx) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  Arith<T> ar{variant};
  const Rounding mode = variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
  T dot = 0;
  for (int64_t i = 0; i < d; ++i) {
    const T yi = PrepareInput(LoadElem(y, r * d + i, ty), variant);
    const T gi = PrepareInput(LoadElem(dy, r * d + i, tdy), variant);
    dot = ar.Add(dot, ar.Fl(yi * gi));
  }
  for (int64_t i = 0; i < d; ++i) {
    const T yi = PrepareInput(LoadElem(y, r * d + i, ty), variant);
    const T gi = PrepareInput(LoadElem(dy, r * d + i, tdy), variant);
    StoreElem(dx, r * d + i, tdx, static_cast<double>(ar.Fl(yi * ar.Fl(gi - dot))),
              mode, variant == kFtz);
  }
}

bool IsSoftmaxVariant(int32_t v) {
  return v == kDefault || v == kTiled || v == kAccBf16 || v == kInBf16 ||
         v == kRtz || v == kFtz || v == kFastExp || v == kRecip;
}

ffi::Error FwdImpl(gpuStream_t stream, ffi::AnyBuffer x,
                   ffi::Result<ffi::AnyBuffer> y, int32_t variant,
                   int32_t tile) {
  Elem tx, ty;
  if (!IsSoftmaxVariant(variant) || tile < 1 || x.dimensions().size() < 1) {
    return ffi::Error::InvalidArgument("peat softmax: bad variant, tile or rank");
  }
  if (!ToElem(x.element_type(), &tx) || !ToElem(y->element_type(), &ty)) {
    return ffi::Error::InvalidArgument("peat softmax: unsupported dtype");
  }
  const int64_t d = x.dimensions().back();
  const int64_t rows = d ? static_cast<int64_t>(x.element_count()) / d : 0;
  if (rows == 0) return ffi::Error::Success();
  const int threads = 128;
  if (variant == kRtz) {
    FwdKernel<double><<<Blocks(rows, threads), threads, 0, stream>>>(
        variant, tile, rows, d, x.untyped_data(), tx, y->untyped_data(), ty);
  } else {
    FwdKernel<float><<<Blocks(rows, threads), threads, 0, stream>>>(
        variant, tile, rows, d, x.untyped_data(), tx, y->untyped_data(), ty);
  }
  return LastError("peat softmax fwd");
}

ffi::Error BwdImpl(gpuStream_t stream, ffi::AnyBuffer y, ffi::AnyBuffer dy,
                   ffi::Result<ffi::AnyBuffer> dx, int32_t variant,
                   int32_t tile) {
  Elem ty, tdy, tdx;
  if (!IsSoftmaxVariant(variant) || tile < 1 || y.dimensions().size() < 1 ||
      !(y.dimensions() == dy.dimensions())) {
    return ffi::Error::InvalidArgument("peat softmax: bad variant or shapes");
  }
  if (!ToElem(y.element_type(), &ty) || !ToElem(dy.element_type(), &tdy) ||
      !ToElem(dx->element_type(), &tdx)) {
    return ffi::Error::InvalidArgument("peat softmax: unsupported dtype");
  }
  const int64_t d = y.dimensions().back();
  const int64_t rows = d ? static_cast<int64_t>(y.element_count()) / d : 0;
  if (rows == 0) return ffi::Error::Success();
  const int threads = 128;
  if (variant == kRtz) {
    BwdKernel<double><<<Blocks(rows, threads), threads, 0, stream>>>(
        variant, rows, d, y.untyped_data(), ty, dy.untyped_data(), tdy,
        dx->untyped_data(), tdx);
  } else {
    BwdKernel<float><<<Blocks(rows, threads), threads, 0, stream>>>(
        variant, rows, d, y.untyped_data(), ty, dy.untyped_data(), tdy,
        dx->untyped_data(), tdx);
  }
  return LastError("peat softmax bwd");
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatSoftmaxFwd);
PEAT_EXPORT_HANDLER(PeatSoftmaxBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatSoftmaxFwd, peat::FwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<int32_t>("tile"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatSoftmaxBwd, peat::BwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<int32_t>("tile"));
