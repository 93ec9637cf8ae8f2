// Layer norm kernels under test (CPU, XLA FFI), over the last axis.
//
//   peat_layer_norm_fwd(x (..., D), scale (..., D), bias (..., D))
//       -> (y (..., D), mean (rows,) f32, rstd (rows,) f32)
//   peat_layer_norm_bwd(x, scale, mean, rstd, dy)
//       -> (dx (..., D), dscale (..., D), dbias (..., D))
//
// scale and bias hold S rows of D with S dividing the R rows of x; row r of
// x uses scale row r / (R / S). S = 1 is the usual case; vmap with
// broadcast_all gives scale the leading batch dims of x, which this covers.
// Attributes: variant (int32), eps (float32).

#include <cmath>
#include <cstdint>
#include <vector>

#include "peat_cpu.h"
#include "peat_numerics.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

bool IsLayerNormVariant(int32_t v) {
  return v == kDefault || v == kWelford || v == kNaiveVar || v == kAccBf16 ||
         v == kInBf16 || v == kRtz || v == kFtz;
}

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
};

template <typename T>
void Moments(int32_t variant, const T* x, int64_t d, T* mean, T* var) {
  Arith<T> ar{variant};
  if (variant == kWelford) {
    T m = 0, m2 = 0;
    for (int64_t i = 0; i < d; ++i) {
      const T delta = x[i] - m;
      m += delta / static_cast<T>(i + 1);
      m2 += delta * (x[i] - m);
    }
    *mean = m;
    *var = m2 / static_cast<T>(d);
    return;
  }
  if (variant == kNaiveVar) {
    T s = 0, s2 = 0;
    for (int64_t i = 0; i < d; ++i) {
      s += x[i];
      s2 += x[i] * x[i];
    }
    *mean = s / static_cast<T>(d);
    const T v = s2 / static_cast<T>(d) - *mean * *mean;
    *var = v > 0 ? v : 0;
    return;
  }
  // A bf16 running sum (acc_bf16) adds in order; the others in runs of
  // kSumBlock (ftz: each add and term flushed).
  const bool in_order = variant == kAccBf16;
  const auto add = [&ar](T a, T b) { return ar.Add(a, b); };
  T s = 0;
  if (in_order) {
    for (int64_t i = 0; i < d; ++i) s = ar.Add(s, x[i]);
  } else {
    s = BlockedReduce<T>([x](int64_t i) { return x[i]; }, 0, d, add);
  }
  const T m = s / static_cast<T>(d);
  const auto sq = [x, m, &ar](int64_t i) {
    const T c = ar.Fl(x[i] - m);
    return ar.Fl(c * c);
  };
  T q = 0;
  if (in_order) {
    for (int64_t i = 0; i < d; ++i) q = ar.Add(q, sq(i));
  } else {
    q = BlockedReduce<T>(sq, 0, d, add);
  }
  *mean = m;
  *var = q / static_cast<T>(d);
}

template <typename T>
void Load(const ffi::AnyBuffer& b, Elem t, int64_t off, int64_t d,
          int32_t variant, T* out) {
  for (int64_t i = 0; i < d; ++i) {
    out[i] = PrepareInput(LoadElem(b.untyped_data(), off + i, t), variant);
  }
}

template <typename T>
void Store(const T* v, int64_t d, int32_t variant, ffi::AnyBuffer* b, Elem t,
           int64_t off) {
  const Rounding mode =
      variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
  for (int64_t i = 0; i < d; ++i) {
    StoreElem(b->untyped_data(), off + i, t, static_cast<double>(v[i]), mode,
              variant == kFtz);
  }
}

struct Shape {
  int64_t d, rows, srows;
};

