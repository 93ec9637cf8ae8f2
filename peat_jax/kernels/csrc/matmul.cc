// Matmul kernels under test (CPU, XLA FFI): the GEMM core with its variants,
// and the forward and backward handlers.
//
//   peat_matmul_fwd(a (..., M, K), b (..., K, N)) -> c (..., M, N)
//   peat_matmul_bwd(a, b, dc (..., M, N)) -> (da (..., M, K), db (..., K, N))
//
// Attributes: variant (int32, see peat_numerics.h), tile (int32). Leading
// (batch) dimensions of all operands must be equal; the Python side
// broadcasts them (vmap_method="broadcast_all").

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "peat_cpu.h"
#include "peat_numerics.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

constexpr int64_t kMr = 4;    // rows of the register block
constexpr int64_t kNr = 16;   // columns of the register block
constexpr int64_t kKb = 256;  // k block (cache)
constexpr int64_t kNb = 512;  // n block (cache)

// 16 floats as one GCC vector: AVX-512 in the skylake clone, two AVX2 or
// four SSE registers elsewhere. Plain + and * on it round each operation
// (no contraction: -ffp-contract=off).
typedef float V16 __attribute__((vector_size(64)));

// The default kernel: cache-blocked (k by kKb, n by kNb), then 16-column
// strips of B reused from L1 across 4-row blocks of A, with a 4 x 16
// register block. Every C element adds its K products in increasing k order,
// one rounding per multiply and per add, so the result does not depend on
// the blocking or on the SIMD clone. `kFused` selects one fused multiply-add
// per product instead (variant fma).
template <bool kFused>
__attribute__((always_inline)) inline void BlockedImpl(
    int64_t m, int64_t n, int64_t k, const float* __restrict a,
    const float* __restrict b, float* __restrict c) {
  std::fill(c, c + m * n, 0.0f);
  const int64_t mfull = m - m % kMr;
  for (int64_t j0 = 0; j0 < n; j0 += kNb) {
    const int64_t j1 = std::min(n, j0 + kNb);
    for (int64_t k0 = 0; k0 < k; k0 += kKb) {
      const int64_t k1 = std::min(k, k0 + kKb);
      int64_t j = j0;
      for (; j + kNr <= j1; j += kNr) {
        // Pack the (k1 - k0) x 16 strip of B contiguously: rows of B are n
        // floats apart, and a power-of-two n maps them all to a few L1 sets.
        alignas(64) float strip[kKb * kNr];
        for (int64_t kk = k0; kk < k1; ++kk) {
          std::memcpy(strip + (kk - k0) * kNr, b + kk * n + j,
                      kNr * sizeof(float));
        }
        for (int64_t i = 0; i < mfull; i += kMr) {
          if (kFused) {
            float acc[kMr][kNr];
            for (int64_t r = 0; r < kMr; ++r)
              for (int64_t q = 0; q < kNr; ++q) acc[r][q] = c[(i + r) * n + j + q];
            for (int64_t kk = k0; kk < k1; ++kk) {
              const float* bk = strip + (kk - k0) * kNr;
              for (int64_t r = 0; r < kMr; ++r) {
                const float av = a[(i + r) * k + kk];
                for (int64_t q = 0; q < kNr; ++q) {
                  acc[r][q] = __builtin_fmaf(av, bk[q], acc[r][q]);
                }
              }
            }
            for (int64_t r = 0; r < kMr; ++r)
              for (int64_t q = 0; q < kNr; ++q) c[(i + r) * n + j + q] = acc[r][q];
          } else {
            static_assert(kMr == 4 && kNr == 16, "register block is 4 x V16");
            V16 acc[kMr];
            for (int64_t r = 0; r < kMr; ++r) {
              std::memcpy(&acc[r], c + (i + r) * n + j, sizeof(V16));
            }
            for (int64_t kk = k0; kk < k1; ++kk) {
              V16 bv;
              std::memcpy(&bv, strip + (kk - k0) * kNr, sizeof(V16));
              acc[0] += a[(i + 0) * k + kk] * bv;
              acc[1] += a[(i + 1) * k + kk] * bv;
              acc[2] += a[(i + 2) * k + kk] * bv;
              acc[3] += a[(i + 3) * k + kk] * bv;
            }
            for (int64_t r = 0; r < kMr; ++r) {
              std::memcpy(c + (i + r) * n + j, &acc[r], sizeof(V16));
            }
          }
        }
      }
      for (int64_t i = 0; i < mfull; ++i) {  // column remainder (< 16)
        for (int64_t jj = j; jj < j1; ++jj) {
          float s = c[i * n + jj];
          for (int64_t kk = k0; kk < k1; ++kk) {
            const float p = a[i * k + kk];
            s = kFused ? __builtin_fmaf(p, b[kk * n + jj], s)
                       : s + p * b[kk * n + jj];
          }
          c[i * n + jj] = s;
        }
      }
      for (int64_t i = mfull; i < m; ++i) {  // row remainder (< 4)
        for (int64_t kk = k0; kk < k1; ++kk) {
          const float av = a[i * k + kk];
          const float* bk = b + kk * n;
          float* ci = c + i * n;
          for (int64_t jj = j0; jj < j1; ++jj) {
            ci[jj] = kFused ? __builtin_fmaf(av, bk[jj], ci[jj])
                            : ci[jj] + av * bk[jj];
          }
        }
      }
    }
  }
}

__attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
void GemmBlocked(int64_t m, int64_t n, int64_t k, const float* a,
                 const float* b, float* c) {
  BlockedImpl<false>(m, n, k, a, b, c);
}

__attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
void GemmBlockedFma(int64_t m, int64_t n, int64_t k, const float* a,
                    const float* b, float* c) {
  BlockedImpl<true>(m, n, k, a, b, c);
}

// Split-K: each k tile is summed into a fresh partial, and the partials are
// added to C tile by tile (what a kernel with a K-tiled main loop and a
// register partial per tile does). A reordering of the default sum.
void GemmSplitK(int64_t tile, int64_t m, int64_t n, int64_t k, const float* a,
                const float* b, float* c) {
  std::fill(c, c + m * n, 0.0f);
  std::vector<float> part(n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t k0 = 0; k0 < k; k0 += tile) {
      const int64_t k1 = std::min(k, k0 + tile);
      std::fill(part.begin(), part.end(), 0.0f);
      for (int64_t kk = k0; kk < k1; ++kk) {
        const float av = a[i * k + kk];
        for (int64_t j = 0; j < n; ++j) part[j] += av * b[kk * n + j];
      }
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += part[j];
    }
  }
}

// Narrow accumulator: the running sum is rounded to fp16 / bf16 after every
// add (an fp16-accumulate MMA, or a port that keeps its accumulator in the
// input type). Products are formed in float.
template <float (*kRound)(float, Rounding)>
void GemmNarrowAcc(int64_t m, int64_t n, int64_t k, const float* a,
                   const float* b, float* c) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) {
        s = kRound(s + a[i * k + kk] * b[kk * n + j], Rounding::kNearest);
      }
      c[i * n + j] = s;
    }
  }
}

// Double accumulation (stored later with a round-toward-zero conversion).
void GemmDouble(int64_t m, int64_t n, int64_t k, const float* a,
                const float* b, double* c) {
  std::fill(c, c + m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const double av = a[i * k + kk];
      for (int64_t j = 0; j < n; ++j) {
        c[i * n + j] += av * static_cast<double>(b[kk * n + j]);
      }
    }
  }
}

// Flush-to-zero arithmetic: every product and partial sum that is a float
// subnormal becomes zero (inputs were flushed when packed), as on a GPU
// compiled with -ftz=true.
void GemmFtz(int64_t m, int64_t n, int64_t k, const float* a, const float* b,
             float* c) {
  std::fill(c, c + m * n, 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const float av = a[i * k + kk];
      for (int64_t j = 0; j < n; ++j) {
        c[i * n + j] = FlushF32(c[i * n + j] + FlushF32(av * b[kk * n + j]));
      }
    }
  }
}

// N-tiled kernel with a real indexing bug: the edge tile (when N is not a
// multiple of `tile`) computes its loads from `n - rem - 1`, mixing an
// inclusive and an exclusive end, so its columns hold the golden values of
// the column to their left. Full tiles are correct.
void GemmTileEdgeBug(int64_t tile, int64_t m, int64_t n, int64_t k,
                     const float* a, const float* b, float* c) {
  const int64_t rem = n % tile;
  for (int64_t j0 = 0; j0 < n; j0 += tile) {
    const bool edge = rem != 0 && j0 + tile > n;
    const int64_t width = edge ? rem : tile;
    const int64_t load0 = edge ? std::max<int64_t>(n - rem - 1, 0) : j0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t q = 0; q < width; ++q) {
        float s = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk) s += a[i * k + kk] * b[kk * n + load0 + q];
        c[i * n + j0 + q] = s;
      }
    }
  }
}

