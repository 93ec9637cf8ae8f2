// Rotary position embedding kernels under test, CUDA (and HIP through
// csrc/hip/rope.hip). Same targets, signatures and variants as rope.cc, the
// same arithmetic (llama_body.h; cos, sin and pow are the device's): one
// thread per rotated pair (group, token, head, i).

#include <cstdint>
#include <string>

#include "peat_gpu.h"  // first: the HIP runtime defines __forceinline__
#include "llama_body.h"

namespace peat {
namespace {

struct Shape {
  int64_t groups, t, h, d, prows;
};

__global__ void RopeKernel(int32_t variant, float theta, float sign, Shape s,
                           const void* x, Elem tx, const int32_t* positions,
                           void* y, Elem ty) {
  const int64_t half = s.d / 2;
  const int64_t n = s.groups * s.t * s.h * half;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= n) return;
  const int64_t i = idx % half;
  const int64_t row = idx / half;  // (g * T + t) * H + head
  const int64_t t = (row / s.h) % s.t, g = row / (s.h * s.t);
  const int64_t per = s.groups / s.prows;
  const float p = llama::RopePosition(variant, positions[(g / per) * s.t + t]);
  float c, sn;
  llama::RopeCosSin(variant, p, llama::RopeInvFreq(variant, theta, i, s.d),
                    sign, tx, &c, &sn);
  int64_t a, b;
  llama::RopePair(variant, i, s.d, &a, &b);
  const int64_t base = row * s.d;
  float oa, ob;
  llama::RopeRotate(variant, tx, LoadElem(x, base + a, tx),
                    LoadElem(x, base + b, tx), c, sn, &oa, &ob);
  StoreElem(y, base + a, ty, oa, Rounding::kNearest, false);
  StoreElem(y, base + b, ty, ob, Rounding::kNearest, false);
}

ffi::Error Rope(gpuStream_t stream, const ffi::AnyBuffer& x,
                const ffi::Buffer<ffi::S32>& positions, ffi::AnyBuffer* y,
                int32_t variant, float theta, float sign) {
  if (!llama::IsRopeVariant(variant)) {
    return ffi::Error::InvalidArgument("peat rope: unknown variant code " +
                                       std::to_string(variant));
  }
  if (!(theta > 0.0f) || theta == INFINITY) {  // NaN fails theta > 0
    return ffi::Error::InvalidArgument("peat rope: theta must be positive and finite");
  }
  auto dx = x.dimensions();
  // Worded as the CPU handler's (rope.cc): the tests match both.
  if (dx.size() < 3) {
    return ffi::Error::InvalidArgument(
        "peat rope: expected x (..., T, H, D) of rank >= 3, got rank " +
        std::to_string(dx.size()));
  }
  if (dx[dx.size() - 1] % 2 != 0) {
    return ffi::Error::InvalidArgument(
        "peat rope: head dim D must be even, got D = " +
        std::to_string(dx[dx.size() - 1]));
  }
  const int64_t t = dx[dx.size() - 3], h = dx[dx.size() - 2], d = dx[dx.size() - 1];
  auto dp = positions.dimensions();
  if (dp.size() < 1 || dp.back() != t || !(y->dimensions() == dx)) {
    return ffi::Error::InvalidArgument(
        "peat rope: positions must be (..., T) and the result x's shape");
  }
  Elem tx, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(y->element_type(), &ty)) {
    return ffi::Error::InvalidArgument("peat rope: unsupported dtype");
  }
  const int64_t per_group = t * h * d;
  if (per_group == 0 || x.element_count() == 0) return ffi::Error::Success();
  const int64_t groups = static_cast<int64_t>(x.element_count()) / per_group;
  const int64_t prows = static_cast<int64_t>(positions.element_count()) / t;
  if (prows < 1 || groups % prows != 0) {
    return ffi::Error::InvalidArgument(
        "peat rope: positions rows must divide the leading groups of x");
  }
  const Shape s{groups, t, h, d, prows};
  const int64_t n = groups * t * h * (d / 2);
  const int threads = 256;
  RopeKernel<<<Blocks(n, threads), threads, 0, stream>>>(
      variant, theta, sign, s, x.untyped_data(), tx, positions.typed_data(),
      y->untyped_data(), ty);
  return LastError("peat rope");
}

ffi::Error FwdImpl(gpuStream_t stream, ffi::AnyBuffer x,
                   ffi::Buffer<ffi::S32> positions,
                   ffi::Result<ffi::AnyBuffer> y, int32_t variant,
                   float theta) {
  return Rope(stream, x, positions, &(*y), variant, theta, 1.0f);
}

ffi::Error BwdImpl(gpuStream_t stream, ffi::AnyBuffer dy,
                   ffi::Buffer<ffi::S32> positions,
                   ffi::Result<ffi::AnyBuffer> dx, int32_t variant,
                   float theta) {
  return Rope(stream, dy, positions, &(*dx), variant, theta, -1.0f);
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatRopeFwd);
PEAT_EXPORT_HANDLER(PeatRopeBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatRopeFwd, peat::FwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<float>("theta"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatRopeBwd, peat::BwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<float>("theta"));
