// The blocked GEMM of the default, fma and in_* variants, once per
// instruction-set level: gemm_cpu.cc includes this file three times, inside
// `#pragma GCC target` regions, with PEAT_GEMM_ISA = 512 (AVX-512), 2 (AVX2
// + FMA) or 0 (the x86-64 / generic baseline), each in its own namespace.
//
// Scheme (Goto / BLIS): C is cut into tiles of at most kMc x kNc elements
// (the parallel units); for each tile, k is walked in blocks of kKc; the
// block's rows of A are packed into kMr-row micro-panels and its columns of
// B into kNr-column micro-panels (zero padded), and a kMr x kNr register
// block of C accumulates one micro-panel pair. Every C element still adds
// its K products in increasing k order, starting from +0, with one rounding
// per multiply and per add (or one per fused multiply-add): the result does
// not depend on the blocking, the tile sizes, the ISA level or the threads.

#ifndef PEAT_GEMM_ISA
#error "define PEAT_GEMM_ISA before including gemm_body.h"
#endif

#if PEAT_GEMM_ISA == 512
constexpr int kLanes = 16;
#elif PEAT_GEMM_ISA == 2
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif

typedef float V __attribute__((vector_size(kLanes * sizeof(float))));

// Every lane = s.
__attribute__((always_inline)) inline V Broadcast(float s) {
#if PEAT_GEMM_ISA == 512
  return reinterpret_cast<V>(_mm512_set1_ps(s));
#elif PEAT_GEMM_ISA == 2
  return reinterpret_cast<V>(_mm256_set1_ps(s));
#else
  V r;
  for (int q = 0; q < kLanes; ++q) r[q] = s;
  return r;
#endif
}

// One fused multiply-add per lane: a * b + c with a single rounding.
__attribute__((always_inline)) inline V Fma(V a, V b, V c) {
#if PEAT_GEMM_ISA == 512
  return reinterpret_cast<V>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                             reinterpret_cast<__m512>(b),
                                             reinterpret_cast<__m512>(c)));
#elif PEAT_GEMM_ISA == 2
  return reinterpret_cast<V>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a),
                                             reinterpret_cast<__m256>(b),
                                             reinterpret_cast<__m256>(c)));
#else
  V r;
  for (int q = 0; q < kLanes; ++q) r[q] = __builtin_fmaf(a[q], b[q], c[q]);
  return r;
#endif
}

constexpr int64_t kKc = 128;  // k block: a B micro-panel stays in L1
constexpr int64_t kMc = 120;  // rows of a tile (a multiple of every kMr)

// Register blocks (kMr rows x kNv vectors): "wide" for most shapes, "narrow"
// when C has few columns (less zero padding). Accumulators + B vectors + one
// broadcast fit the ISA's vector registers (32 zmm, 16 ymm, 16 xmm).
#if PEAT_GEMM_ISA == 512
constexpr int kWideMr = 6, kWideNv = 4, kNarrowMr = 12, kNarrowNv = 2;
#else  // 16 ymm / xmm registers
constexpr int kWideMr = 4, kWideNv = 3, kNarrowMr = 6, kNarrowNv = 2;
#endif
static_assert(kMc % kWideMr == 0 && kMc % kNarrowMr == 0, "kMc");

// Columns of a tile: a whole number of micro-panels, about 256.
constexpr int64_t TileCols(int64_t nr) { return nr * std::max<int64_t>(1, 256 / nr); }

// Per-thread packing buffers (pool threads live as long as the process).
inline float* Scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(floats);
  return buf.data();
}

