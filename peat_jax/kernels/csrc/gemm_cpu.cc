// The GEMM core of the CPU kernels under test (matmul.cc and conv2d.cc):
// C (M x N) = A (M x K) * B (K x N), row-major float, with each variant's
// accumulation (see peat_numerics.h for the codes).
//
// Threads: every variant except threaded_nondet cuts C into units that depend
// only on the shapes (tiles of C, or blocks of rows) and computes each unit
// whole on one thread (peat_parallel.h), so results are bitwise identical
// whatever the number of threads or their timing. threaded_nondet keeps its
// own threads: its run-to-run nondeterminism is the error it models.

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
#include "peat_parallel.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

// Vector arguments of the inlined helpers stay within one ISA level.
#pragma GCC diagnostic ignored "-Wpsabi"

// The blocked kernel, once per instruction-set level (see gemm_body.h).
#if defined(__x86_64__) && defined(__GNUC__)
#define PEAT_GEMM_X86 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,fma")
#define PEAT_GEMM_ISA 512
namespace peat {
namespace gemm {
namespace avx512 {
#include "gemm_body.h"
}  // namespace avx512
}  // namespace gemm
}  // namespace peat
#undef PEAT_GEMM_ISA
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define PEAT_GEMM_ISA 2
namespace peat {
namespace gemm {
namespace avx2 {
#include "gemm_body.h"
}  // namespace avx2
}  // namespace gemm
}  // namespace peat
#undef PEAT_GEMM_ISA
#pragma GCC pop_options
#endif
#define PEAT_GEMM_ISA 0
namespace peat {
namespace gemm {
namespace base {
#include "gemm_body.h"
}  // namespace base
}  // namespace gemm
}  // namespace peat
#undef PEAT_GEMM_ISA

namespace peat {
namespace {

using BlockedFn = void (*)(ffi::ThreadPool*, int64_t, int64_t, int64_t,
                           const float*, const float*, float*);

// The blocked kernel for this CPU (chosen once).
template <bool kFused>
BlockedFn PickBlocked() {
#ifdef PEAT_GEMM_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
    return gemm::avx512::Blocked<kFused>;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return gemm::avx2::Blocked<kFused>;
  }
#endif
  return gemm::base::Blocked<kFused>;
}

// Runs fn(i0, i1) over blocks of C's rows, in parallel for large products.
template <typename Fn>
void ForRowBlocks(ffi::ThreadPool* pool, int64_t m, int64_t n, int64_t k,
                  Fn&& fn) {
  constexpr int64_t kRows = 16;
  ParallelFor(pool, (m + kRows - 1) / kRows, WorthSharing(2.0 * m * n * k),
              [&](int64_t u) {
                fn(u * kRows, std::min(m, (u + 1) * kRows));
              });
}

// Split-K: each k tile is summed into a fresh partial, and the partials are
// added to C tile by tile (what a kernel with a K-tiled main loop and a
// register partial per tile does). A reordering of the default sum.
void GemmSplitK(ffi::ThreadPool* pool, int64_t tile, int64_t m, int64_t n,
                int64_t k, const float* a, const float* b, float* c) {
  ForRowBlocks(pool, m, n, k, [&](int64_t i0, int64_t i1) {
    std::vector<float> part(n);
    for (int64_t i = i0; i < i1; ++i) {
      std::fill(c + i * n, c + (i + 1) * n, 0.0f);
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
  });
}

// Narrow accumulator: the running sum is rounded to fp16 / bf16 after every
// add (an fp16-accumulate MMA, or a port that keeps its accumulator in the
// input type). Products are formed in float.
template <float (*kRound)(float, Rounding)>
void GemmNarrowAcc(ffi::ThreadPool* pool, int64_t m, int64_t n, int64_t k,
                   const float* a, const float* b, float* c) {
  ForRowBlocks(pool, m, n, k, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float s = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk) {
          s = kRound(s + a[i * k + kk] * b[kk * n + j], Rounding::kNearest);
        }
        c[i * n + j] = s;
      }
    }
  });
}