ffi::Error CheckShapes(const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale,
                       const ffi::AnyBuffer& bias, Shape* s) {
  auto dx = x.dimensions();
  if (dx.size() < 1 || scale.dimensions().size() < 1) {
    return ffi::Error::InvalidArgument("peat layer_norm: expected rank >= 1");
  }
  const int64_t d = dx.back();
  if (scale.dimensions().back() != d || !(scale.dimensions() == bias.dimensions())) {
    return ffi::Error::InvalidArgument(
        "peat layer_norm: scale and bias must end in D = " + std::to_string(d) +
        ", got " + DimsString(scale.dimensions()) + " and " +
        DimsString(bias.dimensions()));
  }
  const int64_t rows = d ? static_cast<int64_t>(x.element_count()) / d : 0;
  const int64_t srows = d ? static_cast<int64_t>(scale.element_count()) / d : 1;
  if (srows < 1 || rows % srows != 0) {
    return ffi::Error::InvalidArgument(
        "peat layer_norm: scale rows must divide x rows");
  }
  *s = {d, rows, srows};
  return ffi::Error::Success();
}

template <typename T>
void Fwd(int32_t variant, float eps, const Shape& s, const ffi::AnyBuffer& x,
         const ffi::AnyBuffer& scale, const ffi::AnyBuffer& bias, Elem tx,
         Elem ts, Elem tb, ffi::AnyBuffer* y, Elem ty, float* mean_out,
         float* rstd_out) {
  Arith<T> ar{variant};
  std::vector<T> vx(s.d), vs(s.d), vb(s.d), out(s.d);
  const int64_t per = s.rows / s.srows;
  for (int64_t r = 0; r < s.rows; ++r) {
    if (r % per == 0) {
      Load(scale, ts, (r / per) * s.d, s.d, variant, vs.data());
      Load(bias, tb, (r / per) * s.d, s.d, variant, vb.data());
    }
    Load(x, tx, r * s.d, s.d, variant, vx.data());
    T mean, var;
    Moments(variant, vx.data(), s.d, &mean, &var);
    const T rstd = T(1) / std::sqrt(var + static_cast<T>(eps));
    for (int64_t i = 0; i < s.d; ++i) {
      out[i] = ar.Fl(ar.Fl(ar.Fl((vx[i] - mean) * rstd) * vs[i]) + vb[i]);
    }
    Store(out.data(), s.d, variant, y, ty, r * s.d);
    mean_out[r] = static_cast<float>(mean);
    rstd_out[r] = static_cast<float>(rstd);
  }
}

template <typename T>
void Bwd(int32_t variant, const Shape& s, const ffi::AnyBuffer& x,
         const ffi::AnyBuffer& scale, const float* mean, const float* rstd,
         const ffi::AnyBuffer& dy, Elem tx, Elem ts, Elem tdy,
         ffi::AnyBuffer* dx, ffi::AnyBuffer* dscale, ffi::AnyBuffer* dbias,
         Elem tdx, Elem tds, Elem tdb) {
  Arith<T> ar{variant};
  std::vector<T> vx(s.d), vs(s.d), vdy(s.d), xhat(s.d), g(s.d), out(s.d);
  std::vector<T> ds(s.d), db(s.d);
  const int64_t per = s.rows / s.srows;
  for (int64_t r = 0; r < s.rows; ++r) {
    if (r % per == 0) {
      Load(scale, ts, (r / per) * s.d, s.d, variant, vs.data());
      std::fill(ds.begin(), ds.end(), T(0));
      std::fill(db.begin(), db.end(), T(0));
    }
    Load(x, tx, r * s.d, s.d, variant, vx.data());
    Load(dy, tdy, r * s.d, s.d, variant, vdy.data());
    const T m = mean[r], rs = rstd[r];
    T sg = 0, sgx = 0;
    for (int64_t i = 0; i < s.d; ++i) {
      xhat[i] = ar.Fl((vx[i] - m) * rs);
      g[i] = ar.Fl(vdy[i] * vs[i]);
      sg = ar.Add(sg, g[i]);
      sgx = ar.Add(sgx, ar.Fl(g[i] * xhat[i]));
      ds[i] = ar.Add(ds[i], ar.Fl(vdy[i] * xhat[i]));
      db[i] = ar.Add(db[i], vdy[i]);
    }
    const T inv_d = T(1) / static_cast<T>(s.d);
    for (int64_t i = 0; i < s.d; ++i) {
      out[i] = ar.Fl(rs * ar.Fl(g[i] - sg * inv_d - xhat[i] * (sgx * inv_d)));
    }
    Store(out.data(), s.d, variant, dx, tdx, r * s.d);
    if ((r + 1) % per == 0) {
      Store(ds.data(), s.d, variant, dscale, tds, (r / per) * s.d);
      Store(db.data(), s.d, variant, dbias, tdb, (r / per) * s.d);
    }
  }
}

