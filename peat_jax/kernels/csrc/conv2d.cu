// 2-D convolution kernels under test, CUDA (and HIP through csrc/hip/).
// Same targets, signatures and variants as conv2d.cc. Implicit GEMM: the
// im2col matrix is never stored; an accessor computes its elements, and the
// generic GEMM kernel of peat_gpu.h runs y = col * W and dW = col^T * dY.
// dX sums, for each input element, the filter taps that read it (the
// transpose of im2col), each tap an O-long dot with the variant's
// accumulation (tile_edge_bug and threaded_nondet act on y and dW only).

#include <cstdint>
#include <string>

#include "peat_gpu.h"

namespace peat {
namespace {

struct Geom {
  int64_t groups, n, h, w, c, kh, kw, o, oh, ow, sh, sw, pt, pl;
  __host__ __device__ int64_t P() const { return n * oh * ow; }
  __host__ __device__ int64_t Kc() const { return kh * kw * c; }
};

// col[bi](p, kk) with p = (n, oy, ox) and kk = (i, j, ci); zero in padding.
struct Im2Col {
  const void* x;
  Elem t;
  Geom g;
  int32_t variant;
  bool transposed;  // col^T: (kk, p)
  __device__ float operator()(int64_t bi, int64_t r, int64_t c) const {
    const int64_t p = transposed ? c : r, kk = transposed ? r : c;
    const int64_t ox = p % g.ow, oy = (p / g.ow) % g.oh, n = p / (g.ow * g.oh);
    const int64_t ci = kk % g.c, j = (kk / g.c) % g.kw, i = kk / (g.c * g.kw);
    const int64_t iy = oy * g.sh + i - g.pt, ix = ox * g.sw + j - g.pl;
    if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return 0.0f;
    const int64_t off = bi * g.n * g.h * g.w * g.c;
    return PrepareInput(LoadElem(x, off + ((n * g.h + iy) * g.w + ix) * g.c + ci, t),
                        variant);
  }
};

template <typename T>
__global__ void DxKernel(int32_t variant, Geom g, const void* dy, Elem tdy,
                         const void* w, Elem tw, void* dx, Elem tdx) {
  const int64_t total = g.groups * g.n * g.h * g.w * g.c;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= total) return;
  const int64_t ci = idx % g.c, ix = (idx / g.c) % g.w,
                iy = (idx / (g.c * g.w)) % g.h,
                n = (idx / (g.c * g.w * g.h)) % g.n,
                bi = idx / (g.c * g.w * g.h * g.n);
  T total_v = 0;
  for (int64_t i = 0; i < g.kh; ++i) {
    const int64_t ty = iy + g.pt - i;
    if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.oh) continue;
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t tx = ix + g.pl - j;
      if (tx < 0 || tx % g.sw != 0 || tx / g.sw >= g.ow) continue;
      const int64_t p = (n * g.oh + ty / g.sh) * g.ow + tx / g.sw;
      const int64_t dyoff = (bi * g.P() + p) * g.o;
      const int64_t woff = bi * g.Kc() * g.o + ((i * g.kw + j) * g.c + ci) * g.o;
      if (variant == kRtz) {
        double s = 0;
        for (int64_t oc = 0; oc < g.o; ++oc) {
          s += static_cast<double>(PrepareInput(LoadElem(dy, dyoff + oc, tdy), variant)) *
               PrepareInput(LoadElem(w, woff + oc, tw), variant);
        }
        total_v += static_cast<T>(s);
      } else {
        float s = 0;
        for (int64_t oc = 0; oc < g.o; ++oc) {
          s = MulAdd(variant, s, PrepareInput(LoadElem(dy, dyoff + oc, tdy), variant),
                     PrepareInput(LoadElem(w, woff + oc, tw), variant));
        }
        total_v += static_cast<T>(s);
      }
    }
  }
  StoreElem(dx, idx, tdx, static_cast<double>(total_v),
            variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest,
            variant == kFtz);
}

ffi::Error GetGeom(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w,
                   const ffi::AnyBuffer& y, int32_t sh, int32_t sw, int32_t pt,
                   int32_t pl, Geom* g) {
  auto dx = x.dimensions(), dw = w.dimensions(), dy = y.dimensions();
  const size_t r = dx.size();
  if (r < 4 || dw.size() != r || dy.size() != r || sh < 1 || sw < 1) {
    return ffi::Error::InvalidArgument("peat conv2d: bad ranks or strides");
  }
  int64_t groups = 1;
  for (size_t i = 0; i + 4 < r; ++i) {
    if (dx[i] != dw[i] || dx[i] != dy[i]) {
      return ffi::Error::InvalidArgument("peat conv2d: leading dims differ");
    }
    groups *= dx[i];
  }
  const size_t b = r - 4;
  *g = {groups, dx[b], dx[b + 1], dx[b + 2], dx[b + 3], dw[b], dw[b + 1],
        dw[b + 3], dy[b + 1], dy[b + 2], sh, sw, pt, pl};
  if (dw[b + 2] != g->c || dy[b] != g->n || dy[b + 3] != g->o) {
    return ffi::Error::InvalidArgument("peat conv2d: inconsistent shapes");
  }
  return ffi::Error::Success();
}

