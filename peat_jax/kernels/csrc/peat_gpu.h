// GPU side (CUDA and HIP from one source): runtime aliases, the generic
// GEMM-shaped kernel with every accumulation variant, and launch helpers.
//
// The .cu files compile with nvcc as CUDA; csrc/hip/*.hip include them with
// hipcc (PEAT_GPU_HIP is defined there), so both backends run the same code.
// Handler symbols and FFI signatures equal the CPU ones, plus the stream
// from ffi::PlatformStream<gpuStream_t>.

#ifndef PEAT_JAX_KERNELS_CSRC_PEAT_GPU_H_
#define PEAT_JAX_KERNELS_CSRC_PEAT_GPU_H_

#include <cstdint>
#include <string>

#if defined(PEAT_GPU_HIP) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
using gpuStream_t = hipStream_t;
using gpuError_t = hipError_t;
#define gpuSuccess hipSuccess
#define gpuGetLastError hipGetLastError
#define gpuGetErrorString hipGetErrorString
#define gpuMemsetAsync hipMemsetAsync
#else
#include <cuda_runtime.h>
using gpuStream_t = cudaStream_t;
using gpuError_t = cudaError_t;
#define gpuSuccess cudaSuccess
#define gpuGetLastError cudaGetLastError
#define gpuGetErrorString cudaGetErrorString
#define gpuMemsetAsync cudaMemsetAsync
#endif

#include "peat_ffi.h"

namespace peat {

inline ffi::Error LastError(const char* what) {
  gpuError_t e = gpuGetLastError();
  if (e != gpuSuccess) {
    return ffi::Error::Internal(std::string(what) + ": " + gpuGetErrorString(e));
  }
  return ffi::Error::Success();
}

inline int64_t Blocks(int64_t n, int threads) {
  return (n + threads - 1) / threads;
}

inline bool IsGemmVariant(int32_t v) {
  return v >= kDefault && v <= kThreadedNondet;
}

// Products and sums without contraction (built with --fmad=false as well):
// default is one rounding per multiply and per add, as on the CPU.
__device__ __forceinline__ float MulAdd(int32_t variant, float s, float a,
                                        float b) {
  switch (variant) {
    case kFma:
      return __fmaf_rn(a, b, s);
    case kAccFp16:
      return RoundFp16(__fadd_rn(s, __fmul_rn(a, b)));
    case kAccBf16:
      return RoundBf16(__fadd_rn(s, __fmul_rn(a, b)));
    case kFtz:
      return FlushF32(__fadd_rn(s, FlushF32(__fmul_rn(a, b))));
    default:
      return __fadd_rn(s, __fmul_rn(a, b));
  }
}

// Sum over kk in [k0, k1) of A(r, kk) * B(kk, c) with the variant's
// accumulation; tiled sums each `tile` range into a fresh partial first.
template <typename A, typename B>
__device__ double DotRange(int32_t variant, int64_t tile, const A& a,
                           const B& b, int64_t bi, int64_t r, int64_t c,
                           int64_t k0, int64_t k1) {
  if (variant == kRtz) {
    double s = 0.0;
    for (int64_t kk = k0; kk < k1; ++kk) {
      s += static_cast<double>(a(bi, r, kk)) * static_cast<double>(b(bi, kk, c));
    }
    return s;
  }
  if (variant == kTiled) {
    float s = 0.0f;
    for (int64_t t0 = k0; t0 < k1; t0 += tile) {
      const int64_t t1 = t0 + tile < k1 ? t0 + tile : k1;
      float p = 0.0f;
      for (int64_t kk = t0; kk < t1; ++kk) p = MulAdd(kDefault, p, a(bi, r, kk), b(bi, kk, c));
      s = __fadd_rn(s, p);
    }
    return s;
  }
  float s = 0.0f;
  for (int64_t kk = k0; kk < k1; ++kk) s = MulAdd(variant, s, a(bi, r, kk), b(bi, kk, c));
  return s;
}

// One thread per output element (bi, r, c) of a batched (rows x cols)
// product with inner size k. tile_edge_bug: the edge column tile reads the
// column to its left (the CPU kernel's bug, same indexing).
template <typename A, typename B>
__global__ void GemmKernel(int32_t variant, int64_t tile, int64_t batch,
                           int64_t rows, int64_t cols, int64_t k, A a, B b,
                           void* out, Elem to) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= batch * rows * cols) return;
  const int64_t c = idx % cols, r = (idx / cols) % rows, bi = idx / (rows * cols);
  int64_t lc = c;
  if (variant == kTileEdgeBug) {
    const int64_t rem = cols % tile;
    if (rem != 0 && c >= cols - rem && cols - rem - 1 >= 0) lc = c - 1;
  }
  const double v = DotRange(variant, tile, a, b, bi, r, lc, 0, k);
  StoreElem(out, idx, to, v,
            variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest,
            variant == kFtz);
}