ffi::Error DtypeError() {
  return ffi::Error::InvalidArgument(
      "peat layer_norm: supported dtypes are float32, bfloat16, float16 "
      "(mean and rstd float32)");
}

ffi::Error LayerNormFwdImpl(ffi::AnyBuffer x, ffi::AnyBuffer scale,
                            ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y,
                            ffi::Result<ffi::Buffer<ffi::F32>> mean,
                            ffi::Result<ffi::Buffer<ffi::F32>> rstd,
                            int32_t variant, float eps) {
  ScopedIeeeSubnormals ieee;
  if (!IsLayerNormVariant(variant)) {
    return ffi::Error::InvalidArgument("peat layer_norm: unknown variant code " +
                                       std::to_string(variant));
  }
  Shape s;
  if (auto e = CheckShapes(x, scale, bias, &s); e.failure()) return e;
  Elem tx, ts, tb, ty;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(bias.element_type(), &tb) || !ToElem(y->element_type(), &ty)) {
    return DtypeError();
  }
  if (static_cast<int64_t>(mean->element_count()) != s.rows) {
    return ffi::Error::InvalidArgument("peat layer_norm: mean must have one "
                                       "entry per row");
  }
  if (variant == kRtz) {
    Fwd<double>(variant, eps, s, x, scale, bias, tx, ts, tb, &(*y), ty,
                mean->typed_data(), rstd->typed_data());
  } else {
    Fwd<float>(variant, eps, s, x, scale, bias, tx, ts, tb, &(*y), ty,
               mean->typed_data(), rstd->typed_data());
  }
  return ffi::Error::Success();
}

ffi::Error LayerNormBwdImpl(ffi::AnyBuffer x, ffi::AnyBuffer scale,
                            ffi::Buffer<ffi::F32> mean,
                            ffi::Buffer<ffi::F32> rstd, ffi::AnyBuffer dy,
                            ffi::Result<ffi::AnyBuffer> dx,
                            ffi::Result<ffi::AnyBuffer> dscale,
                            ffi::Result<ffi::AnyBuffer> dbias,
                            int32_t variant) {
  ScopedIeeeSubnormals ieee;
  if (!IsLayerNormVariant(variant)) {
    return ffi::Error::InvalidArgument("peat layer_norm: unknown variant code " +
                                       std::to_string(variant));
  }
  Shape s;
  if (auto e = CheckShapes(x, scale, scale, &s); e.failure()) return e;
  if (!(x.dimensions() == dy.dimensions()) ||
      static_cast<int64_t>(mean.element_count()) != s.rows ||
      static_cast<int64_t>(rstd.element_count()) != s.rows) {
    return ffi::Error::InvalidArgument(
        "peat layer_norm: dy must match x and mean/rstd must have one entry "
        "per row");
  }
  Elem tx, ts, tdy, tdx, tds, tdb;
  if (!ToElem(x.element_type(), &tx) || !ToElem(scale.element_type(), &ts) ||
      !ToElem(dy.element_type(), &tdy) || !ToElem(dx->element_type(), &tdx) ||
      !ToElem(dscale->element_type(), &tds) ||
      !ToElem(dbias->element_type(), &tdb)) {
    return DtypeError();
  }
  if (variant == kRtz) {
    Bwd<double>(variant, s, x, scale, mean.typed_data(), rstd.typed_data(), dy,
                tx, ts, tdy, &(*dx), &(*dscale), &(*dbias), tdx, tds, tdb);
  } else {
    Bwd<float>(variant, s, x, scale, mean.typed_data(), rstd.typed_data(), dy,
               tx, ts, tdy, &(*dx), &(*dscale), &(*dbias), tdx, tds, tdb);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatLayerNormFwd);
PEAT_EXPORT_HANDLER(PeatLayerNormBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatLayerNormFwd, peat::LayerNormFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<int32_t>("variant")
                                  .Attr<float>("eps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatLayerNormBwd, peat::LayerNormBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant"));
