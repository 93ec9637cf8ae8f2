// SiLU / SwiGLU kernels under test, CUDA (and HIP through csrc/hip/silu.hip).
// Same targets, signatures and variants as silu.cc, the same arithmetic
// (llama_body.h; exp and tanh are the device's expf / tanhf): one thread per
// element.

#include <cstdint>
#include <string>

#include "peat_gpu.h"  // first: the HIP runtime defines __forceinline__
#include "llama_body.h"

namespace peat {
namespace {

ffi::Error Fail(const std::string& what) {
  return ffi::Error::InvalidArgument("peat silu: " + what);
}

__global__ void FwdKernel(int32_t variant, int64_t n, bool gated,
                          const void* x, Elem tx, const void* up, Elem tu,
                          void* y, Elem ty) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const bool swap = variant == kSwapped && gated;
  const int32_t v = variant == kSwapped ? kDefault : variant;
  const float xv = LoadElem(x, i, tx);
  const float uv = gated ? LoadElem(up, i, tu) : 0.0f;
  const float out = swap ? llama::SiluFwd(v, uv, xv, true)
                         : llama::SiluFwd(v, xv, uv, gated);
  StoreElem(y, i, ty, out, Rounding::kNearest, false);
}

__global__ void BwdKernel(int32_t variant, int64_t n, bool gated,
                          const void* dy, Elem tdy, const void* x, Elem tx,
                          const void* up, Elem tu, void* dx, Elem tdx,
                          void* dup, Elem tdu) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const bool swap = variant == kSwapped && gated;
  const int32_t v = variant == kSwapped ? kDefault : variant;
  const float g = LoadElem(dy, i, tdy);
  const float xv = LoadElem(x, i, tx);
  const float uv = gated ? LoadElem(up, i, tu) : 0.0f;
  float da = 0.0f, db = 0.0f;
  if (swap) {  // y = silu(up) * x: a = up, b = x
    llama::SiluBwd(v, uv, xv, true, g, &da, &db);
    StoreElem(dx, i, tdx, db, Rounding::kNearest, false);
    StoreElem(dup, i, tdu, da, Rounding::kNearest, false);
  } else {
    llama::SiluBwd(v, xv, uv, gated, g, &da, &db);
    StoreElem(dx, i, tdx, da, Rounding::kNearest, false);
    if (gated) StoreElem(dup, i, tdu, db, Rounding::kNearest, false);
  }
}

// The optional `up` operand (0 or 1 remaining argument).
ffi::Error OptionalUp(const ffi::RemainingArgs& rest, const ffi::AnyBuffer& x,
                      bool* gated, const void** up, Elem* tu) {
  if (rest.size() > 1) return Fail("expected x and at most one more operand");
  *gated = rest.size() == 1;
  if (!*gated) return ffi::Error::Success();
  auto b = rest.get<ffi::AnyBuffer>(0);
  if (b.has_error()) return b.error();
  if (!(b->dimensions() == x.dimensions())) return Fail("up must have x's shape");
  if (!ToElem(b->element_type(), tu)) return Fail("unsupported dtype");
  *up = b->untyped_data();
  return ffi::Error::Success();
}

ffi::Error FwdImpl(gpuStream_t stream, ffi::AnyBuffer x,
                   ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> y,
                   int32_t variant) {
  if (!llama::IsSiluVariant(variant)) {
    return Fail("unknown variant code " + std::to_string(variant));
  }
  Elem tx, ty, tu = Elem::kF32;
  if (!ToElem(x.element_type(), &tx) || !ToElem(y->element_type(), &ty)) {
    return Fail("unsupported dtype");
  }
  bool gated;
  const void* up = nullptr;
  if (auto e = OptionalUp(rest, x, &gated, &up, &tu); e.failure()) return e;
  if (!(y->dimensions() == x.dimensions())) return Fail("y must have x's shape");
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (n == 0) return ffi::Error::Success();
  const int threads = 256;
  FwdKernel<<<Blocks(n, threads), threads, 0, stream>>>(
      variant, n, gated, x.untyped_data(), tx, up, tu, y->untyped_data(), ty);
  return LastError("peat silu fwd");
}

ffi::Error BwdImpl(gpuStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                   ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> dx,
                   ffi::RemainingRets rest_out, int32_t variant) {
  if (!llama::IsSiluVariant(variant)) {
    return Fail("unknown variant code " + std::to_string(variant));
  }
  Elem tdy, tx, tdx, tu = Elem::kF32, tdu = Elem::kF32;
  if (!ToElem(dy.element_type(), &tdy) || !ToElem(x.element_type(), &tx) ||
      !ToElem(dx->element_type(), &tdx)) {
    return Fail("unsupported dtype");
  }
  bool gated;
  const void* up = nullptr;
  if (auto e = OptionalUp(rest, x, &gated, &up, &tu); e.failure()) return e;
  if (rest_out.size() != (gated ? 1u : 0u)) {
    return Fail("expected one result per operand (dx, and dup with up)");
  }
  if (!(dy.dimensions() == x.dimensions()) ||
      !(dx->dimensions() == x.dimensions())) {
    return Fail("dy and dx must have x's shape");
  }
  void* dup = nullptr;
  if (gated) {
    auto r = rest_out.get<ffi::AnyBuffer>(0);
    if (r.has_error()) return r.error();
    ffi::Result<ffi::AnyBuffer> res = *r;
    if (!ToElem(res->element_type(), &tdu)) return Fail("unsupported dtype");
    if (!(res->dimensions() == x.dimensions())) return Fail("dup must have x's shape");
    dup = res->untyped_data();
  }
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (n == 0) return ffi::Error::Success();
  const int threads = 256;
  BwdKernel<<<Blocks(n, threads), threads, 0, stream>>>(
      variant, n, gated, dy.untyped_data(), tdy, x.untyped_data(), tx, up, tu,
      dx->untyped_data(), tdx, dup, tdu);
  return LastError("peat silu bwd");
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatSiluFwd);
PEAT_EXPORT_HANDLER(PeatSiluBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatSiluFwd, peat::FwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .RemainingArgs()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatSiluBwd, peat::BwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .RemainingArgs()
        .Ret<xla::ffi::AnyBuffer>()
        .RemainingRets()
        .Attr<int32_t>("variant"));
