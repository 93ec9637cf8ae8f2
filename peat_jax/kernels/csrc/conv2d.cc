// 2-D convolution kernels under test (CPU, XLA FFI), NHWC input, HWIO
// filter, NHWC output, with strides and explicit padding; no dilation or
// feature groups. Lowered as im2col + GEMM (the Caffe / implicit-GEMM
// scheme), so every GEMM variant applies to convolution too.
//
//   peat_conv2d_fwd(x (G.., N, H, W, C), w (G.., KH, KW, C, O))
//       -> y (G.., N, OH, OW, O)
//   peat_conv2d_bwd(x, w, dy) -> (dx, dw)
//
// Attributes: variant, tile, stride_h, stride_w, pad_top, pad_left (int32).
// OH and OW come from the result shape (the Python side computes them from
// the padding). Leading dims G (from vmap broadcast_all) must match.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "peat_cpu.h"
#include "peat_numerics.h"
#include "peat_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

struct ConvGeom {
  int64_t groups, n, h, w, c, kh, kw, o, oh, ow, sh, sw, pt, pl;
  int64_t P() const { return n * oh * ow; }      // GEMM rows
  int64_t Kc() const { return kh * kw * c; }     // GEMM inner size
};

ffi::Error Geometry(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w,
                    const ffi::AnyBuffer& y, int32_t sh, int32_t sw,
                    int32_t pt, int32_t pl, ConvGeom* g) {
  auto dx = x.dimensions(), dw = w.dimensions(), dy = y.dimensions();
  const size_t r = dx.size();
  if (r < 4 || dw.size() != r || dy.size() != r) {
    return ffi::Error::InvalidArgument(
        "peat conv2d: expected x (N, H, W, C), w (KH, KW, C, O), y (N, OH, "
        "OW, O) with equal leading dims, got " + DimsString(dx) + ", " +
        DimsString(dw) + ", " + DimsString(dy));
  }
  for (size_t i = 0; i + 4 < r; ++i) {
    if (dx[i] != dw[i] || dx[i] != dy[i]) {
      return ffi::Error::InvalidArgument("peat conv2d: leading dims differ");
    }
  }
  const size_t b = r - 4;
  *g = {Prod(dx, 0, b), dx[b], dx[b + 1], dx[b + 2], dx[b + 3], dw[b],
        dw[b + 1], dw[b + 3], dy[b + 1], dy[b + 2], sh, sw, pt, pl};
  if (dw[b + 2] != g->c || dy[b] != g->n || dy[b + 3] != g->o || sh < 1 ||
      sw < 1) {
    return ffi::Error::InvalidArgument(
        "peat conv2d: inconsistent shapes " + DimsString(dx) + ", " +
        DimsString(dw) + ", " + DimsString(dy));
  }
  return ffi::Error::Success();
}

// Whether Im2Col / Col2Im share their images among the pool's threads (one
// image per unit; a unit writes its own image's rows only, so the result
// does not depend on the threads).
bool Parallel(const ConvGeom& g) { return g.P() * g.Kc() >= (int64_t{1} << 16); }

// col[p, (i, j, ci)] = x[n, oy*sh + i - pt, ox*sw + j - pl, ci] or 0.
void Im2Col(ffi::ThreadPool* pool, const ConvGeom& g, const void* x, Elem tx,
            int64_t off, int32_t variant, float* col) {
  const int64_t kc = g.Kc();
  ParallelFor(pool, g.n, Parallel(g), [&](int64_t n) {
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        float* row = col + ((n * g.oh + oy) * g.ow + ox) * kc;
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iy = oy * g.sh + i - g.pt, ix = ox * g.sw + j - g.pl;
            float* dst = row + (i * g.kw + j) * g.c;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) {
              std::fill(dst, dst + g.c, 0.0f);
              continue;
            }
            PackMatrix(x, tx, off + ((n * g.h + iy) * g.w + ix) * g.c, 1, g.c,
                       0, 1, variant, dst);
          }
      }
  });
}

// Adds dcol back into dx (accumulated in T): the transpose of Im2Col.
template <typename T>
void Col2Im(ffi::ThreadPool* pool, const ConvGeom& g, const T* dcol, T* dx) {
  const int64_t kc = g.Kc(), image = g.h * g.w * g.c;
  ParallelFor(pool, g.n, Parallel(g), [&](int64_t n) {
    std::fill(dx + n * image, dx + (n + 1) * image, T(0));
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const T* row = dcol + ((n * g.oh + oy) * g.ow + ox) * kc;
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t iy = oy * g.sh + i - g.pt, ix = ox * g.sw + j - g.pl;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
            for (int64_t ci = 0; ci < g.c; ++ci) {
              dx[((n * g.h + iy) * g.w + ix) * g.c + ci] += row[(i * g.kw + j) * g.c + ci];
            }
          }
      }
  });
}

ffi::Error CheckVariant(int32_t variant, int32_t tile) {
  if (!IsGemmVariant(variant) || tile < 1) {
    return ffi::Error::InvalidArgument(
        "peat conv2d: unknown variant code " + std::to_string(variant) +
        " or tile < 1 (" + std::to_string(tile) + ")");
  }
  return ffi::Error::Success();
}