// C[i0:i1, j0:j1] = A[i0:i1, :] * B[:, j0:j1] (row-major, leading
// dimensions k, n, n).
template <bool kFused, int kMr, int kNv>
void Tile(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t n,
          int64_t k, const float* __restrict a, const float* __restrict b,
          float* __restrict c) {
  constexpr int64_t kNr = kNv * kLanes;
  const int64_t np = (j1 - j0 + kNr - 1) / kNr;  // B micro-panels
  const int64_t mp = (i1 - i0 + kMr - 1) / kMr;  // A micro-panels
  float* bp = Scratch(kKc * kNr * np + kKc * kMr * mp);
  float* ap = bp + kKc * kNr * np;
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    for (int64_t p = 0; p < np; ++p) {
      const int64_t jj = j0 + p * kNr, w = std::min(kNr, j1 - jj);
      float* dst = bp + p * kKc * kNr;
      for (int64_t kk = 0; kk < kc; ++kk) {
        std::memcpy(dst + kk * kNr, b + (k0 + kk) * n + jj, w * sizeof(float));
        std::fill(dst + kk * kNr + w, dst + (kk + 1) * kNr, 0.0f);
      }
    }
    for (int64_t p = 0; p < mp; ++p) {
      const int64_t ii = i0 + p * kMr, h = std::min<int64_t>(kMr, i1 - ii);
      float* dst = ap + p * kKc * kMr;
      for (int64_t r = 0; r < kMr; ++r) {
        const float* src = a + (ii + r) * k + k0;
        for (int64_t kk = 0; kk < kc; ++kk) {
          dst[kk * kMr + r] = r < h ? src[kk] : 0.0f;
        }
      }
    }
    for (int64_t pj = 0; pj < np; ++pj) {
      const int64_t jj = j0 + pj * kNr, w = std::min(kNr, j1 - jj);
      const float* bpp = bp + pj * kKc * kNr;
      for (int64_t pi = 0; pi < mp; ++pi) {
        const int64_t ii = i0 + pi * kMr, h = std::min<int64_t>(kMr, i1 - ii);
        const float* app = ap + pi * kKc * kMr;
        const bool full = h == kMr && w == kNr;
        alignas(64) float edge[kMr * kNr];
        V acc[kMr][kNv];
        if (k0 == 0) {
          for (int r = 0; r < kMr; ++r)
            for (int v = 0; v < kNv; ++v) acc[r][v] = V{};
        } else if (full) {
          for (int r = 0; r < kMr; ++r)
            for (int v = 0; v < kNv; ++v)
              std::memcpy(&acc[r][v], c + (ii + r) * n + jj + v * kLanes,
                          sizeof(V));
        } else {
          std::fill(edge, edge + kMr * kNr, 0.0f);
          for (int64_t r = 0; r < h; ++r)
            std::memcpy(edge + r * kNr, c + (ii + r) * n + jj,
                        w * sizeof(float));
          for (int r = 0; r < kMr; ++r)
            for (int v = 0; v < kNv; ++v)
              std::memcpy(&acc[r][v], edge + r * kNr + v * kLanes, sizeof(V));
        }
        for (int64_t kk = 0; kk < kc; ++kk) {
          V bv[kNv];
          for (int v = 0; v < kNv; ++v)
            std::memcpy(&bv[v], bpp + kk * kNr + v * kLanes, sizeof(V));
          for (int r = 0; r < kMr; ++r) {
            const V s = Broadcast(app[kk * kMr + r]);
            for (int v = 0; v < kNv; ++v) {
              if (kFused) {
                acc[r][v] = Fma(s, bv[v], acc[r][v]);
              } else {
                acc[r][v] += s * bv[v];  // -ffp-contract=off: two roundings
              }
            }
          }
        }
        if (full) {
          for (int r = 0; r < kMr; ++r)
            for (int v = 0; v < kNv; ++v)
              std::memcpy(c + (ii + r) * n + jj + v * kLanes, &acc[r][v],
                          sizeof(V));
        } else {
          for (int r = 0; r < kMr; ++r)
            for (int v = 0; v < kNv; ++v)
              std::memcpy(edge + r * kNr + v * kLanes, &acc[r][v], sizeof(V));
          for (int64_t r = 0; r < h; ++r)
            std::memcpy(c + (ii + r) * n + jj, edge + r * kNr,
                        w * sizeof(float));
        }
      }
    }
  }
}

// C (m x n) = A (m x k) * B (k x n), tiles shared among the pool's threads.
template <bool kFused, int kMr, int kNv>
void BlockedWith(ffi::ThreadPool* pool, int64_t m, int64_t n, int64_t k,
                 const float* a, const float* b, float* c) {
  constexpr int64_t kNc = TileCols(kNv * kLanes);
  const int64_t ti = (m + kMc - 1) / kMc, tj = (n + kNc - 1) / kNc;
  ParallelFor(pool, ti * tj, WorthSharing(2.0 * m * n * k), [&](int64_t u) {
    const int64_t bi = u / tj, bj = u % tj;
    Tile<kFused, kMr, kNv>(bi * kMc, std::min(m, (bi + 1) * kMc), bj * kNc,
                           std::min(n, (bj + 1) * kNc), n, k, a, b, c);
  });
}

template <bool kFused>
void Blocked(ffi::ThreadPool* pool, int64_t m, int64_t n, int64_t k,
             const float* a, const float* b, float* c) {
  if (k == 0) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  constexpr int64_t wide = kWideNv * kLanes, narrow = kNarrowNv * kLanes;
  if ((n + narrow - 1) / narrow * narrow < (n + wide - 1) / wide * wide) {
    BlockedWith<kFused, kNarrowMr, kNarrowNv>(pool, m, n, k, a, b, c);
  } else {
    BlockedWith<kFused, kWideMr, kWideNv>(pool, m, n, k, a, b, c);
  }
}
