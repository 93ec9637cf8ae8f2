// Softmax kernels under test (CPU, XLA FFI), over the last axis.
//
//   peat_softmax_fwd(x (..., D)) -> y (..., D)
//   peat_softmax_bwd(y (..., D), dy (..., D)) -> dx (..., D)
//
// The backward takes the forward output y (what real kernels save) and
// computes dx = y * (dy - sum(y * dy)). Attributes: variant, tile (int32).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "peat_cpu.h"
#include "peat_numerics.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

bool IsSoftmaxVariant(int32_t v) {
  return v == kDefault || v == kTiled || v == kAccBf16 || v == kInBf16 ||
         v == kRtz || v == kFtz || v == kFastExp || v == kRecip;
}

// Accumulation and flushing as the variant does them, for T = float (or
// double for rtz).
template <typename T>
struct Arith {
  int32_t variant;
  T Add(T s, T v) const {
    if (variant == kAccBf16) return RoundBf16(static_cast<float>(s + v));
    if (variant == kFtz) return FlushF32(static_cast<float>(s + v));
    return s + v;
  }
  T Fl(T v) const {
    return variant == kFtz ? static_cast<T>(FlushF32(static_cast<float>(v))) : v;
  }
  T Exp(T v) const {
    if (variant == kFastExp) return FastExp(static_cast<float>(v));
    return std::exp(v);
  }
};

template <typename T>
void SoftmaxRow(int32_t variant, int64_t tile, const T* x, int64_t d, T* y) {
  Arith<T> ar{variant};
  if (variant == kTiled) {
    // Online softmax: one pass over tiles keeps a running max and a running
    // sum rescaled whenever the max grows (as flash-attention kernels do).
    T m = -INFINITY, s = 0;
    for (int64_t t0 = 0; t0 < d; t0 += tile) {
      const int64_t t1 = std::min(d, t0 + tile);
      T tm = -INFINITY;
      for (int64_t i = t0; i < t1; ++i) tm = std::max(tm, x[i]);
      const T nm = std::max(m, tm);
      T ts = 0;
      for (int64_t i = t0; i < t1; ++i) ts += std::exp(x[i] - nm);
      s = s * std::exp(m - nm) + ts;
      m = nm;
    }
    for (int64_t i = 0; i < d; ++i) y[i] = std::exp(x[i] - m) / s;
    return;
  }
  T m = -INFINITY;
  for (int64_t i = 0; i < d; ++i) m = std::max(m, x[i]);
  for (int64_t i = 0; i < d; ++i) y[i] = ar.Fl(ar.Exp(ar.Fl(x[i] - m)));
  T s = 0;
  if (variant == kAccBf16) {  // a bf16 running sum: in order
    for (int64_t i = 0; i < d; ++i) s = ar.Add(s, y[i]);
  } else {  // ftz: the same order, each add flushed
    s = BlockedReduce<T>([y](int64_t i) { return y[i]; }, 0, d,
                         [&ar](T a, T b) { return ar.Add(a, b); });
  }
  if (variant == kRecip) {
    const T r = T(1) / s;
    for (int64_t i = 0; i < d; ++i) y[i] = y[i] * r;
  } else {
    for (int64_t i = 0; i < d; ++i) y[i] = ar.Fl(y[i] / s);
  }
}

template <typename T>
void SoftmaxBwdRow(int32_t variant, const T* y, const T* dy, int64_t d,
                   T* dx) {
  Arith<T> ar{variant};
  T dot = 0;
  for (int64_t i = 0; i < d; ++i) dot = ar.Add(dot, ar.Fl(y[i] * dy[i]));
  for (int64_t i = 0; i < d; ++i) dx[i] = ar.Fl(y[i] * ar.Fl(dy[i] - dot));
}

Rounding ModeOf(int32_t variant) {
  return variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
}

template <typename T>
void LoadRow(const ffi::AnyBuffer& b, Elem t, int64_t off, int64_t d,
             int32_t variant, T* out) {
  for (int64_t i = 0; i < d; ++i) {
    out[i] = PrepareInput(LoadElem(b.untyped_data(), off + i, t), variant);
  }
}