ffi::Error DtypeError() {
  return ffi::Error::InvalidArgument(
      "peat conv2d: supported dtypes are float32, bfloat16, float16");
}

ffi::Error ConvFwdImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                       ffi::Result<ffi::AnyBuffer> y, int32_t variant,
                       int32_t tile, int32_t stride_h, int32_t stride_w,
                       int32_t pad_top, int32_t pad_left) {
  ScopedIeeeSubnormals ieee;
  if (auto e = CheckVariant(variant, tile); e.failure()) return e;
  ConvGeom g;
  if (auto e = Geometry(x, w, *y, stride_h, stride_w, pad_top, pad_left, &g);
      e.failure()) {
    return e;
  }
  Elem tx, tw, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(w.element_type(), &tw) ||
      !ToElem(y->element_type(), &ty)) {
    return DtypeError();
  }
  const int64_t p = g.P(), kc = g.Kc();
  std::vector<float> col(p * kc), pw(kc * g.o);
  std::vector<float> c32(variant == kRtz ? 0 : p * g.o);
  std::vector<double> c64(variant == kRtz ? p * g.o : 0);
  for (int64_t gi = 0; gi < g.groups; ++gi) {
    Im2Col(&pool, g, x.untyped_data(), tx, gi * g.n * g.h * g.w * g.c,
           variant, col.data());
    PackMatrix(w.untyped_data(), tw, gi * kc * g.o, kc, g.o, g.o, 1, variant,
               pw.data());
    Gemm(&pool, variant, tile, p, g.o, kc, col.data(), pw.data(), c32.data(),
         c64.data());
    StoreMatrix(variant, c32.data(), c64.data(), p * g.o, y->untyped_data(),
                ty, gi * p * g.o);
  }
  return ffi::Error::Success();
}

ffi::Error ConvBwdImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer dy,
                       ffi::Result<ffi::AnyBuffer> dx,
                       ffi::Result<ffi::AnyBuffer> dw, int32_t variant,
                       int32_t tile, int32_t stride_h, int32_t stride_w,
                       int32_t pad_top, int32_t pad_left) {
  ScopedIeeeSubnormals ieee;
  if (auto e = CheckVariant(variant, tile); e.failure()) return e;
  ConvGeom g;
  if (auto e = Geometry(x, w, dy, stride_h, stride_w, pad_top, pad_left, &g);
      e.failure()) {
    return e;
  }
  Elem tx, tw, tdy, tdx, tdw;
  if (!ToElem(x.element_type(), &tx) || !ToElem(w.element_type(), &tw) ||
      !ToElem(dy.element_type(), &tdy) || !ToElem(dx->element_type(), &tdx) ||
      !ToElem(dw->element_type(), &tdw)) {
    return DtypeError();
  }
  const bool rtz = variant == kRtz;
  const int64_t p = g.P(), kc = g.Kc(), nx = g.n * g.h * g.w * g.c;
  std::vector<float> col(p * kc), colt(kc * p), pdy(p * g.o), pwt(g.o * kc);
  std::vector<float> dw32(rtz ? 0 : kc * g.o), dcol32(rtz ? 0 : p * kc),
      dx32(rtz ? 0 : nx);
  std::vector<double> dw64(rtz ? kc * g.o : 0), dcol64(rtz ? p * kc : 0),
      dx64(rtz ? nx : 0);
  for (int64_t gi = 0; gi < g.groups; ++gi) {
    Im2Col(&pool, g, x.untyped_data(), tx, gi * nx, variant, col.data());
    PackMatrix(col.data(), Elem::kF32, 0, kc, p, 1, kc, kDefault, colt.data());
    PackMatrix(dy.untyped_data(), tdy, gi * p * g.o, p, g.o, g.o, 1, variant,
               pdy.data());
    // w^T: (O x Kc) from the stored (Kc x O).
    PackMatrix(w.untyped_data(), tw, gi * kc * g.o, g.o, kc, 1, g.o, variant,
               pwt.data());
    // dW (Kc x O) = col^T (Kc x P) * dY (P x O).
    Gemm(&pool, variant, tile, kc, g.o, p, colt.data(), pdy.data(), dw32.data(),
         dw64.data());
    StoreMatrix(variant, dw32.data(), dw64.data(), kc * g.o, dw->untyped_data(),
                tdw, gi * kc * g.o);
    // dcol (P x Kc) = dY (P x O) * W^T (O x Kc), then scattered into dX.
    Gemm(&pool, variant, tile, p, kc, g.o, pdy.data(), pwt.data(), dcol32.data(),
         dcol64.data());
    if (rtz) {
      Col2Im(&pool, g, dcol64.data(), dx64.data());
    } else {
      Col2Im(&pool, g, dcol32.data(), dx32.data());
    }
    StoreMatrix(variant, dx32.data(), dx64.data(), nx, dx->untyped_data(), tdx,
                gi * nx);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatConv2dFwd);
PEAT_EXPORT_HANDLER(PeatConv2dBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatConv2dFwd, peat::ConvFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<int32_t>("tile")
                                  .Attr<int32_t>("stride_h")
                                  .Attr<int32_t>("stride_w")
                                  .Attr<int32_t>("pad_top")
                                  .Attr<int32_t>("pad_left"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatConv2dBwd, peat::ConvBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
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
