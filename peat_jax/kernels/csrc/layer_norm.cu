// Layer norm kernels under test, CUDA (and HIP through csrc/hip/).
// Same targets, signatures and variants as layer_norm.cc: one thread per row
// for y, mean, rstd and dx; one thread per (scale row, column) for dscale
// and dbias, summed over that scale row's rows in order (deterministic).

#include <cstdint>
#include <string>

#include "peat_gpu.h"

namespace peat {
namespace {

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
};

struct Rows {
  int64_t d, rows, srows;
  __device__ int64_t ScaleRow(int64_t r) const { return r / (rows / srows); }
};

template <typename T>
__device__ T In(const void* b, int64_t i, Elem t, int32_t variant) {
  return PrepareInput(LoadElem(b, i, t), variant);
}

template <typename T>
__global__ void FwdKernel(int32_t variant, float eps, Rows s, const void* x,
                          Elem tx, const void* scale, Elem ts,
                          const void* bias, Elem tb, void* y, Elem ty,
                          float* mean_out, float* rstd_out) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= s.rows) return;
  Arith<T> ar{variant};
  const int64_t off = r * s.d, soff = s.ScaleRow(r) * s.d;
  T mean, var;
  if (variant == kWelford) {
    T m = 0, m2 = 0;
    for (int64_t i = 0; i < s.d; ++i) {
      const T xi = In<T>(x, off + i, tx, variant);
      const T delta = xi - m;
      m += delta / static_cast<T>(i + 1);
      m2 += delta * (xi - m);
    }
    mean = m;
    var = m2 / static_cast<T>(s.d);
  } else if (variant == kNaiveVar) {
    T a = 0, a2 = 0;
    for (int64_t i = 0; i < s.d; ++i) {
      const T xi = In<T>(x, off + i, tx, variant);
      a += xi;
      a2 += xi * xi;
    }
    mean = a / static_cast<T>(s.d);
    const T v = a2 / static_cast<T>(s.d) - mean * mean;
    var = v > 0 ? v : 0;
  } else {
    T a = 0;
    for (int64_t i = 0; i < s.d; ++i) a = ar.Add(a, In<T>(x, off + i, tx, variant));
    mean = a / static_cast<T>(s.d);
    T q = 0;
    for (int64_t i = 0; i < s.d; ++i) {
      const T c = ar.Fl(In<T>(x, off + i, tx, variant) - mean);
      q = ar.Add(q, ar.Fl(c * c));
    }
    var = q / static_cast<T>(s.d);
  }
  const T rstd = T(1) / sqrt(var + static_cast<T>(eps));
  const Rounding mode = variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
  for (int64_t i = 0; i < s.d; ++i) {
    const T xi = In<T>(x, off + i, tx, variant);
    const T v = ar.Fl(ar.Fl(ar.Fl((xi - mean) * rstd) *
                            In<T>(scale, soff + i, ts, variant)) +
                      In<T>(bias, soff + i, tb, variant));
    StoreElem(y, off + i, ty, static_cast<double>(v), mode, variant == kFtz);
  }
  mean_out[r] = static_cast<float>(mean);
  rstd_out[r] = static_cast<float>(rstd);
}

template <typename T>
__global__ void DxKernel(int32_t variant, Rows s, const void* x, Elem tx,
                         const void* scale, Elem ts, const float* mean,
                         const float* rstd, const void* dy, Elem tdy, void* dx,
                         Elem tdx) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= s.rows) return;
  Arith<T> ar{variant};
  const int64_t off = r * s.d, soff = s.ScaleRow(r) * s.d;
  const T m = mean[r], rs = rstd[r];
  T sg = 0, sgx = 0;
  for (int64_t i = 0; i < s.d; ++i) {
    const T xhat = ar.Fl((In<T>(x, off + i, tx, variant) - m) * rs);
    const T g = ar.Fl(In<T>(dy, off + i, tdy, variant) *
                      In<T>(scale, soff + i, ts, variant));
    sg = ar.Add(sg, g);
    sgx = ar.Add(sgx, ar.Fl(g * xhat));
  }
  const T inv_d = T(1) / static_cast<T>(s.d);
  const Rounding mode = variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
  for (int64_t i = 0; i < s.d; ++i) {
    const T xhat = ar.Fl((In<T>(x, off + i, tx, variant) - m) * rs);
    const T g = ar.Fl(In<T>(dy, off + i, tdy, variant) *
                      In<T>(scale, soff + i, ts, variant));
    const T v = ar.Fl(rs * ar.Fl(g - sg * inv_d - xhat * (sgx * inv_d)));
    StoreElem(dx, off + i, tdx, static_cast<double>(v), mode, variant == kFtz);
  }
}

template <typename T>
__global__ void DscaleKernel(int32_t variant, Rows s, const void* x, Elem tx,
                             const float* mean, const float* rstd,
                             const void* dy, Elem tdy, void* dscale, Elem tds,
                             void* dbias, Elem tdb) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= s.srows * s.d) return;
  Arith<T> ar{variant};
  const int64_t i = idx % s.d, sr = idx / s.d, per = s.rows / s.srows;
  T ds = 0, db = 0;
  for (int64_t r = sr * per; r < (sr + 1) * per; ++r) {
    const T xhat = ar.Fl((In<T>(x, r * s.d + i, tx, variant) - T(mean[r])) *
                         T(rstd[r]));
    const T g = In<T>(dy, r * s.d + i, tdy, variant);
    ds = ar.Add(ds, ar.Fl(g * xhat));
    db = ar.Add(db, g);
  }
  const Rounding mode = variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
  StoreElem(dscale, idx, tds, static_cast<double>(ds), mode, variant == kFtz);
  StoreElem(dbias, idx, tdb, static_cast<double>(db), mode, variant == kFtz);
}