ffi::Error FwdImpl(gpuStream_t stream, ffi::ScratchAllocator scratch,
                   ffi::AnyBuffer x, ffi::AnyBuffer w,
                   ffi::Result<ffi::AnyBuffer> y, int32_t variant, int32_t tile,
                   int32_t stride_h, int32_t stride_w, int32_t pad_top,
                   int32_t pad_left) {
  if (!IsGemmVariant(variant) || tile < 1) {
    return ffi::Error::InvalidArgument("peat conv2d: bad variant or tile");
  }
  Geom g;
  if (auto e = GetGeom(x, w, *y, stride_h, stride_w, pad_top, pad_left, &g);
      e.failure()) {
    return e;
  }
  Elem tx, tw, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(w.element_type(), &tw) ||
      !ToElem(y->element_type(), &ty)) {
    return ffi::Error::InvalidArgument("peat conv2d: unsupported dtype");
  }
  Im2Col col{x.untyped_data(), tx, g, variant, false};
  Strided sw{w.untyped_data(), tw, g.Kc() * g.o, g.o, 1, variant};
  return LaunchGemm(stream, scratch, variant, tile, g.groups, g.P(), g.o,
                    g.Kc(), col, sw, y->untyped_data(), ty);
}

ffi::Error BwdImpl(gpuStream_t stream, ffi::ScratchAllocator scratch,
                   ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer dy,
                   ffi::Result<ffi::AnyBuffer> dx,
                   ffi::Result<ffi::AnyBuffer> dw, int32_t variant,
                   int32_t tile, int32_t stride_h, int32_t stride_w,
                   int32_t pad_top, int32_t pad_left) {
  if (!IsGemmVariant(variant) || tile < 1) {
    return ffi::Error::InvalidArgument("peat conv2d: bad variant or tile");
  }
  Geom g;
  if (auto e = GetGeom(x, w, dy, stride_h, stride_w, pad_top, pad_left, &g);
      e.failure()) {
    return e;
  }
  Elem tx, tw, tdy, tdx, tdw;
  if (!ToElem(x.element_type(), &tx) || !ToElem(w.element_type(), &tw) ||
      !ToElem(dy.element_type(), &tdy) || !ToElem(dx->element_type(), &tdx) ||
      !ToElem(dw->element_type(), &tdw)) {
    return ffi::Error::InvalidArgument("peat conv2d: unsupported dtype");
  }
  // dW (Kc x O) = col^T (Kc x P) * dY (P x O).
  Im2Col colt{x.untyped_data(), tx, g, variant, true};
  Strided sdy{dy.untyped_data(), tdy, g.P() * g.o, g.o, 1, variant};
  if (auto e = LaunchGemm(stream, scratch, variant, tile, g.groups, g.Kc(), g.o,
                          g.P(), colt, sdy, dw->untyped_data(), tdw);
      e.failure()) {
    return e;
  }
  const int threads = 256;
  const int64_t total = g.groups * g.n * g.h * g.w * g.c;
  if (total == 0) return ffi::Error::Success();
  if (variant == kRtz) {
    DxKernel<double><<<Blocks(total, threads), threads, 0, stream>>>(
        variant, g, dy.untyped_data(), tdy, w.untyped_data(), tw,
        dx->untyped_data(), tdx);
  } else {
    DxKernel<float><<<Blocks(total, threads), threads, 0, stream>>>(
        variant, g, dy.untyped_data(), tdy, w.untyped_data(), tw,
        dx->untyped_data(), tdx);
  }
  return LastError("peat conv2d bwd");
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatConv2dFwd);
PEAT_EXPORT_HANDLER(PeatConv2dBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatConv2dFwd, peat::FwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Ctx<xla::ffi::ScratchAllocator>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<int32_t>("tile")
        .Attr<int32_t>("stride_h")
        .Attr<int32_t>("stride_w")
        .Attr<int32_t>("pad_top")
        .Attr<int32_t>("pad_left"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatConv2dBwd, peat::BwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Ctx<xla::ffi::ScratchAllocator>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<int32_t>("tile")
        .Attr<int32_t>("stride_h")
        .Attr<int32_t>("stride_w")
        .Attr<int32_t>("pad_top")
        .Attr<int32_t>("pad_left"));
