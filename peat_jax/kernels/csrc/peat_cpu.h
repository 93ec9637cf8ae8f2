// CPU-side helpers shared by the XLA FFI handlers: dtype mapping, input
// packing, the GEMM core (defined in gemm_cpu.cc) and IEEE subnormal mode.

#ifndef PEAT_JAX_KERNELS_CSRC_PEAT_CPU_H_
#define PEAT_JAX_KERNELS_CSRC_PEAT_CPU_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "peat_ffi.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace peat {

// The floating-point control state (MXCSR: rounding, FTZ/DAZ) of the
// calling thread; 0 and a no-op where there is none.
#if defined(__SSE__) || defined(__x86_64__)
inline unsigned GetFpMode() { return _mm_getcsr(); }
inline void SetFpMode(unsigned m) { _mm_setcsr(m); }
#else
inline unsigned GetFpMode() { return 0; }
inline void SetFpMode(unsigned) {}
#endif

inline std::string DimsString(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  return s + ")";
}

inline int64_t Prod(ffi::AnyBuffer::Dimensions d, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= d[i];
  return p;
}

// XLA's CPU runtime runs with denormals flushed (FTZ/DAZ in MXCSR). The
// kernels under test compute with IEEE subnormals, as a GPU kernel built
// without -ftz does; only the ftz variant flushes, explicitly. This scope
// clears FTZ/DAZ for the duration of a handler and restores them after.
class ScopedIeeeSubnormals {
 public:
  ScopedIeeeSubnormals() : saved_(GetFpMode()) {
    SetFpMode(saved_ & ~(0x8000u | 0x0040u));  // FTZ bit 15, DAZ bit 6
  }
  ~ScopedIeeeSubnormals() { SetFpMode(saved_); }

 private:
  const unsigned saved_;
};

namespace cpu_internal {

// Packs with the element type and the input rounding fixed at compile time
// (the per-element switches of LoadElem / PrepareInput leave the loop).
template <Elem kT, int32_t kPrep>
void PackAs(const void* base, int64_t offset, int64_t rows, int64_t cols,
            int64_t rs, int64_t cs, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = offset + r * rs;
    float* dst = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      dst[c] = PrepareInput(LoadElem(base, at + c * cs, kT), kPrep);
    }
  }
}

template <Elem kT>
void PackRounded(const void* base, int64_t offset, int64_t rows, int64_t cols,
                 int64_t rs, int64_t cs, int32_t variant, float* out) {
  switch (variant) {
    case kInTf32:
      return PackAs<kT, kInTf32>(base, offset, rows, cols, rs, cs, out);
    case kInBf16:
      return PackAs<kT, kInBf16>(base, offset, rows, cols, rs, cs, out);
    case kInFp16:
      return PackAs<kT, kInFp16>(base, offset, rows, cols, rs, cs, out);
    case kFtz:
      return PackAs<kT, kFtz>(base, offset, rows, cols, rs, cs, out);
    default:
      return PackAs<kT, kDefault>(base, offset, rows, cols, rs, cs, out);
  }
}

}  // namespace cpu_internal

// Reads an (rows x cols) matrix into row-major float, applying the variant's
// input rounding. Element (r, c) is at base[offset + r * rs + c * cs], so a
// transposed operand is packed by swapping the strides.
inline void PackMatrix(const void* base, Elem t, int64_t offset, int64_t rows,
                       int64_t cols, int64_t rs, int64_t cs, int32_t variant,
                       float* out) {
  switch (t) {
    case Elem::kF32:
      return cpu_internal::PackRounded<Elem::kF32>(base, offset, rows, cols,
                                                   rs, cs, variant, out);
    case Elem::kBf16:
      return cpu_internal::PackRounded<Elem::kBf16>(base, offset, rows, cols,
                                                    rs, cs, variant, out);
    default:
      return cpu_internal::PackRounded<Elem::kF16>(base, offset, rows, cols,
                                                   rs, cs, variant, out);
  }
}

// C (M x N) = A (M x K) * B (K x N), all row-major float, with the variant's
// accumulation. For kRtz the result goes to c64 (double accumulation), else
// to c32. `tile` is the tile size of kTiled, kTileEdgeBug and
// kThreadedNondet. Work is shared with `pool`'s threads when given (results
// do not depend on it, except for kThreadedNondet, which runs its own).
void Gemm(ffi::ThreadPool* pool, int32_t variant, int64_t tile, int64_t m,
          int64_t n, int64_t k, const float* a, const float* b, float* c32,
          double* c64);

// Writes M*N accumulated values into an output buffer at `offset` with the
// variant's output rounding.
inline void StoreMatrix(int32_t variant, const float* c32, const double* c64,
                        int64_t count, void* out, Elem t, int64_t offset) {
  Rounding mode = variant == kRtz ? Rounding::kTowardZero : Rounding::kNearest;
  bool flush = variant == kFtz;
  if (t == Elem::kF32 && variant != kRtz && !flush) {  // exact: a copy
    std::memcpy(static_cast<float*>(out) + offset, c32, count * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    double v = variant == kRtz ? c64[i] : static_cast<double>(c32[i]);
    StoreElem(out, offset + i, t, v, mode, flush);
  }
}

inline bool IsGemmVariant(int32_t v) { return v >= kDefault && v <= kThreadedNondet; }

}  // namespace peat

#endif  // PEAT_JAX_KERNELS_CSRC_PEAT_CPU_H_
