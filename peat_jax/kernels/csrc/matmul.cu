// Matmul kernels under test, CUDA (and HIP through csrc/hip/matmul.hip).
// Same targets, signatures and variants as matmul.cc:
//   PeatMatmulFwd(a (..., M, K), b (..., K, N)) -> c
//   PeatMatmulBwd(a, b, dc) -> (da, db)
// One thread per output element; threaded_nondet is split-K with atomics.

#include <cstdint>
#include <string>

#include "peat_gpu.h"

namespace peat {
namespace {

struct MatDims {
  int64_t batch, m, k, n;
};

ffi::Error Dims(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, MatDims* d) {
  auto da = a.dimensions(), db = b.dimensions();
  const size_t r = da.size();
  if (r < 2 || db.size() != r || da[r - 1] != db[r - 2]) {
    return ffi::Error::InvalidArgument(
        "peat matmul: expected (..., M, K) and (..., K, N) of equal rank");
  }
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < r; ++i) {
    if (da[i] != db[i]) {
      return ffi::Error::InvalidArgument("peat matmul: batch dims differ");
    }
    batch *= da[i];
  }
  *d = {batch, da[r - 2], da[r - 1], db[r - 1]};
  return ffi::Error::Success();
}

ffi::Error Check(int32_t variant, int32_t tile) {
  if (!IsGemmVariant(variant) || tile < 1) {
    return ffi::Error::InvalidArgument(
        "peat matmul: unknown variant code " + std::to_string(variant) +
        " or tile < 1");
  }
  return ffi::Error::Success();
}

ffi::Error FwdImpl(gpuStream_t stream, ffi::ScratchAllocator scratch,
                   ffi::AnyBuffer a, ffi::AnyBuffer b,
                   ffi::Result<ffi::AnyBuffer> c, int32_t variant,
                   int32_t tile) {
  if (auto e = Check(variant, tile); e.failure()) return e;
  MatDims d;
  if (auto e = Dims(a, b, &d); e.failure()) return e;
  Elem ta, tb, tc;
  if (!ToElem(a.element_type(), &ta) || !ToElem(b.element_type(), &tb) ||
      !ToElem(c->element_type(), &tc)) {
    return ffi::Error::InvalidArgument(
        "peat matmul: supported dtypes are float32, bfloat16, float16");
  }
  Strided sa{a.untyped_data(), ta, d.m * d.k, d.k, 1, variant};
  Strided sb{b.untyped_data(), tb, d.k * d.n, d.n, 1, variant};
  return LaunchGemm(stream, scratch, variant, tile, d.batch, d.m, d.n, d.k, sa,
                    sb, c->untyped_data(), tc);
}

ffi::Error BwdImpl(gpuStream_t stream, ffi::ScratchAllocator scratch,
                   ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer dc,
                   ffi::Result<ffi::AnyBuffer> da,
                   ffi::Result<ffi::AnyBuffer> db, int32_t variant,
                   int32_t tile) {
  if (auto e = Check(variant, tile); e.failure()) return e;
  MatDims d;
  if (auto e = Dims(a, b, &d); e.failure()) return e;
  Elem ta, tb, tdc, tda, tdb;
  if (!ToElem(a.element_type(), &ta) || !ToElem(b.element_type(), &tb) ||
      !ToElem(dc.element_type(), &tdc) || !ToElem(da->element_type(), &tda) ||
      !ToElem(db->element_type(), &tdb)) {
    return ffi::Error::InvalidArgument(
        "peat matmul: supported dtypes are float32, bfloat16, float16");
  }
  // dA (M x K) = dC (M x N) * B^T: B^T(r = n, c = k) is b[k * N + n].
  Strided sdc{dc.untyped_data(), tdc, d.m * d.n, d.n, 1, variant};
  Strided sbt{b.untyped_data(), tb, d.k * d.n, 1, d.n, variant};
  if (auto e = LaunchGemm(stream, scratch, variant, tile, d.batch, d.m, d.k,
                          d.n, sdc, sbt, da->untyped_data(), tda);
      e.failure()) {
    return e;
  }
  // dB (K x N) = A^T (K x M) * dC: A^T(r = k, c = m) is a[m * K + k].
  Strided sat{a.untyped_data(), ta, d.m * d.k, 1, d.k, variant};
  return LaunchGemm(stream, scratch, variant, tile, d.batch, d.k, d.n, d.m,
                    sat, sdc, db->untyped_data(), tdb);
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatMatmulFwd);
PEAT_EXPORT_HANDLER(PeatMatmulBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatMatmulFwd, peat::FwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Ctx<xla::ffi::ScratchAllocator>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<int32_t>("tile"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatMatmulBwd, peat::BwdImpl,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<gpuStream_t>>()
        .Ctx<xla::ffi::ScratchAllocator>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Arg<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Ret<xla::ffi::AnyBuffer>()
        .Attr<int32_t>("variant")
        .Attr<int32_t>("tile"));
