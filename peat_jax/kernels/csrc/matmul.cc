// Matmul kernels under test (CPU, XLA FFI): the forward and backward
// handlers around the GEMM core (gemm_cpu.cc).
//
//   peat_matmul_fwd(a (..., M, K), b (..., K, N)) -> c (..., M, N)
//   peat_matmul_bwd(a, b, dc (..., M, N)) -> (da (..., M, K), db (..., K, N))
//
// Attributes: variant (int32, see peat_numerics.h), tile (int32). Leading
// (batch) dimensions of all operands must be equal; the Python side
// broadcasts them (vmap_method="broadcast_all").

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "peat_cpu.h"
#include "peat_numerics.h"
#include "peat_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

ffi::Error CheckCommon(int32_t variant, int32_t tile) {
  if (!IsGemmVariant(variant)) {
    return ffi::Error::InvalidArgument("peat matmul: unknown variant code " +
                                       std::to_string(variant));
  }
  if (tile < 1) {
    return ffi::Error::InvalidArgument("peat matmul: tile must be >= 1, got " +
                                       std::to_string(tile));
  }
  return ffi::Error::Success();
}

struct MatDims {
  int64_t batch, m, k, n;
};

// Validates a (..., M, K) x (..., K, N) pair.
ffi::Error MatmulDims(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                      MatDims* d) {
  auto da = a.dimensions(), db = b.dimensions();
  if (da.size() < 2 || da.size() != db.size()) {
    return ffi::Error::InvalidArgument(
        "peat matmul: expected operands (..., M, K) and (..., K, N) of equal "
        "rank >= 2, got " + DimsString(da) + " and " + DimsString(db));
  }
  const size_t r = da.size();
  for (size_t i = 0; i + 2 < r; ++i) {
    if (da[i] != db[i]) {
      return ffi::Error::InvalidArgument(
          "peat matmul: batch dimensions differ: " + DimsString(da) + " vs " +
          DimsString(db));
    }
  }
  if (da[r - 1] != db[r - 2]) {
    return ffi::Error::InvalidArgument(
        "peat matmul: contracting dimensions differ: " + DimsString(da) +
        " vs " + DimsString(db));
  }
  *d = {Prod(da, 0, r - 2), da[r - 2], da[r - 1], db[r - 1]};
  return ffi::Error::Success();
}

// One batched product: out[b] = op(x[b]) * op(y[b]) where op transposes an
// operand when its strides say so; x is (rows x inner), y is (inner x cols).
// A product too small to share among threads by itself (WorthSharing, the
// GEMM core's rule) is computed whole by one thread, and the batch is
// shared instead (the attention products of a small transformer: 64
// products of 64 x 32 x 64). Either way every output element comes from the
// same single-threaded arithmetic, so the result does not depend on it.
void BatchedProduct(ffi::ThreadPool* pool, int32_t variant, int64_t tile,
                    int64_t batch, const ffi::AnyBuffer& x, Elem tx,
                    int64_t rows, int64_t inner, bool trans_x,
                    const ffi::AnyBuffer& y, Elem ty, int64_t cols,
                    bool trans_y, ffi::AnyBuffer* out, Elem to) {
  const double flops = 2.0 * rows * cols * inner;
  // threaded_nondet starts its own threads for every product.
  const bool share_batch = variant != kThreadedNondet && batch > 1 &&
                           !WorthSharing(flops) && WorthSharing(batch * flops);
  // Units: contiguous runs of batch items, at most 64, so that the scratch
  // buffers are allocated once per unit.
  const int64_t units = share_batch ? std::min<int64_t>(batch, 64) : 1;
  ParallelFor(pool, units, share_batch, [&](int64_t u) {
    const int64_t b0 = batch * u / units, b1 = batch * (u + 1) / units;
    ffi::ThreadPool* inner_pool = share_batch ? nullptr : pool;
    std::vector<float> px(rows * inner), py(inner * cols);
    std::vector<float> c32(variant == kRtz ? 0 : rows * cols);
    std::vector<double> c64(variant == kRtz ? rows * cols : 0);
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t ox = bi * rows * inner, oy = bi * inner * cols;
      // Stored layouts: x is (rows, inner) or, transposed, (inner, rows).
      PackMatrix(x.untyped_data(), tx, ox, rows, inner, trans_x ? 1 : inner,
                 trans_x ? rows : 1, variant, px.data());
      PackMatrix(y.untyped_data(), ty, oy, inner, cols, trans_y ? 1 : cols,
                 trans_y ? inner : 1, variant, py.data());
      Gemm(inner_pool, variant, tile, rows, cols, inner, px.data(), py.data(),
           c32.data(), c64.data());
      StoreMatrix(variant, c32.data(), c64.data(), rows * cols,
                  out->untyped_data(), to, bi * rows * cols);
    }
  });
}

ffi::Error MatmulFwdImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b,
                         ffi::Result<ffi::AnyBuffer> c, int32_t variant,
                         int32_t tile) {
  ScopedIeeeSubnormals ieee;
  if (auto e = CheckCommon(variant, tile); e.failure()) return e;
  MatDims d;
  if (auto e = MatmulDims(a, b, &d); e.failure()) return e;
  Elem ta, tb, tc;
  if (!ToElem(a.element_type(), &ta) || !ToElem(b.element_type(), &tb) ||
      !ToElem(c->element_type(), &tc)) {
    return ffi::Error::InvalidArgument(
        "peat matmul: supported dtypes are float32, bfloat16, float16");
  }
  BatchedProduct(&pool, variant, tile, d.batch, a, ta, d.m, d.k, false, b, tb, d.n,
                 false, &(*c), tc);
  return ffi::Error::Success();
}

ffi::Error MatmulBwdImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer dc,
                         ffi::Result<ffi::AnyBuffer> da,
                         ffi::Result<ffi::AnyBuffer> db, int32_t variant,
                         int32_t tile) {
  ScopedIeeeSubnormals ieee;
  if (auto e = CheckCommon(variant, tile); e.failure()) return e;
  MatDims d;
  if (auto e = MatmulDims(a, b, &d); e.failure()) return e;
  Elem ta, tb, tdc, tda, tdb;
  if (!ToElem(a.element_type(), &ta) || !ToElem(b.element_type(), &tb) ||
      !ToElem(dc.element_type(), &tdc) || !ToElem(da->element_type(), &tda) ||
      !ToElem(db->element_type(), &tdb)) {
    return ffi::Error::InvalidArgument(
        "peat matmul: supported dtypes are float32, bfloat16, float16");
  }
  // dA (M x K) = dC (M x N) * B^T (N x K); dB (K x N) = A^T (K x M) * dC.
  BatchedProduct(&pool, variant, tile, d.batch, dc, tdc, d.m, d.n, false, b, tb, d.k,
                 true, &(*da), tda);
  BatchedProduct(&pool, variant, tile, d.batch, a, ta, d.k, d.m, true, dc, tdc, d.n,
                 false, &(*db), tdb);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatMatmulFwd);
PEAT_EXPORT_HANDLER(PeatMatmulBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatMatmulFwd, peat::MatmulFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<int32_t>("tile"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatMatmulBwd, peat::MatmulBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<int32_t>("tile"));