// Split-K over worker threads: workers take k chunks of size `tile` from a
// shared counter, sum each chunk into a private partial, and add it into C
// under a lock in the order they finish. Thread timing decides the order of
// the float additions, so results differ from run to run (no atomics on
// floats, but the same effect as atomicAdd split-K on a GPU).
void GemmThreaded(int64_t tile, int64_t m, int64_t n, int64_t k,
                  const float* a, const float* b, float* c) {
  std::fill(c, c + m * n, 0.0f);
  const int64_t chunks = (k + tile - 1) / tile;
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(chunks, 8));
  std::atomic<int64_t> next{0}, ready{0};
  std::mutex mu;
  auto work = [&]() {
    std::vector<float> part(m * n);
    // Start together, so the workers race for chunks from the first one.
    ready.fetch_add(1);
    while (ready.load() < workers) std::this_thread::yield();
    for (;;) {
      const int64_t ch = next.fetch_add(1);
      if (ch >= chunks) return;
      const int64_t k0 = ch * tile, k1 = std::min(k, k0 + tile);
      std::fill(part.begin(), part.end(), 0.0f);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t kk = k0; kk < k1; ++kk) {
          const float av = a[i * k + kk];
          for (int64_t j = 0; j < n; ++j) part[i * n + j] += av * b[kk * n + j];
        }
      std::this_thread::yield();
      std::lock_guard<std::mutex> lock(mu);
      for (int64_t i = 0; i < m * n; ++i) c[i] += part[i];
    }
  };
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) pool.emplace_back(work);
  for (auto& t : pool) t.join();
}

}  // namespace

void Gemm(int32_t variant, int64_t tile, int64_t m, int64_t n, int64_t k,
          const float* a, const float* b, float* c32, double* c64) {
  if (m == 0 || n == 0) return;
  switch (variant) {
    case kTiled:
      return GemmSplitK(tile, m, n, k, a, b, c32);
    case kFma:
      return GemmBlockedFma(m, n, k, a, b, c32);
    case kAccFp16:
      return GemmNarrowAcc<RoundFp16>(m, n, k, a, b, c32);
    case kAccBf16:
      return GemmNarrowAcc<RoundBf16>(m, n, k, a, b, c32);
    case kRtz:
      return GemmDouble(m, n, k, a, b, c64);
    case kFtz:
      return GemmFtz(m, n, k, a, b, c32);
    case kTileEdgeBug:
      return GemmTileEdgeBug(tile, m, n, k, a, b, c32);
    case kThreadedNondet:
      return GemmThreaded(tile, m, n, k, a, b, c32);
    default:  // kDefault and the in_* variants (inputs rounded when packed)
      return GemmBlocked(m, n, k, a, b, c32);
  }
}

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
void BatchedProduct(int32_t variant, int64_t tile, int64_t batch,
                    const ffi::AnyBuffer& x, Elem tx, int64_t rows,
                    int64_t inner, bool trans_x, const ffi::AnyBuffer& y,
                    Elem ty, int64_t cols, bool trans_y, ffi::AnyBuffer* out,
                    Elem to) {
  std::vector<float> px(rows * inner), py(inner * cols);
  std::vector<float> c32(variant == kRtz ? 0 : rows * cols);
  std::vector<double> c64(variant == kRtz ? rows * cols : 0);
  for (int64_t bi = 0; bi < batch; ++bi) {
    const int64_t ox = bi * rows * inner, oy = bi * inner * cols;
    // Stored layouts: x is (rows, inner) or, transposed, (inner, rows).
    PackMatrix(x.untyped_data(), tx, ox, rows, inner, trans_x ? 1 : inner,
               trans_x ? rows : 1, variant, px.data());
    PackMatrix(y.untyped_data(), ty, oy, inner, cols, trans_y ? 1 : cols,
               trans_y ? inner : 1, variant, py.data());
    Gemm(variant, tile, rows, cols, inner, px.data(), py.data(), c32.data(),
         c64.data());
    StoreMatrix(variant, c32.data(), c64.data(), rows * cols,
                out->untyped_data(), to, bi * rows * cols);
  }
}

ffi::Error MatmulFwdImpl(ffi::AnyBuffer a, ffi::AnyBuffer b,
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
  BatchedProduct(variant, tile, d.batch, a, ta, d.m, d.k, false, b, tb, d.n,
                 false, &(*c), tc);
  return ffi::Error::Success();
}

ffi::Error MatmulBwdImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer dc,
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
  BatchedProduct(variant, tile, d.batch, dc, tdc, d.m, d.n, false, b, tb, d.k,
                 true, &(*da), tda);
  BatchedProduct(variant, tile, d.batch, a, ta, d.k, d.m, true, dc, tdc, d.n,
                 false, &(*db), tdb);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatMatmulFwd);
PEAT_EXPORT_HANDLER(PeatMatmulBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatMatmulFwd, peat::MatmulFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<int32_t>("tile"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatMatmulBwd, peat::MatmulBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant")
                                  .Attr<int32_t>("tile"));