// threaded_nondet: one thread per (output element, k chunk); chunk partial
// sums are atomically added into a float workspace in whatever order the
// hardware schedules them (split-K with atomics).
template <typename A, typename B>
__global__ void SplitKAtomicKernel(int64_t tile, int64_t batch, int64_t rows,
                                   int64_t cols, int64_t k, A a, B b,
                                   float* acc) {
  const int64_t chunks = (k + tile - 1) / tile;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= batch * rows * cols * chunks) return;
  const int64_t ch = idx % chunks, o = idx / chunks;
  const int64_t c = o % cols, r = (o / cols) % rows, bi = o / (rows * cols);
  const int64_t k0 = ch * tile, k1 = k0 + tile < k ? k0 + tile : k;
  const float p = static_cast<float>(DotRange(kDefault, tile, a, b, bi, r, c, k0, k1));
  atomicAdd(acc + o, p);
}

namespace {  // one copy per translation unit
__global__ void StoreFloatKernel(const float* acc, int64_t n, void* out,
                                 Elem to) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) StoreElem(out, i, to, acc[i], Rounding::kNearest, false);
}
}  // namespace

// Runs one batched product with the variant. threaded_nondet adds float32
// partial sums atomically: into a float32 output itself, otherwise into a
// float32 accumulator then stored in the output's dtype. That accumulator
// comes from the stream-ordered allocator on CUDA (freed on the stream
// after the store): XLA's FFI scratch allocator refused every request on
// the first GPU check (an H200, jax 0.11.2). HIP keeps the scratch
// allocator.
template <typename A, typename B>
ffi::Error LaunchGemm(gpuStream_t stream, ffi::ScratchAllocator& scratch,
                      int32_t variant, int64_t tile, int64_t batch,
                      int64_t rows, int64_t cols, int64_t k, const A& a,
                      const B& b, void* out, Elem to) {
  const int threads = 256;
  const int64_t n = batch * rows * cols;
  if (n == 0) return ffi::Error::Success();
  if (variant == kThreadedNondet) {
    const size_t bytes = sizeof(float) * static_cast<size_t>(n);
    const bool direct = to == Elem::kF32;
    float* acc = direct ? static_cast<float*>(out) : nullptr;
    if (!direct) {
#if defined(PEAT_GPU_HIP) || defined(__HIPCC__)
      auto mem = scratch.Allocate(bytes, 256);
      if (!mem.has_value()) {
        return ffi::Error::Internal(
            "peat: scratch allocation of " + std::to_string(bytes) +
            " bytes failed");
      }
      acc = static_cast<float*>(*mem);
#else
      void* mem = nullptr;
      cudaError_t e = cudaMallocAsync(&mem, bytes, stream);
      if (e != cudaSuccess) {
        return ffi::Error::Internal(
            "peat: cudaMallocAsync of " + std::to_string(bytes) +
            " bytes for the threaded_nondet accumulator failed: " +
            cudaGetErrorString(e));
      }
      acc = static_cast<float*>(mem);
#endif
    }
    gpuMemsetAsync(acc, 0, bytes, stream);
    const int64_t chunks = (k + tile - 1) / tile;
    if (chunks > 0) {
      SplitKAtomicKernel<<<Blocks(n * chunks, threads), threads, 0, stream>>>(
          tile, batch, rows, cols, k, a, b, acc);
    }
    if (!direct) {
      StoreFloatKernel<<<Blocks(n, threads), threads, 0, stream>>>(acc, n, out,
                                                                   to);
#if !(defined(PEAT_GPU_HIP) || defined(__HIPCC__))
      cudaError_t e = cudaFreeAsync(acc, stream);
      if (e != cudaSuccess) {
        return ffi::Error::Internal(
            std::string("peat: cudaFreeAsync of the threaded_nondet "
                        "accumulator failed: ") + cudaGetErrorString(e));
      }
#endif
    }
  } else {
    GemmKernel<<<Blocks(n, threads), threads, 0, stream>>>(
        variant, tile, batch, rows, cols, k, a, b, out, to);
  }
  return LastError("peat GEMM launch");
}

// A strided operand: element (bi, r, c) at base[bi * bs + r * rs + c * cs],
// read as float with the variant's input rounding.
struct Strided {
  const void* base;
  Elem t;
  int64_t bs, rs, cs;
  int32_t variant;
  __device__ float operator()(int64_t bi, int64_t r, int64_t c) const {
    return PrepareInput(LoadElem(base, bi * bs + r * rs + c * cs, t), variant);
  }
};

}  // namespace peat

#endif  // PEAT_JAX_KERNELS_CSRC_PEAT_GPU_H_
