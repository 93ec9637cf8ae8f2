// XLA FFI handler (CPU): the exact median of the kept elements of each of
// several float64 arrays, where NaN marks an element that is not kept.
//
//   peat_median_kept(x_0 f64[...], ..., x_{k-1} f64[...]) -> f64[k]
//
// Each median is NumPy's `np.median(x[~np.isnan(x)])` bit for bit: the
// middle order statistic, or for an even count the two middle ones a <= b
// averaged as `np.mean` averages them, (a + b) / 2; +inf where nothing is
// kept. The kept elements must be non-negative (+inf allowed): the port
// probe's ratios |t - h| / |t - r| (profiler.playback_fi._carried_probe);
// a negative one is an error, so that a value's float64 bits order the
// values.
//
// Speed: one pass counts an array's kept elements by their top bits
// (exponent and 4 fraction bits: a sixteenth of an octave); the bins
// holding the middle ranks are found from the counts, and a second pass
// copies only their elements, which are partitioned (std::nth_element).
// Arrays are units of XLA's intra-op pool (peat_parallel.h): each is
// reduced whole by one thread, so the result does not depend on threads.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "peat_ffi.h"
#include "peat_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace median {
namespace {

constexpr int kShift = 48;
constexpr int64_t kBins = int64_t{1} << (64 - kShift - 1);
constexpr uint64_t kMagnitude = ~(uint64_t{1} << 63);
constexpr uint64_t kInfBits = uint64_t{0x7FF} << 52;

// An element's bin: its magnitude's top bits (-0 with +0; the bits of
// non-negative values order them), or kBins for a NaN. Bit operations
// only: no float comparison, no branch.
inline int64_t Bin(uint64_t bits) {
  const uint64_t a = bits & kMagnitude;
  return a > kInfBits ? kBins : static_cast<int64_t>(a >> kShift);
}

// The median of x's kept elements, or false where one is negative.
bool MedianKept(const double* x, int64_t n, double* out) {
  const uint64_t* bits = reinterpret_cast<const uint64_t*>(x);
  std::vector<int32_t> count(kBins + 1, 0);
  uint64_t negative = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t b = bits[i];
    const int64_t bin = Bin(b);
    // A set sign bit on a kept element other than -0.
    negative |= (b >> 63) & static_cast<uint64_t>(bin != kBins) &
                static_cast<uint64_t>((b & kMagnitude) != 0);
    ++count[bin];
  }
  if (negative) return false;
  const int64_t m = n - count[kBins];
  if (m == 0) {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  // Ranks wanted (0-based): the lower and upper middle (equal when odd).
  const int64_t r_lo = (m - 1) / 2, r_hi = m / 2;
  int64_t below = 0, b_lo = -1, b_hi = -1, below_lo = 0;
  for (int64_t b = 0; b < kBins && b_hi < 0; ++b) {
    if (b_lo < 0 && below + count[b] > r_lo) {
      b_lo = b;
      below_lo = below;
    }
    if (below + count[b] > r_hi) b_hi = b;
    below += count[b];
  }
  // The kept elements of bins b_lo..b_hi: ranks below_lo onward, in value
  // order across bins. Branch-free: every element is written at the next
  // free slot, which advances only for the wanted ones (one spare slot).
  const int64_t wanted = below - below_lo;
  const uint64_t span = static_cast<uint64_t>(b_hi - b_lo);
  std::vector<double> mid(static_cast<size_t>(wanted) + 1);
  int64_t k = 0;
  for (int64_t i = 0; i < n && k < wanted; ++i) {
    mid[k] = x[i];
    k += static_cast<uint64_t>(Bin(bits[i]) - b_lo) <= span;
  }
  mid.resize(static_cast<size_t>(wanted));
  const int64_t k_hi = r_hi - below_lo;
  std::nth_element(mid.begin(), mid.begin() + k_hi, mid.end());
  const double hi = mid[k_hi];
  if (r_lo == r_hi) {
    *out = hi;
    return true;
  }
  const double lo = *std::max_element(mid.begin(), mid.begin() + k_hi);
  *out = (lo + hi) / 2;
  return true;
}

ffi::Error MedianKeptImpl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                          ffi::Result<ffi::AnyBuffer> out) {
  const int64_t k = static_cast<int64_t>(args.size());
  if (out->element_type() != ffi::DataType::F64 ||
      static_cast<int64_t>(out->element_count()) != k) {
    return ffi::Error::InvalidArgument(
        "peat_median_kept: the output must be float64[" + std::to_string(k) +
        "], one median per input array");
  }
  std::vector<const double*> xs(k);
  std::vector<int64_t> ns(k);
  for (int64_t i = 0; i < k; ++i) {
    auto a = args.get<ffi::AnyBuffer>(i);
    if (a.has_error()) return a.error();
    if (a->element_type() != ffi::DataType::F64) {
      return ffi::Error::InvalidArgument(
          "peat_median_kept: input " + std::to_string(i) +
          " is not float64; pass the ratios as float64 (NaN: not kept)");
    }
    xs[i] = static_cast<const double*>(a->untyped_data());
    ns[i] = static_cast<int64_t>(a->element_count());
    if (ns[i] > std::numeric_limits<int32_t>::max()) {  // int32 bin counts
      return ffi::Error::InvalidArgument(
          "peat_median_kept: input " + std::to_string(i) + " has " +
          std::to_string(ns[i]) + " elements; at most 2**31 - 1 per array "
          "(split it)");
    }
  }
  double* med = out->typed_data<double>();
  std::vector<char> ok(k, 1);
  int64_t total = 0;
  for (int64_t n : ns) total += n;
  ParallelFor(&pool, k, total >= (int64_t{1} << 16), [&](int64_t i) {
    ok[i] = MedianKept(xs[i], ns[i], &med[i]) ? 1 : 0;
  });
  for (int64_t i = 0; i < k; ++i) {
    if (!ok[i]) {
      return ffi::Error::InvalidArgument(
          "peat_median_kept: input " + std::to_string(i) +
          " has a negative kept element; the median's inputs are ratios "
          "(non-negative, NaN where not kept)");
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace median
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatMedianKept);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatMedianKept, peat::median::MedianKeptImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .Ret<xla::ffi::AnyBuffer>());
