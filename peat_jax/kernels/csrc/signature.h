// Shared layout of the Analyzer's native statistics pass (signature.cc):
// output slots, the cut of a record into units and each unit's partial
// results. The vector code that fills them is signature_body.h.

#ifndef PEAT_JAX_KERNELS_CSRC_SIGNATURE_H_
#define PEAT_JAX_KERNELS_CSRC_SIGNATURE_H_

#include <algorithm>
#include <cstdint>

namespace peat {
namespace sig {

// Flag indices (must match _F_* in peat_jax/_analyzer.py).
enum Flag {
  kBitEqual = 0, kValueEqual, kNanT, kNanG, kInfT, kInfG, kFinitePair,
  kNonfiniteNew, kZeroed, kFlushed, kSaturated, kSatFp16, kSatE4m3,
  kGoldenSubnormal, kPosErr, kNegErr, kMagLarger, kMagSmaller, kSignFlip,
  kRatioOk, kLogOk, kGoldenZero, kOverflow, kNumFlags
};
constexpr int kFlagSlots = 32;

// Reference counts, appended after the bit counts (must match
// _NATIVE_REF_COUNTS in peat_jax/_analyzer.py).
enum RefCount {
  kRefN = 0, kRefTCloser, kRefGCloser, kRefTShrunk, kRefTGrown, kRefGShrunk,
  kRefGGrown, kNumRefCounts
};

// Float outputs (must match _NATIVE_FLOATS in peat_jax/_analyzer.py).
enum FloatOut {
  kErrSum = 0, kMagErrSum, kRelMax, kRelSum, kRelSqs, kGAbsMax, kGSqs,
  kRatioMin, kRatioMax, kLogratioSum, kSx, kSy, kSxy, kSxx, kSyy,
  kZeroedGMax, kRefTMax, kRefTSqs, kRefGMax, kRefGSqs, kRefTRelSum,
  kRefGRelSum, kNumFloats
};

// Plain sums accumulated per lane.
enum SumIdx {
  kSErr = 0, kSMag, kSRel, kSLr, kSX, kSY, kSXY, kSXX, kSYY, kSRefTRel,
  kSRefGRel, kNumSums
};
// Sums of squares (each with its maximum).
enum SsqIdx { kQRel = 0, kQG, kQRefT, kQRefG, kNumSsq };

// Sampled statistics (peat_jax._analyzer: PCT_SAMPLE, HIST_BUCKETS,
// NARROW_FORMATS, _sample_index, _representable).
constexpr int64_t kPctSample = 65536;
constexpr int kHistBuckets = 1024;
constexpr int kNarrow = 5;
// Sample counts output: pct_n, sample_n, repr_t[5], repr_g[5].
constexpr int kSampleCounts = 2 + 2 * kNarrow;

// A narrow format: mantissa bits, smallest and largest normal exponent,
// and the largest significand at the largest exponent as an integer of
// mant + 1 bits (all ones, but 1.110b for e4m3fn, whose 1.111b is NaN).
struct NarrowFormat {
  int mant;
  int emin;
  int emax;
  uint64_t max_top;
};
// bf16, fp16, tf32, fp8_e4m3 (e4m3fn), fp8_e5m2 (NARROW_FORMATS order).
constexpr NarrowFormat kNarrowFormats[kNarrow] = {
    {7, -126, 127, 255}, {10, -14, 15, 2047}, {10, -126, 127, 2047},
    {3, -6, 8, 14},      {2, -14, 15, 7},
};

// One unit's results (combined in unit order by the caller).
struct UnitOut {
  int64_t flags[kFlagSlots];
  int64_t bits[3][64];  // bits_up, bits_down, ulp_cum
  int64_t ref[kNumRefCounts];
  uint32_t hash[4];
  double sum[kNumSums];
  double ssq_max[kNumSsq];  // maximum of the quantity
  double ssq_s[kNumSsq];    // sum((x / max)^2)
  double ratio_min, ratio_max, zeroed_g_max;
  // Sampled statistics.
  int32_t hist_abs[kHistBuckets];
  int32_t hist_rel[kHistBuckets];
  int64_t sample_counts[kSampleCounts];
};

// The cut of an (R, C) record into units: row stripes of `row_stripe` rows
// (a multiple of 8, so 8x8 tiles never straddle units) times column chunks
// of `col_chunk` columns. It depends only on the shape.
struct Plan {
  int64_t rows, cols;
  int64_t col_chunk;
  int64_t row_stripe;
  int64_t n_chunks;
  int64_t n_stripes;
  // Sampled elements: every element when sample_w is 0, else element
  // k * sample_w + Hash32(k) % sample_w for k < kPctSample.
  int64_t sample_w;
  int64_t units() const { return n_chunks * n_stripes; }
};

// Units of about n / 16 elements (at least 64 Ki, at most 1 Mi elements).
inline Plan MakePlan(int64_t rows, int64_t cols) {
  Plan p;
  p.rows = rows;
  p.cols = cols;
  p.col_chunk = 65536;
  const int64_t cbw = std::min(cols, p.col_chunk);
  p.n_chunks = (cols + p.col_chunk - 1) / p.col_chunk;
  const int64_t n = rows * cols;
  const int64_t target =
      std::min<int64_t>(int64_t{1} << 20, std::max<int64_t>(n / 16, 1 << 16));
  int64_t rb = (target + cbw - 1) / cbw;
  rb = std::min<int64_t>(std::max<int64_t>(rb, 8), 2048);
  rb = (rb + 7) / 8 * 8;
  p.row_stripe = rb;
  p.n_stripes = (rows + rb - 1) / rb;
  p.sample_w = n <= kPctSample ? 0 : n / kPctSample;
  return p;
}

// Everything a unit reads and writes. The partials are owned by the caller
// and outlive every unit; unit u writes only its own slots.
struct Job {
  const void* t;
  const void* g;
  const float* hi;  // reference = hi + lo (nullptr: no reference)
  const float* lo;
  Plan plan;
  UnitOut* units;
  // Row partials [chunk][row]; column partials [stripe][col].
  int64_t* row_nd;
  double* row_max;
  double* row_sum;
  double* row_ssq;  // sum((x / row_max)^2)
  int64_t* col_nd;
  double* col_sum;
  int32_t* tile;  // (rows / 8, cols / 8), written directly
};

using UnitFn = void (*)(const Job&, int64_t);

// Merges scaled sums of squares: (m1, s1) += (m2, s2).
inline void MergeScaled(double& m1, double& s1, double m2, double s2) {
  const double m = std::max(m1, m2);
  if (m > 0) {
    const double f1 = m1 / m, f2 = m2 / m;
    s1 = s1 * f1 * f1 + s2 * f2 * f2;
  } else {
    s1 = 0;
  }
  m1 = m;
}

}  // namespace sig
}  // namespace peat

#endif  // PEAT_JAX_KERNELS_CSRC_SIGNATURE_H_