template <typename T>
void StoreRow(const T* v, int64_t d, int32_t variant, ffi::AnyBuffer* b,
              Elem t, int64_t off) {
  for (int64_t i = 0; i < d; ++i) {
    StoreElem(b->untyped_data(), off + i, t, static_cast<double>(v[i]),
              ModeOf(variant), variant == kFtz);
  }
}

ffi::Error Check(int32_t variant, int32_t tile, const ffi::AnyBuffer& x) {
  if (!IsSoftmaxVariant(variant)) {
    return ffi::Error::InvalidArgument("peat softmax: unknown variant code " +
                                       std::to_string(variant));
  }
  if (tile < 1) {
    return ffi::Error::InvalidArgument("peat softmax: tile must be >= 1");
  }
  if (x.dimensions().size() < 1) {
    return ffi::Error::InvalidArgument("peat softmax: expected rank >= 1");
  }
  return ffi::Error::Success();
}

template <typename T>
void Fwd(int32_t variant, int64_t tile, const ffi::AnyBuffer& x, Elem tx,
         ffi::AnyBuffer* y, Elem ty) {
  const int64_t d = x.dimensions().back();
  const int64_t rows = d ? static_cast<int64_t>(x.element_count()) / d : 0;
  std::vector<T> in(d), out(d);
  for (int64_t r = 0; r < rows; ++r) {
    LoadRow(x, tx, r * d, d, variant, in.data());
    SoftmaxRow(variant, tile, in.data(), d, out.data());
    StoreRow(out.data(), d, variant, y, ty, r * d);
  }
}

template <typename T>
void Bwd(int32_t variant, const ffi::AnyBuffer& y, Elem ty,
         const ffi::AnyBuffer& dy, Elem tdy, ffi::AnyBuffer* dx, Elem tdx) {
  const int64_t d = y.dimensions().back();
  const int64_t rows = d ? static_cast<int64_t>(y.element_count()) / d : 0;
  std::vector<T> vy(d), vdy(d), out(d);
  for (int64_t r = 0; r < rows; ++r) {
    LoadRow(y, ty, r * d, d, variant, vy.data());
    LoadRow(dy, tdy, r * d, d, variant, vdy.data());
    SoftmaxBwdRow(variant, vy.data(), vdy.data(), d, out.data());
    StoreRow(out.data(), d, variant, dx, tdx, r * d);
  }
}

ffi::Error SoftmaxFwdImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                          int32_t variant, int32_t tile) {
  ScopedIeeeSubnormals ieee;
  if (auto e = Check(variant, tile, x); e.failure()) return e;
  Elem tx, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(y->element_type(), &ty)) {
    return ffi::Error::InvalidArgument(
        "peat softmax: supported dtypes are float32, bfloat16, float16");
  }
  if (variant == kRtz) {
    Fwd<double>(variant, tile, x, tx, &(*y), ty);
  } else {
    Fwd<float>(variant, tile, x, tx, &(*y), ty);
  }
  return ffi::Error::Success();
}

ffi::Error SoftmaxBwdImpl(ffi::AnyBuffer y, ffi::AnyBuffer dy,
                          ffi::Result<ffi::AnyBuffer> dx, int32_t variant,
                          int32_t tile) {
  ScopedIeeeSubnormals ieee;
  if (auto e = Check(variant, tile, y); e.failure()) return e;
  if (!(y.dimensions() == dy.dimensions())) {
    return ffi::Error::InvalidArgument(
        "peat softmax: y and dy shapes differ: " + DimsString(y.dimensions()) +
        " vs " + DimsString(dy.dimensions()));
  }
  Elem ty, tdy, tdx;
  if (!ToElem(y.element_type(), &ty) || !ToElem(dy.element_type(), &tdy) ||
      !ToElem(dx->element_type(), &tdx)) {
    return ffi::Error::InvalidArgument(
        "peat softmax: supported dtypes are float32, bfloat16, float16");
  }
  if (variant == kRtz) {
    Bwd<double>(variant, y, ty, dy, tdy, &(*dx), tdx);
  } else {
    Bwd<float>(variant, y, ty, dy, tdy, &(*dx), tdx);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatSoftmaxFwd);
PEAT_EXPORT_HANDLER(PeatSoftmaxBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatSoftmaxFwd, peat::SoftmaxFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<int32_t>("tile"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatSoftmaxBwd, peat::SoftmaxBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<int32_t>("tile"));
