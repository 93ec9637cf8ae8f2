// Floating-point helpers shared by the CPU (.cc), CUDA (.cu) and HIP kernels.
//
// Everything here is written from the IEEE 754 definitions: rounding a float
// to a narrower format (bf16, fp16, tf32) to nearest-even or toward zero,
// flushing subnormals, and the 16-bit encodings of bf16 and fp16. The same
// functions run on the host and on the device, so the CPU and GPU variants
// round identically.

#ifndef PEAT_JAX_KERNELS_CSRC_PEAT_NUMERICS_H_
#define PEAT_JAX_KERNELS_CSRC_PEAT_NUMERICS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PEAT_HD __host__ __device__ __forceinline__
#else
#define PEAT_HD inline
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define PEAT_DEVICE_CODE 1
#endif

namespace peat {

// Variant codes: the FFI attribute `variant` (int32). Keep in sync with
// VARIANT_CODES in peat_jax/kernels/_variants.py (a test compares them).
enum Variant : int32_t {
  kDefault = 0,          // blocked loops, float accumulation, round to nearest
  kTiled = 1,            // split-K partial sums per tile (softmax: online)
  kFma = 2,              // fused multiply-add in the accumulation
  kAccFp16 = 3,          // accumulator rounded to fp16 after every add
  kAccBf16 = 4,          // accumulator rounded to bf16 after every add
  kInTf32 = 5,           // inputs rounded to tf32 before use
  kInBf16 = 6,           // inputs rounded to bf16 before use
  kInFp16 = 7,           // inputs rounded to fp16 before use
  kRtz = 8,              // wide accumulation, round-toward-zero output
  kFtz = 9,              // subnormal inputs, products and outputs flushed
  kTileEdgeBug = 10,     // edge tile reads its columns one to the left
  kThreadedNondet = 11,  // per-thread partials combined in completion order
  kFastExp = 20,         // softmax: polynomial exp2 approximation
  kRecip = 21,           // softmax: multiply by 1/sum instead of divide
  kWelford = 22,         // layer norm: one-pass Welford mean/variance
  kNaiveVar = 23,        // layer norm: E[x^2] - E[x]^2 variance
  kPairwise = 24,        // rms norm: pairwise (tree) sum of squares
  kHf = 25,              // rms norm, rope: Hugging Face Llama roundings
  kEps = 26,             // rms norm: the port's own eps 1e-5
  kLayerNorm = 27,       // rms norm: subtracts the row mean (a LayerNorm)
  kTanh = 28,            // silu: x * 0.5 * (1 + tanh(x / 2))
  kBf16 = 29,            // silu: every operation rounded to bfloat16
  kSwapped = 30,         // silu: SwiGLU gate and up swapped
  kInterleaved = 31,     // rope: GPT-J layout, pairs (2i, 2i + 1)
  kTheta500k = 32,       // rope: base 500000 whatever theta is given
  kOffset = 33,          // rope: positions + 1
};

enum class Rounding { kNearest, kTowardZero };

PEAT_HD uint32_t FloatBits(float x) {
#ifdef PEAT_DEVICE_CODE
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

PEAT_HD float BitsFloat(uint32_t u) {
#ifdef PEAT_DEVICE_CODE
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

PEAT_HD bool IsNanBits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// Keeps the top (32 - drop) bits of a float, rounding the dropped bits to
// nearest-even or toward zero. drop = 16 gives bf16, drop = 13 gives tf32
// (both keep float's exponent range, so no special subnormal handling).
PEAT_HD float RoundMantissa(float x, int drop, Rounding mode) {
  uint32_t u = FloatBits(x);
  if (IsNanBits(u)) return x;
  uint32_t mask = (1u << drop) - 1u;
  if (mode == Rounding::kNearest) {
    uint32_t half = (1u << (drop - 1)) - 1u;
    u += half + ((u >> drop) & 1u);  // ties to even; carries into exponent
  }
  return BitsFloat(u & ~mask);
}

PEAT_HD float RoundBf16(float x, Rounding mode = Rounding::kNearest) {
  return RoundMantissa(x, 16, mode);
}

PEAT_HD float RoundTf32(float x, Rounding mode = Rounding::kNearest) {
  return RoundMantissa(x, 13, mode);
}

// Rounds a float to the nearest fp16 value (11-bit significand, normal
// exponents -14..15, subnormals down to 2^-24), returned as a float.
PEAT_HD float RoundFp16(float x, Rounding mode = Rounding::kNearest) {
  if (!(x == x) || x - x != 0.0f) return x;  // NaN or Inf
  float a = std::fabs(x);
  if (a == 0.0f) return x;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // a in [2^exp, 2^(exp+1))
  if (exp < -14) exp = -14;
  float quantum = std::ldexp(1.0f, exp - 10);
  float q = a / quantum;  // exact: power-of-two scaling
  q = (mode == Rounding::kNearest) ? std::nearbyint(q) : std::trunc(q);
  float r = q * quantum;
  if (r > 65504.0f) r = (mode == Rounding::kNearest) ? INFINITY : 65504.0f;
  return x < 0.0f ? -r : r;
}

// Encodes a float that is already an exact fp16 value (or Inf/NaN).
PEAT_HD uint16_t Fp16BitsExact(float x) {
  uint32_t u = FloatBits(x);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  float a = std::fabs(x);
  if (IsNanBits(u)) return sign | 0x7e00u;
  if (a == INFINITY) return sign | 0x7c00u;
  if (a >= 6.103515625e-05f) {  // 2^-14: normal
    uint32_t exp = ((u >> 23) & 0xffu) - 127u + 15u;
    uint32_t man = (u >> 13) & 0x3ffu;
    return sign | static_cast<uint16_t>((exp << 10) | man);
  }
  // Subnormal (or zero): a multiple of 2^-24.
  return sign | static_cast<uint16_t>(a * 16777216.0f);
}

PEAT_HD float Fp16BitsToFloat(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = static_cast<float>(man) * 5.9604644775390625e-08f;  // 2^-24
  } else if (exp == 31) {
    mag = man ? NAN : INFINITY;
  } else {
    mag = BitsFloat(((exp - 15u + 127u) << 23) | (man << 13));
  }
  return BitsFloat(FloatBits(mag) | sign);
}

PEAT_HD float Bf16BitsToFloat(uint16_t h) {
  return BitsFloat(static_cast<uint32_t>(h) << 16);
}

PEAT_HD uint16_t Bf16BitsExact(float x) {
  uint32_t u = FloatBits(x);
  if (IsNanBits(u)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>(u >> 16);
}

// Flushes float subnormals to (signed) zero.
PEAT_HD float FlushF32(float x) {
  uint32_t u = FloatBits(x);
  return ((u & 0x7f800000u) == 0u) ? BitsFloat(u & 0x80000000u) : x;
}

PEAT_HD float FlushBelow(float x, float min_normal) {
  return (std::fabs(x) < min_normal) ? BitsFloat(FloatBits(x) & 0x80000000u)
                                     : x;
}

// double -> float, round toward zero (a wide accumulator stored by a
// conversion in the wrong rounding mode).
PEAT_HD float DoubleToFloatRtz(double d) {
#ifdef PEAT_DEVICE_CODE
  return __double2float_rz(d);
#else
  float f = static_cast<float>(d);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) {
    f = std::nextafter(f, 0.0f);
  }
  return f;
#endif
}

// exp(x) with a cubic for 2^f on [0, 1) (least-squares fit of relative
// error, max relative error about 1.7e-4): what "fast math" softmax ports do.
PEAT_HD float FastExp(float x) {
  if (x < -87.0f) return 0.0f;
  if (x > 88.0f) return INFINITY;
  float t = x * 1.4426950408889634f;  // log2(e)
  float n = std::floor(t);
  float f = t - n;
  float p = 1.0f + f * (0.69503617f + f * (0.22830825f + f * 0.07632546f));
  return std::ldexp(p, static_cast<int>(n));
}

// Element type of a buffer, as the kernels see it.
enum class Elem { kF32, kBf16, kF16 };

PEAT_HD float LoadElem(const void* base, int64_t i, Elem t) {
  switch (t) {
    case Elem::kF32:
      return static_cast<const float*>(base)[i];
    case Elem::kBf16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default:
      return Fp16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
  }
}

// Rounds a float to the values of an element type (round to nearest-even):
// the value a port that computes in that type holds after one operation.
PEAT_HD float RoundAs(float x, Elem t) {
  switch (t) {
    case Elem::kF32:
      return x;
    case Elem::kBf16:
      return RoundBf16(x);
    default:
      return RoundFp16(x);
  }
}

// Stores an accumulated value into the output type: round to nearest-even,
// or toward zero (variant rtz); with flush, subnormals of the output format
// become zero (variant ftz).
PEAT_HD void StoreElem(void* base, int64_t i, Elem t, double v, Rounding mode,
                       bool flush) {
  float f = (mode == Rounding::kTowardZero) ? DoubleToFloatRtz(v)
                                            : static_cast<float>(v);
  switch (t) {
    case Elem::kF32:
      if (flush) f = FlushF32(f);
      static_cast<float*>(base)[i] = f;
      return;
    case Elem::kBf16:
      f = RoundBf16(f, mode);
      if (flush) f = FlushF32(f);
      static_cast<uint16_t*>(base)[i] = Bf16BitsExact(f);
      return;
    default:
      f = RoundFp16(f, mode);
      if (flush) f = FlushBelow(f, 6.103515625e-05f);
      static_cast<uint16_t*>(base)[i] = Fp16BitsExact(f);
      return;
  }
}

// Rounding applied to inputs by the in_* and ftz variants.
PEAT_HD float PrepareInput(float x, int32_t variant) {
  switch (variant) {
    case kInTf32:
      return RoundTf32(x);
    case kInBf16:
      return RoundBf16(x);
    case kInFp16:
      return RoundFp16(x);
    case kFtz:
      return FlushF32(x);
    default:
      return x;
  }
}

// Length of the runs a long row's sum adds in order (BlockedSum).
constexpr int64_t kSumBlock = 64;

// add(...add(add(0, term(lo)), term(lo + 1))..., term(lo + n - 1)) in order
// up to kSumBlock terms (the plain loop's bits), beyond that the two halves,
// cut at a multiple of kSumBlock, reduced apart and added with add. A
// running sum of many small terms loses them once it is large (2^20 softmax
// terms in float: ~3e-4 of the sum); this one's error grows with the log
// of the number of blocks.
template <typename T, typename F, typename Add>
PEAT_HD T BlockedReduce(const F& term, int64_t lo, int64_t n, const Add& add) {
  if (n <= kSumBlock) {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s = add(s, term(lo + i));
    return s;
  }
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  const int64_t h = (blocks / 2) * kSumBlock;
  return add(BlockedReduce<T>(term, lo, h, add),
             BlockedReduce<T>(term, lo + h, n - h, add));
}

template <typename T>
struct Plus {
  PEAT_HD T operator()(T a, T b) const { return a + b; }
};

// BlockedReduce with +.
template <typename T, typename F>
PEAT_HD T BlockedSum(const F& term, int64_t lo, int64_t n) {
  return BlockedReduce<T>(term, lo, n, Plus<T>{});
}

}  // namespace peat

#endif  // PEAT_JAX_KERNELS_CSRC_PEAT_NUMERICS_H_