// C = A B row by row: every C element starts at 0 and takes its products in
// increasing k order through `add(sum, a_ik, b_kj)`.
template <typename T, typename Add>
void GemmRowsInKOrder(ffi::ThreadPool* pool, int64_t m, int64_t n, int64_t k,
                      const float* a, const float* b, T* c, Add add) {
  ForRowBlocks(pool, m, n, k, [&](int64_t i0, int64_t i1) {
    std::fill(c + i0 * n, c + i1 * n, T(0));
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const float av = a[i * k + kk];
        for (int64_t j = 0; j < n; ++j) {
          c[i * n + j] = add(c[i * n + j], av, b[kk * n + j]);
        }
      }
    }
  });
}

// Double accumulation (stored later with a round-toward-zero conversion).
void GemmDouble(ffi::ThreadPool* pool, int64_t m, int64_t n, int64_t k,
                const float* a, const float* b, double* c) {
  GemmRowsInKOrder(pool, m, n, k, a, b, c, [](double s, float x, float y) {
    return s + static_cast<double>(x) * static_cast<double>(y);
  });
}

// Flush-to-zero arithmetic: every product and partial sum that is a float
// subnormal becomes zero (inputs were flushed when packed), as on a GPU
// compiled with -ftz=true.
void GemmFtz(ffi::ThreadPool* pool, int64_t m, int64_t n, int64_t k,
             const float* a, const float* b, float* c) {
  GemmRowsInKOrder(pool, m, n, k, a, b, c, [](float s, float x, float y) {
    return FlushF32(s + FlushF32(x * y));
  });
}

// N-tiled kernel with a real indexing bug: the edge tile (when N is not a
// multiple of `tile`) computes its loads from `n - rem - 1`, mixing an
// inclusive and an exclusive end, so its columns hold the golden values of
// the column to their left. Full tiles are correct.
void GemmTileEdgeBug(ffi::ThreadPool* pool, int64_t tile, int64_t m,
                     int64_t n, int64_t k, const float* a, const float* b,
                     float* c) {
  const int64_t rem = n % tile;
  ForRowBlocks(pool, m, n, k, [&](int64_t i0, int64_t i1) {
    for (int64_t j0 = 0; j0 < n; j0 += tile) {
      const bool edge = rem != 0 && j0 + tile > n;
      const int64_t width = edge ? rem : tile;
      const int64_t load0 = edge ? std::max<int64_t>(n - rem - 1, 0) : j0;
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t q = 0; q < width; ++q) {
          float s = 0.0f;
          for (int64_t kk = 0; kk < k; ++kk) {
            s += a[i * k + kk] * b[kk * n + load0 + q];
          }
          c[i * n + j0 + q] = s;
        }
      }
    }
  });
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
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) threads.emplace_back(work);
  for (auto& t : threads) t.join();
}

}  // namespace

void Gemm(ffi::ThreadPool* pool, int32_t variant, int64_t tile, int64_t m,
          int64_t n, int64_t k, const float* a, const float* b, float* c32,
          double* c64) {
  if (m == 0 || n == 0) return;
  switch (variant) {
    case kTiled:
      return GemmSplitK(pool, tile, m, n, k, a, b, c32);
    case kFma: {
      static const BlockedFn fused = PickBlocked<true>();
      return fused(pool, m, n, k, a, b, c32);
    }
    case kAccFp16:
      return GemmNarrowAcc<RoundFp16>(pool, m, n, k, a, b, c32);
    case kAccBf16:
      return GemmNarrowAcc<RoundBf16>(pool, m, n, k, a, b, c32);
    case kRtz:
      return GemmDouble(pool, m, n, k, a, b, c64);
    case kFtz:
      return GemmFtz(pool, m, n, k, a, b, c32);
    case kTileEdgeBug:
      return GemmTileEdgeBug(pool, tile, m, n, k, a, b, c32);
    case kThreadedNondet:
      return GemmThreaded(tile, m, n, k, a, b, c32);
    default: {  // kDefault and the in_* variants (inputs rounded when packed)
      static const BlockedFn plain = PickBlocked<false>();
      return plain(pool, m, n, k, a, b, c32);
    }
  }
}

}  // namespace peat