bool IsLayerNormVariant(int32_t v) {
  return v == kDefault || v == kWelford || v == kNaiveVar || v == kAccBf16 ||
         v == kInBf16 || v == kRtz || v == kFtz;
}

ffi::Error GetRows(const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale,
                   Rows* s) {
  if (x.dimensions().size() < 1 || scale.dimensions().size() < 1 ||
      scale.dimensions().back() != x.dimensions().back()) {
    return ffi::Error::InvalidArgument("peat layer_norm: bad shapes");
  }
  const int64_t d = x.dimensions().back();
  const int64_t rows = d ? static_cast<int64_t>(x.element_count()) / d : 0;
  const int64_t srows = d ? static_cast<int64_t>(scale.element_count()) / d : 1;
  if (srows < 1 || rows % srows != 0) {
    return ffi::Error::InvalidArgument("peat layer_norm: scale rows must divide x rows");
  }
  *s = {d, rows, srows};
  return ffi::Error::Success();
}

ffi::Error FwdImpl(gpuStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                   ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y,
                   ffi::Result<ffi::Buffer<ffi::F32>> mean,
                   ffi::Result<ffi::Buffer<ffi::F32>> rstd, int32_t variant,
                   float eps) {
  if (!IsLayerNormVariant(variant)) {
    return ffi::Error::InvalidArgument("peat layer_norm: unknown variant");
  }
  Rows s;
  if (auto e = GetRows(x, scale, &s); e.failure()) return e;
  Elem tx, ts, tb, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(bias.element_type(), &tb) || !ToElem(y->element_type(), &ty)) {
    return ffi::Error::InvalidArgument("peat layer_norm: unsupported dtype");
  }
  if (s.rows == 0) return ffi::Error::Success();
  const int threads = 128;
  if (variant == kRtz) {
    FwdKernel<double><<<Blocks(s.rows, threads), threads, 0, stream>>>(
        variant, eps, s, x.untyped_data(), tx, scale.untyped_data(), ts,
        bias.untyped_data(), tb, y->untyped_data(), ty, mean->typed_data(),
        rstd->typed_data());
  } else {
    FwdKernel<float><<<Blocks(s.rows, threads), threads, 0, stream>>>(
        variant, eps, s, x.untyped_data(), tx, scale.untyped_data(), ts,
        bias.untyped_data(), tb, y->untyped_data(), ty, mean->typed_data(),
        rstd->typed_data());
  }
  return LastError("peat layer_norm fwd");
}

template <typename T>
void LaunchBwd(gpuStream_t stream, int32_t variant, const Rows& s,
               const ffi::AnyBuffer& x, Elem tx, const ffi::AnyBuffer& scale,
               Elem ts, const float* mean, const float* rstd,
               const ffi::AnyBuffer& dy, Elem tdy, void* dx, Elem tdx,
               void* dscale, Elem tds, void* dbias, Elem tdb) {
  const int threads = 128;
  DxKernel<T><<<Blocks(s.rows, threads), threads, 0, stream>>>(
      variant, s, x.untyped_data(), tx, scale.untyped_data(), ts, mean, rstd,
      dy.untyped_data(), tdy, dx, tdx);
  DscaleKernel<T><<<Blocks(s.srows * s.d, threads), threads, 0, stream>>>(
      variant, s, x.untyped_data(), tx, mean, rstd, dy.untyped_data(), tdy,
      dscale, tds, dbias, tdb);
}

ffi::Error BwdImpl(gpuStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                   ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> rstd,
                   ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx,
                   ffi::Result<ffi::AnyBuffer> dscale,
                   ffi::Result<ffi::AnyBuffer> dbias, int32_t variant) {
  if (!IsLayerNormVariant(variant)) {
    return ffi::Error::InvalidArgument("peat layer_norm: unknown variant");
  }
  Rows s;
  if (auto e = GetRows(x, scale, &s); e.failure()) return e;
  Elem tx, ts, tdy, tdx, tds, tdb;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(dy.element_type(), &tdy) || !ToElem(dx->element_type(), &tdx) ||
      !ToElem(dscale->element_type(), &tds) ||
      !ToElem(dbias->element_type(), &tdb)) {
    return ffi::Error::InvalidArgument("peat layer_norm: unsupported dtype");
  }
  if (s.rows == 0) return ffi::Error::Success();
  if (variant == kRtz) {
    LaunchBwd<double>(stream, variant, s, x, tx, scale, ts, mean.typed_data(),
                      rstd.typed_data(), dy, tdy, dx->untyped_data(), tdx,
                      dscale->untyped_data(), tds, dbias->untyped_data(), tdb);
  } else {
    LaunchBwd<float>(stream, variant, s, x, tx, scale, ts, mean.typed_data(),
                     rstd.typed_data(), dy, tdy, dx->untyped_data(), tdx,
                     dscale->untyped_data(), tds, dbias->untyped_data(), tdb);
  }
  return LastError("peat layer_norm bwd");
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatLayerNormFwd);
PEAT_EXPORT_HANDLER(PeatLayerNormBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatLayerNormFwd, peat::FwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
        .Attr<int32_t>("variant")
        .Attr<float>("eps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatLayerNormBwd, peat::BwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant"));
