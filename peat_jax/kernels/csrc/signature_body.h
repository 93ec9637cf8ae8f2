// The vector code of the Analyzer's native statistics pass (signature.cc).
//
// Deliberately without an include guard: signature.cc includes this file
// once per instruction-set level, each time inside its own namespace and
// under its own `#pragma GCC target`, so that every function here (inlined
// or not) is compiled for that level, with PEAT_SIG_ISA set to 512
// (AVX-512 F/BW/DQ/VL/CD), 2 (AVX2) or 0 (baseline); a few helpers use that
// level's intrinsics. It must not include headers itself; signature.cc
// includes what it needs first. Vectors are written with GCC vector
// extensions, as wide as the level's registers: 64 bytes at AVX-512 (16
// float32 lanes, 8 float64 lanes), 32 at AVX2 (8 and 4), 16 at the
// baseline (4 and 2). (GCC keeps a vector wider than the registers in
// memory and lowers its comparisons and selects one lane at a time: 64-byte
// vectors at AVX2 ran the pass ~15x slower than 32-byte ones.) The lane
// count changes which elements share a lane sum, so float sums differ
// between levels in the last bits; counts, hashes and histograms do not.

#define PEAT_INLINE static inline __attribute__((always_inline))
#define PEAT_MINLINE inline __attribute__((always_inline))
#define PEAT_NOINLINE __attribute__((noinline))

#if PEAT_SIG_ISA == 512
#define PEAT_SIG_VBYTES 64
#elif PEAT_SIG_ISA == 2
#define PEAT_SIG_VBYTES 32
#else
#define PEAT_SIG_VBYTES 16
#endif
typedef float vf32 __attribute__((vector_size(PEAT_SIG_VBYTES)));
typedef double vf64 __attribute__((vector_size(PEAT_SIG_VBYTES)));
typedef uint32_t vu32 __attribute__((vector_size(PEAT_SIG_VBYTES)));
typedef int32_t vi32 __attribute__((vector_size(PEAT_SIG_VBYTES)));
typedef uint64_t vu64 __attribute__((vector_size(PEAT_SIG_VBYTES)));
typedef int64_t vi64 __attribute__((vector_size(PEAT_SIG_VBYTES)));
// Half vectors: a float32 vector's halves (as many lanes as a float64
// vector), and 16-bit records' loads (as many lanes as a float32 vector).
typedef uint16_t vu16h __attribute__((vector_size(PEAT_SIG_VBYTES / 2)));
typedef float vf32h __attribute__((vector_size(PEAT_SIG_VBYTES / 2)));
typedef uint32_t vu32h __attribute__((vector_size(PEAT_SIG_VBYTES / 2)));
// Lanes of a float32 and of a float64 vector.
constexpr int kLanes32 = PEAT_SIG_VBYTES / 4;
constexpr int kLanes64 = PEAT_SIG_VBYTES / 8;

// The low and high halves of a float32 vector (lanes [0, W / 2) and
// [W / 2, W)).
PEAT_INLINE vf32h LowHalf(vf32 x) {
  vf32h h;
  std::memcpy(&h, &x, sizeof(h));
  return h;
}
PEAT_INLINE vf32h HighHalf(vf32 x) {
  vf32h h;
  std::memcpy(&h, reinterpret_cast<const char*>(&x) + sizeof(h), sizeof(h));
  return h;
}

// ---------------------------------------------------------------- dtypes

template <class Tr>
struct Consts {
  using U = typename Tr::U;
  static constexpr int kBits = Tr::kBits;
  static constexpr int kMant = Tr::kMant;
  static constexpr U kSign = U(1) << (kBits - 1);
  static constexpr U kMag = kSign - 1;
  static constexpr U kInf = ((U(1) << (kBits - 1 - kMant)) - 1) << kMant;
  static constexpr U kMaxBits = kInf - 1;
  static constexpr U kMinNorm = U(1) << kMant;
  static constexpr U kBias = (U(1) << (kBits - 2 - kMant)) - 1;
  // 448 = 1.75 * 2**8: the fp8_e4m3 maximum, in this dtype's encoding.
  static constexpr U k448 = ((8 + kBias) << kMant) | (U(3) << (kMant - 2));
  // Lower bound of the fast path: 2**-40, or the smallest normal number.
  static constexpr U kFastLo = kBias > 40 ? (kBias - 40) << kMant : kMinNorm;
};

struct TraitsF32 {
  using S = uint32_t;
  using F = float;
  using U = uint32_t;
  using VF = vf32;
  using VU = vu32;
  using VI = vi32;
  static constexpr int W = kLanes32, kBits = 32, kMant = 23;
  static PEAT_MINLINE VU Load(const S* p) {
    VU v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static PEAT_MINLINE VF Value(VU b) { return (VF)b; }
};

struct TraitsBf16 {
  using S = uint16_t;
  using F = float;
  using U = uint32_t;
  using VF = vf32;
  using VU = vu32;
  using VI = vi32;
  static constexpr int W = kLanes32, kBits = 16, kMant = 7;
  static PEAT_MINLINE VU Load(const S* p) {
    vu16h h;
    std::memcpy(&h, p, sizeof(h));
    return __builtin_convertvector(h, VU);
  }
  static PEAT_MINLINE VF Value(VU b) { return (VF)(b << 16); }
};

struct TraitsF16 {
  using S = uint16_t;
  using F = float;
  using U = uint32_t;
  using VF = vf32;
  using VU = vu32;
  using VI = vi32;
  static constexpr int W = kLanes32, kBits = 16, kMant = 10;
  static PEAT_MINLINE VU Load(const S* p) {
    vu16h h;
    std::memcpy(&h, p, sizeof(h));
    return __builtin_convertvector(h, VU);
  }
  // Exact IEEE half -> single (subnormal halves are normal singles).
  static PEAT_MINLINE VF Value(VU h) {
    const VU shifted_exp = VU{} + (0x7C00u << 13);
    VU o = (h & 0x7FFFu) << 13;
    VU e = o & shifted_exp;
    o += (127u - 15u) << 23;
    o = (e == shifted_exp) ? o + ((128u - 16u) << 23) : o;
    const VF magic = (VF)(VU{} + (113u << 23));
    VF sub = (VF)(o + (1u << 23)) - magic;
    o = (e == 0) ? (VU)sub : o;
    return (VF)(o | ((h & 0x8000u) << 16));
  }
};

struct TraitsF64 {
  using S = uint64_t;
  using F = double;
  using U = uint64_t;
  using VF = vf64;
  using VU = vu64;
  using VI = vi64;
  static constexpr int W = kLanes64, kBits = 64, kMant = 52;
  static PEAT_MINLINE VU Load(const S* p) {
    VU v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static PEAT_MINLINE VF Value(VU b) { return (VF)b; }
};

// ---------------------------------------------------------- vector math

template <class V>
PEAT_INLINE V Splat(decltype(V{}[0]) x) {
  return V{} + x;
}

PEAT_INLINE vf32 Max(vf32 a, vf32 b) { return a > b ? a : b; }
PEAT_INLINE vf32 Min(vf32 a, vf32 b) { return a < b ? a : b; }
PEAT_INLINE vf64 Max(vf64 a, vf64 b) { return a > b ? a : b; }
PEAT_INLINE vf64 Min(vf64 a, vf64 b) { return a < b ? a : b; }
// jnp.maximum / jnp.minimum propagate NaN; every operand reaching these
// helpers is NaN-free (selected), so the plain compare-select is the same.

PEAT_INLINE vf32 Abs(vf32 x) { return (vf32)((vu32)x & 0x7FFFFFFFu); }
PEAT_INLINE vf64 Abs(vf64 x) {
  return (vf64)((vu64)x & 0x7FFFFFFFFFFFFFFFull);
}

// log2 of positive normal float32 lanes: exponent plus a degree-8
// polynomial of the mantissa in [sqrt(1/2), sqrt(2)) (max error ~1.5e-7
// relative; fitted to log2(1 + u) / u).
PEAT_INLINE vf32 Log2Pos(vf32 x) {
  const vu32 b = (vu32)x;
  const vi32 e = ((vi32)(b - 0x3F3504F3u)) >> 23;
  const vf32 u = (vf32)(b - ((vu32)e << 23)) - 1.0f;
  vf32 p = Splat<vf32>(0.12614846f);
  p = p * u - 0.20742103f;
  p = p * u + 0.21566986f;
  p = p * u - 0.23892035f;
  p = p * u + 0.28791833f;
  p = p * u - 0.36070484f;
  p = p * u + 0.4809106f;
  p = p * u - 0.72134733f;
  p = p * u + 1.442695f;
  return __builtin_convertvector(e, vf32) + p * u;
}

// log2 of x >= 0 (float32 lanes): Log2Pos, with zero and subnormal inputs
// giving -inf, as XLA:CPU's log does under DAZ; +inf gives +inf, NaN NaN.
PEAT_INLINE vf32 Log2(vf32 x) {
  const vu32 b = (vu32)x;
  vf32 r = Log2Pos(x);
  r = ((b >> 23) == 0) ? Splat<vf32>(-INFINITY) : r;
  return (b >= 0x7F800000u) ? x : r;
}

// log2 of positive normal float64 lanes: exponent plus 2 atanh(s) / ln 2
// with s = (m - 1) / (m + 1) for the mantissa m in [sqrt(1/2), sqrt(2))
// (|s| <= 0.1716; series to s**23: error ~2 ulp).
PEAT_INLINE vf64 Log2Pos(vf64 x) {
  const vu64 b = (vu64)x;
  const vi64 e = ((vi64)(b - 0x3FE6A09E667F3BCDull)) >> 52;
  const vf64 m = (vf64)(b - ((vu64)e << 52));
  const vf64 s = (m - 1.0) / (m + 1.0);
  const vf64 s2 = s * s;
  vf64 p = Splat<vf64>(1.0 / 23);
  p = p * s2 + 1.0 / 21;
  p = p * s2 + 1.0 / 19;
  p = p * s2 + 1.0 / 17;
  p = p * s2 + 1.0 / 15;
  p = p * s2 + 1.0 / 13;
  p = p * s2 + 1.0 / 11;
  p = p * s2 + 1.0 / 9;
  p = p * s2 + 1.0 / 7;
  p = p * s2 + 1.0 / 5;
  p = p * s2 + 1.0 / 3;
  p = p * s2 + 1.0;
  return __builtin_convertvector(e, vf64) + (s * p) * 2.8853900817779268;
}

// log2 of x >= 0 (float64 lanes): Log2Pos, with zero and subnormal inputs
// giving -inf (DAZ, as XLA:CPU); +inf gives +inf, NaN NaN.
PEAT_INLINE vf64 Log2(vf64 x) {
  const vu64 b = (vu64)x;
  vf64 r = Log2Pos(x);
  r = ((b >> 52) == 0) ? Splat<vf64>(-INFINITY) : r;
  return (b >= 0x7FF0000000000000ull) ? x : r;
}

// True if any bit of v is set.
template <class V>
PEAT_INLINE bool AnyNonzero(V v) {
#if PEAT_SIG_ISA == 512
  static_assert(sizeof(V) == sizeof(__m512i), "one register");
  __m512i x;
  std::memcpy(&x, &v, sizeof(x));
  return _mm512_test_epi32_mask(x, x) != 0;
#elif PEAT_SIG_ISA == 2
  static_assert(sizeof(V) == sizeof(__m256i), "one register");
  __m256i x;
  std::memcpy(&x, &v, sizeof(x));
  return !_mm256_testz_si256(x, x);
#else
  uint64_t w[sizeof(V) / 8];
  std::memcpy(w, &v, sizeof(w));
  uint64_t o = 0;
  for (uint64_t x : w) o |= x;
  return o != 0;
#endif
}

// Sets every bit below the highest set bit of each lane (0 stays 0): bit k
// of the result is set iff the lane's value is >= 2**k.
PEAT_INLINE vu32 Smear(vu32 x) {
#if PEAT_SIG_ISA == 512
  __m512i v;
  std::memcpy(&v, &x, sizeof(v));
  // maskz forms: the plain ones read an undefined vector (GCC warns).
  v = _mm512_maskz_srlv_epi32(0xFFFF, _mm512_set1_epi32(-1),
                              _mm512_maskz_lzcnt_epi32(0xFFFF, v));
  std::memcpy(&x, &v, sizeof(v));
  return x;
#else
  x |= x >> 1;
  x |= x >> 2;
  x |= x >> 4;
  x |= x >> 8;
  return x | (x >> 16);
#endif
}
PEAT_INLINE vu64 Smear(vu64 x) {
#if PEAT_SIG_ISA == 512
  __m512i v;
  std::memcpy(&v, &x, sizeof(v));
  v = _mm512_maskz_srlv_epi64(0xFF, _mm512_set1_epi64(-1),
                              _mm512_maskz_lzcnt_epi64(0xFF, v));
  std::memcpy(&x, &v, sizeof(v));
  return x;
#else
  x |= x >> 1;
  x |= x >> 2;
  x |= x >> 4;
  x |= x >> 8;
  x |= x >> 16;
  return x | (x >> 32);
#endif
}

// The 32-bit mixing function of _hash32 in _analyzer.py, on 32-bit values
// held in 32- or 64-bit lanes (wrapping modulo 2**32).
template <class VU>
PEAT_INLINE VU Hash32(VU u, uint32_t mul, uint32_t add) {
  constexpr uint32_t kLow = 0xFFFFFFFFu;
  VU h = (u * mul + add) & kLow;
  h ^= h >> 15;
  h = (h * 0x2C1B3C6Du) & kLow;
  h ^= h >> 12;
  return h;
}

// One round of multiply-xorshift (_mix32 in _analyzer.py): the multiset
// hash's mixing function, on 32-bit values in 32- or 64-bit lanes.
template <class VU>
PEAT_INLINE VU Mix32(VU u) {
  VU h = ((u ^ (u >> 16)) * 0x45D9F3Bu) & 0xFFFFFFFFu;
  return h ^ (h >> 16);
}

// --------------------------------------------------- per-bit counting

// Per-bit-position counts of a stream of words (lanes x bits), exact:
// Harley-Seal carry-save adders over groups of 16 vectors, the carries out
// ("sixteens") added into kPlanes bit planes, the planes read out before
// they can overflow and at the end.
template <class VU, int kWords>
struct BitCounter {
  static constexpr int kPlanes = 8;
  static constexpr int kLanes = sizeof(VU) / sizeof(VU{}[0]);
  static constexpr int kBitsPerLane = 8 * sizeof(VU{}[0]);
  VU buf[16][kWords];
  VU ones[kWords], twos[kWords], fours[kWords], eights[kWords];
  VU planes[kPlanes][kWords];
  int nbuf = 0;
  int ngroups = 0;
  int64_t counts[kWords][64];

  BitCounter() {
    for (int w = 0; w < kWords; ++w) {
      ones[w] = twos[w] = fours[w] = eights[w] = VU{};
      for (int p = 0; p < kPlanes; ++p) planes[p][w] = VU{};
      for (int b = 0; b < 64; ++b) counts[w][b] = 0;
    }
  }

  PEAT_MINLINE void Csa(VU& h, VU& l, VU a, VU b, VU c) {
    VU u = a ^ b;
    h = (a & b) | (u & c);
    l = u ^ c;
  }

  PEAT_MINLINE void Push(const VU* words) {
    for (int w = 0; w < kWords; ++w) buf[nbuf][w] = words[w];
    if (++nbuf == 16) Group(buf);
  }

  // Adds n groups of words (a block): straight from `words` when it is a
  // whole group and none is pending.
  PEAT_MINLINE void PushBlock(const VU (*words)[kWords], int n) {
    if (nbuf == 0 && n == 16) {
      Group(words);
      return;
    }
    for (int i = 0; i < n; ++i) Push(words[i]);
  }

  void Group(const VU (*in)[kWords]) {
    for (int w = 0; w < kWords; ++w) {
      VU twosA, twosB, foursA, foursB, eightsA, eightsB, sixteens;
      VU& o = ones[w];
      VU& t = twos[w];
      VU& f = fours[w];
      VU& e = eights[w];
      Csa(twosA, o, o, in[0][w], in[1][w]);
      Csa(twosB, o, o, in[2][w], in[3][w]);
      Csa(foursA, t, t, twosA, twosB);
      Csa(twosA, o, o, in[4][w], in[5][w]);
      Csa(twosB, o, o, in[6][w], in[7][w]);
      Csa(foursB, t, t, twosA, twosB);
      Csa(eightsA, f, f, foursA, foursB);
      Csa(twosA, o, o, in[8][w], in[9][w]);
      Csa(twosB, o, o, in[10][w], in[11][w]);
      Csa(foursA, t, t, twosA, twosB);
      Csa(twosA, o, o, in[12][w], in[13][w]);
      Csa(twosB, o, o, in[14][w], in[15][w]);
      Csa(foursB, t, t, twosA, twosB);
      Csa(eightsB, f, f, foursA, foursB);
      Csa(sixteens, e, e, eightsA, eightsB);
      VU carry = sixteens;
      for (int p = 0; p < kPlanes; ++p) {
        VU c2 = planes[p][w] & carry;
        planes[p][w] ^= carry;
        carry = c2;
      }
    }
    nbuf = 0;
    if (++ngroups == (1 << kPlanes) - 1) ReadPlanes();
  }

  void AddPlane(int w, VU v, int64_t weight) {
    for (int lane = 0; lane < kLanes; ++lane) {
      auto x = v[lane];
      while (x) {
        int b = __builtin_ctzll(static_cast<unsigned long long>(x));
        counts[w][b] += weight;
        x &= x - 1;
      }
    }
  }

  void ReadPlanes() {
    for (int w = 0; w < kWords; ++w) {
      for (int p = 0; p < kPlanes; ++p) {
        AddPlane(w, planes[p][w], int64_t{16} << p);
        planes[p][w] = VU{};
      }
    }
    ngroups = 0;
  }

  // Flushes everything into `counts` (call once, at the end).
  void Finish() {
    while (nbuf != 0) {
      for (int w = 0; w < kWords; ++w) buf[nbuf][w] = VU{};
      if (++nbuf == 16) Group(buf);
    }
    ReadPlanes();
    for (int w = 0; w < kWords; ++w) {
      AddPlane(w, ones[w], 1);
      AddPlane(w, twos[w], 2);
      AddPlane(w, fours[w], 4);
      AddPlane(w, eights[w], 8);
    }
  }
};

// Horizontal reductions (fixed lane order).
template <class V>
PEAT_INLINE double HSum(V v) {
  double s = 0;
  for (int i = 0; i < static_cast<int>(sizeof(V) / sizeof(v[0])); ++i) {
    s += static_cast<double>(v[i]);
  }
  return s;
}
template <class V>
PEAT_INLINE double HMax(V v) {
  double m = static_cast<double>(v[0]);
  for (int i = 1; i < static_cast<int>(sizeof(V) / sizeof(v[0])); ++i) {
    m = std::max(m, static_cast<double>(v[i]));
  }
  return m;
}
template <class V>
PEAT_INLINE double HMin(V v) {
  double m = static_cast<double>(v[0]);
  for (int i = 1; i < static_cast<int>(sizeof(V) / sizeof(v[0])); ++i) {
    m = std::min(m, static_cast<double>(v[i]));
  }
  return m;
}
template <class V>
PEAT_INLINE int64_t HSumInt(V v) {
  int64_t s = 0;
  for (int i = 0; i < static_cast<int>(sizeof(V) / sizeof(v[0])); ++i) {
    s += static_cast<int64_t>(v[i]);
  }
  return s;
}

// ------------------------------------------------------------ the pass

// A sum of squares of values x >= 0 (finite), with their maximum, reduced
// to the scaled form (max m, sum((x / m)^2)).
//   AddFast: the fast path's values (2**-40 <= |t|, |g| < 448), whose
//     squares are normal and whose float lane sums over kFlushEvery
//     vectors cannot overflow: one fused multiply-add per vector.
//   AddGeneral: any finite value: float records sum the squares in double
//     (no float32 square can overflow there); double records keep the
//     scaled form per lane, updated online with divisions (a reciprocal of
//     a maximum above 2**1022 would be flushed to zero).
template <class VF>
struct SsqAcc {
  static constexpr bool kFloat = sizeof(VF{}[0]) == 4;
  VF max, fast;
  vf64 plo, phi;  // double sums of squares (float: low and high lanes)
  VF gm, gs;      // double records, general path: scaled form per lane

  PEAT_MINLINE void Reset() {
    max = fast = gm = gs = VF{};
    plo = phi = vf64{};
  }
  // Adds a block's fast-path squares (sum of x * x) and maximum.
  PEAT_MINLINE void AddFastSums(VF mx, VF sq) {
    max = Max(max, mx);
    fast += sq;
  }
  PEAT_MINLINE void Flush() {
    if constexpr (kFloat) {
      vf32h lo = LowHalf(fast);
      vf32h hi =
          HighHalf(fast);
      plo += __builtin_convertvector(lo, vf64);
      phi += __builtin_convertvector(hi, vf64);
    } else {
      plo += fast;
    }
    fast = VF{};
  }
  PEAT_MINLINE void AddGeneral(VF x) {
    max = Max(max, x);
    if constexpr (kFloat) {
      vf32h lo = LowHalf(x);
      vf32h hi = HighHalf(x);
      vf64 dl = __builtin_convertvector(lo, vf64);
      vf64 dh = __builtin_convertvector(hi, vf64);
      plo += dl * dl;
      phi += dh * dh;
    } else {
      VF m2 = Max(gm, x);
      VF safe = m2 > 0 ? m2 : Splat<VF>(1);
      VF q = gm / safe;
      VF y = x / safe;
      gs = gs * q * q + y * y;
      gm = m2;
    }
  }
  // (max, sum((x / max)^2)) over every lane; call after Flush().
  void Reduce(double* out_m, double* out_s) const {
    double m = 0, plain = 0;
    for (int i = 0; i < static_cast<int>(sizeof(VF) / sizeof(max[0])); ++i) {
      m = std::max(m, static_cast<double>(max[i]));
    }
    for (int i = 0; i < kLanes64; ++i) plain += plo[i];
    if constexpr (kFloat) {
      for (int i = 0; i < kLanes64; ++i) plain += phi[i];
    }
    double s = m > 0 ? plain / m / m : 0.0;
    if constexpr (!kFloat) {
      for (int i = 0; i < kLanes64; ++i) {
        double mm = m;
        MergeScaled(mm, s, gm[i], gs[i]);
      }
    }
    *out_m = m;
    *out_s = s;
  }
};

template <class Tr>
struct UnitPass {
  using F = typename Tr::F;
  using U = typename Tr::U;
  using VF = typename Tr::VF;
  using VU = typename Tr::VU;
  using VI = typename Tr::VI;
  using VS = typename Tr::VI;
  using S = typename Tr::S;
  using C = Consts<Tr>;
  static constexpr int W = Tr::W;
  // Vectors per block of the fast path.
  static constexpr int kBlock = 16;
  // Float records: double sums (float lanes are moved into them).
  static constexpr bool kWideSsq = sizeof(F) == 4;
  // Float lane sums are moved to double after kFlushEvery vectors at most
  // (checked after each block, so up to kFlushEvery + kBlock - 1).
  static constexpr int kFlushEvery = 240;

  // Per-lane accumulators.
  VI flag[kNumFlags];
  VI refc[kNumRefCounts];
  VU hash[4];
  VF sum[kNumSums];
  vf64 dsum[kNumSums];
  SsqAcc<VF> ssq[kNumSsq];
  VF rmin, rmax, zmax;
  // Row accumulators.
  VI row_nd;
  VF row_sum;
  SsqAcc<VF> row_ssq;
  int since_flush = 0;
  BitCounter<VU, 3> bits;
  // Sampled statistics.
  int32_t hist_abs[kHistBuckets] = {};
  int32_t hist_rel[kHistBuckets] = {};
  int64_t sample_counts[kSampleCounts] = {};

  F fmax, tiny, big;
  bool ref;

  explicit UnitPass(bool with_ref) : ref(with_ref) {
    for (auto& v : flag) v = VI{};
    for (auto& v : refc) v = VI{};
    for (auto& v : hash) v = VU{};
    for (int k = 0; k < kNumSums; ++k) {
      sum[k] = VF{};
      dsum[k] = vf64{};
    }
    for (int k = 0; k < kNumSsq; ++k) ssq[k].Reset();
    rmin = Splat<VF>(INFINITY);
    rmax = Splat<VF>(-INFINITY);
    zmax = VF{};
    fmax = Tr::Value(VU{} + C::kMaxBits)[0];
    tiny = Tr::Value(VU{} + C::kMinNorm)[0];
    big = std::numeric_limits<F>::max();
    ResetRow();
  }

  PEAT_MINLINE void ResetRow() {
    row_nd = VI{};
    row_sum = VF{};
    row_ssq.Reset();
  }

  PEAT_MINLINE void Count(int k, VI mask) { flag[k] -= mask; }

  // Adds to a plain sum in double directly (general path: its terms may be
  // huge, where float lanes could overflow).
  PEAT_MINLINE void AddD(int k, VF x) {
    if constexpr (kWideSsq) {
      vf32h lo = LowHalf(x);
      vf32h hi = HighHalf(x);
      dsum[k] += __builtin_convertvector(lo, vf64) +
                 __builtin_convertvector(hi, vf64);
    } else {
      dsum[k] += x;
    }
  }

  PEAT_MINLINE void FlushSums() {
    for (int k = 0; k < kNumSums; ++k) {
      if constexpr (kWideSsq) {
        VF s = sum[k];
        vf32h lo = LowHalf(s);
        vf32h hi = HighHalf(s);
        dsum[k] += __builtin_convertvector(lo, vf64) +
                   __builtin_convertvector(hi, vf64);
      } else {
        dsum[k] += sum[k];
      }
      sum[k] = VF{};
    }
    for (int k = 0; k < kNumSsq; ++k) ssq[k].Flush();
    row_ssq.Flush();
    since_flush = 0;
  }

  // The three per-bit-counted words of a vector: bits forced up, bits
  // forced down, and the ULP distance smeared (bit k set iff the distance
  // is >= 2**k). The distance between the ordered integers is |mt - mg| for
  // equal signs and mt + mg for opposite ones (+0 and -0 are 0 apart).
  PEAT_MINLINE void Words(VU ut, VU ug, VI sign_differs, VU fp, VU* words) {
    const VU mt = ut & C::kMag, mg = ug & C::kMag;
    const VS diff = (VS)(mt - mg);
    const VU dist = sign_differs ? mt + mg : (VU)(diff < 0 ? -diff : diff);
    words[0] = ut & ~ug;
    words[1] = ug & ~ut;
    words[2] = Smear(dist & fp);
  }

  // Adds the order-free hash terms of a vector (`valid` lanes): the mixed
  // and the plain pattern of t and of g (_element_words's terms).
  PEAT_MINLINE static void Hashes(VU* h, VU ut, VU ug, VU valid) {
    VU wt = ut, wg = ug;
    if constexpr (Tr::kBits == 64) {
      wt = (ut & 0xFFFFFFFFu) ^ Hash32(ut >> 32, 0x27D4EB2Fu, 7u);
      wg = (ug & 0xFFFFFFFFu) ^ Hash32(ug >> 32, 0x27D4EB2Fu, 7u);
    }
    h[0] += Mix32(wt) & valid;
    h[1] += wt & valid;
    h[2] += Mix32(wg) & valid;
    h[3] += wg & valid;
  }

  // Slope sums of y = log2|d| on x = log2|g| over log_ok lanes (general
  // path; the fast path's are in FastLogs).
  PEAT_MINLINE void Slope(VI log_ok, VF ag, VF ad) {
    const VF one = Splat<VF>(1);
    const VF x = log_ok ? Log2(log_ok ? ag : one) : VF{};
    const VF y = log_ok ? Log2(log_ok ? ad : one) : VF{};
    AddD(kSX, x);
    AddD(kSY, y);
    AddD(kSXY, x * y);
    AddD(kSXX, x * x);
    AddD(kSYY, y * y);
  }

  // Noise-floor statistics against the reference hi + lo (out of line: the
  // reference pass is not the fast case).
  PEAT_NOINLINE void Reference(const float* hp, const float* lp, VF tc, VF gc,
                               VI fp, VI valid) {
    const F tiny_ = tiny, big_ = big;
    VF hi, lo;
    VU hb;  // the high part's float32 bit patterns (in F-width lanes)
    if constexpr (sizeof(F) == 4) {
      std::memcpy(&hi, hp, sizeof(hi));
      std::memcpy(&lo, lp, sizeof(lo));
      hb = (VU)hi;
    } else {
      vf32h h8, l8;
      std::memcpy(&h8, hp, sizeof(h8));
      std::memcpy(&l8, lp, sizeof(l8));
      hi = __builtin_convertvector(h8, VF);
      lo = __builtin_convertvector(l8, VF);
      hb = __builtin_convertvector((vu32h)h8, VU);
    }
    const VF inf = Splat<VF>(INFINITY);
    VI ok = fp & (Abs(hi) < inf);
    VF dt = (tc - hi) - lo;
    VF dg = (gc - hi) - lo;
    VF et = ok ? Min(Abs(dt), Splat<VF>(big_)) : VF{};
    VF eg = ok ? Min(Abs(dg), Splat<VF>(big_)) : VF{};
    VF den = Max(Abs(hi), Splat<VF>(tiny_));
    ssq[kQRefT].AddGeneral(et);
    ssq[kQRefG].AddGeneral(eg);
    AddD(kSRefTRel, ok ? Min(et / den, Splat<VF>(big_)) : VF{});
    AddD(kSRefGRel, ok ? Min(eg / den, Splat<VF>(big_)) : VF{});
    refc[kRefN] -= ok & valid;
    refc[kRefTCloser] -= ok & (et < eg);
    refc[kRefGCloser] -= ok & (eg < et);
    // r's sign and zero tests on the high part's bits (exact for a
    // subnormal high part, which comparisons under DAZ would read as 0).
    const VI r_nonzero = (VI)((hb & 0x7FFFFFFFu) != 0);
    const VI pos = r_nonzero & (VI)((hb & 0x80000000u) == 0);
    const VI nz = ok & r_nonzero;
    VI mt = nz & (dt != 0);
    refc[kRefTShrunk] -= mt & ((dt < 0) == pos);
    refc[kRefTGrown] -= mt & ((dt > 0) == pos);
    VI mg = nz & (dg != 0);
    refc[kRefGShrunk] -= mg & ((dg < 0) == pos);
    refc[kRefGGrown] -= mg & ((dg > 0) == pos);
  }

  // Lanes outside the fast path's range: |x| < 2**-40 (or the smallest
  // normal number for float16), |x| >= 448, Inf or NaN, in t or g. Where
  // no lane is: no NaN, Inf, zero, subnormal, saturation or overflow can
  // occur; t / g, a nonzero |t - g| (a multiple of 2**-63) and rel =
  // |t - g| / |g| (in [2**-25, 2**50] when nonzero) are normal, and so are
  // their squares; float lane sums over kFlushEvery + kBlock vectors stay
  // below 2**109.
  PEAT_MINLINE VU NotFast(VU ut, VU ug) const {
    const U lo = C::kFastLo, span = C::k448 - C::kFastLo;
    return (VU)((((ut & C::kMag) - lo) >= span) |
                (((ug & C::kMag) - lo) >= span));
  }

  // Fast-path accumulators of one block: a local object, so that they can
  // stay in registers (the unit's accumulators are in memory).
  struct FastAcc {
    VI beq, sign, pos, neg, magl, mags, logok;
    VU hash[4];
    VF err, mag, rel, lr, sx, sy, sxy, sxx, syy, row_sum;
    VF sq_rel, sq_g, sq_ad, mx_rel, mx_g, mx_ad, rmin, rmax;
  };

  PEAT_MINLINE void Zero(FastAcc& a) const {
    a.beq = a.sign = a.pos = a.neg = a.magl = a.mags = a.logok = VI{};
    a.hash[0] = a.hash[1] = a.hash[2] = a.hash[3] = VU{};
    a.err = a.mag = a.rel = a.lr = a.sx = a.sy = a.sxy = a.sxx = a.syy =
        a.row_sum = VF{};
    a.sq_rel = a.sq_g = a.sq_ad = a.mx_rel = a.mx_g = a.mx_ad = VF{};
    a.rmin = Splat<VF>(INFINITY);
    a.rmax = Splat<VF>(-INFINITY);
  }

  // acc + 1 in the lanes of `mask` (a masked add where the ISA has one).
  PEAT_MINLINE static VI Inc(VI acc, VI mask) {
    return mask ? acc + 1 : acc;
  }

  // The fast path's bit statistics of one vector (all lanes valid; integer
  // arithmetic only, so it may run before the block is known to be fast:
  // the words go to `words` and are counted only then).
  PEAT_MINLINE void FastBits(FastAcc& a, VU ut, VU ug, VU* words) {
    a.beq = Inc(a.beq, (VI)(ut == ug));
    const VI sign_differs = (VI)((ut ^ ug) & C::kSign) != 0;
    a.sign = Inc(a.sign, sign_differs);
    Words(ut, ug, sign_differs, ~VU{}, words);
    Hashes(a.hash, ut, ug, ~VU{});
  }

  // The fast path's float statistics of one vector (all lanes valid), in
  // two passes over a block so that each pass's accumulators fit in
  // registers. FastLogs: q = d / g (kept in *q_out for FastFloats), t / g,
  // and every logarithm.
  PEAT_MINLINE void FastLogs(FastAcc& a, VU ut, VU ug, VF* q_out) {
    const VF tc = Tr::Value(ut), gc = Tr::Value(ug);
    const VF d = tc - gc;
    const VF ad = Abs(d), ag = Abs(gc);
    const VI log_ok = d != 0;
    // One division: d / g and t / g from 1 / g (within ~1 ulp of the
    // quotients).
    const VF inv = Splat<VF>(1) / gc;
    const VF q = d * inv;
    *q_out = q;
    // t / g as 1 + q while |q| < 1/2: then it is the correctly rounded
    // quotient but for q within ~1e-13 of a rounding tie, and exactly 1 for
    // t == g; beyond, t * (1 / g) (within ~1 ulp).
    const VF ratio = Abs(q) < F(0.5) ? F(1) + q : tc * inv;
    a.rmin = Min(a.rmin, ratio);
    a.rmax = Max(a.rmax, ratio);
    // log2|t| - log2|g| = log2|t / g| = log2(1 + q): a short log1p series
    // when every |q| < 2**-7 (error below 2**-30 relative), else log2|t / g|
    // (normal: 2**-49 < |t / g| < 2**49).
    if (!AnyNonzero(Abs(q) >= F(1.0 / 128))) {
      constexpr F c1 = F(1.4426950408889634), c2 = F(-0.7213475204444817),
                  c3 = F(0.48089834696298783), c4 = F(-0.36067376022224085);
      a.lr += q * (c1 + q * (c2 + q * (c3 + q * c4)));
    } else {
      a.lr += Log2Pos(Abs(ratio));
    }
    // Slope sums over log_ok lanes (Log2Pos of a zero |d| is finite and
    // masked out).
    const VF x = Log2Pos(ag);
    const VF y = log_ok ? Log2Pos(ad) : VF{};
    a.sx = log_ok ? a.sx + x : a.sx;
    a.sy += y;
    a.sxy += x * y;
    a.sxx = log_ok ? a.sxx + x * x : a.sxx;
    a.syy += y * y;
  }

  // FastFloats: counts, error sums, squares, rows and columns.
  PEAT_MINLINE void FastFloats(FastAcc& a, VU ut, VU ug, VF q, F* col_ad,
                               int32_t* col_nd8) {
    const VF tc = Tr::Value(ut), gc = Tr::Value(ug);
    const VF d = tc - gc;
    const VF ad = Abs(d);
    const VF at = Abs(tc), ag = Abs(gc);
    const VI pos = d > 0, neg = d < 0;
    a.pos = Inc(a.pos, pos);
    a.neg = Inc(a.neg, neg);
    a.magl = Inc(a.magl, at > ag);
    a.mags = Inc(a.mags, at < ag);
    a.logok = Inc(a.logok, pos | neg);
    // q = d / g is sign(g) * sign(d) * rel (the magnitude-bias term);
    // |q| = rel <= 2**50 needs no clamp here.
    const VF rel = Abs(q);
    a.err += d;
    a.mag += q;
    a.rel += rel;
    a.mx_rel = Max(a.mx_rel, rel);
    a.sq_rel += rel * rel;
    a.mx_g = Max(a.mx_g, ag);
    a.sq_g += ag * ag;
    a.row_sum += ad;
    a.mx_ad = Max(a.mx_ad, ad);
    a.sq_ad += ad * ad;
    Column(col_ad, col_nd8, ad, (VI)(ut != ug));
  }

  // Adds a block's fast-path accumulators to the unit's.
  PEAT_MINLINE void Merge(const FastAcc& a, int nvec) {
    flag[kBitEqual] += a.beq;
    flag[kValueEqual] += a.beq;
    flag[kSignFlip] += a.sign;
    flag[kPosErr] += a.pos;
    flag[kNegErr] += a.neg;
    flag[kMagLarger] += a.magl;
    flag[kMagSmaller] += a.mags;
    flag[kLogOk] += a.logok;
    // Finite pairs and ratio_ok hold in every lane of a fast vector.
    flag[kFinitePair] += Splat<VI>(nvec);
    flag[kRatioOk] += Splat<VI>(nvec);
    for (int k = 0; k < 4; ++k) hash[k] += a.hash[k];
    sum[kSErr] += a.err;
    sum[kSMag] += a.mag;
    sum[kSRel] += a.rel;
    sum[kSLr] += a.lr;
    sum[kSX] += a.sx;
    sum[kSY] += a.sy;
    sum[kSXY] += a.sxy;
    sum[kSXX] += a.sxx;
    sum[kSYY] += a.syy;
    ssq[kQRel].AddFastSums(a.mx_rel, a.sq_rel);
    ssq[kQG].AddFastSums(a.mx_g, a.sq_g);
    row_ssq.AddFastSums(a.mx_ad, a.sq_ad);
    row_sum += a.row_sum;
    rmin = Min(rmin, a.rmin);
    rmax = Max(rmax, a.rmax);
    row_nd += Splat<VI>(nvec) - a.beq;  // elements not bit-equal, per lane
    since_flush += nvec;
    if (since_flush >= kFlushEvery) FlushSums();
  }

  // Percentile buckets of non-negative values: their float32 bit patterns
  // >> 21 (float64 values are rounded to float32 first).
  static PEAT_MINLINE void HistIndex(vf32 v, int32_t* out) {
    const vu32 b = (vu32)v >> 21;
    for (int i = 0; i < kLanes32; ++i) out[i] = static_cast<int32_t>(b[i]);
  }
  static PEAT_MINLINE void HistIndex(vf64 v, int32_t* out) {
    const vu32h b = (vu32h)__builtin_convertvector(v, vf32h) >> 21;
    for (int i = 0; i < kLanes64; ++i) out[i] = static_cast<int32_t>(b[i]);
  }

  // Sampled elements waiting for a full vector (AddSample / FlushSamples),
  // and per-lane counts of the flushed ones representable in each narrow
  // format (added into sample_counts by FinishSamples).
  S sample_t[W], sample_g[W];
  int n_samples = 0;
  VU repr_t[kNarrow] = {}, repr_g[kNarrow] = {};

  PEAT_MINLINE void AddSample(S tb, S gb) {
    sample_t[n_samples] = tb;
    sample_g[n_samples] = gb;
    if (++n_samples == W) FlushSamples();
  }

  // The waiting sampled elements, one vector at a time (formulas of
  // _sampled_stats in _analyzer.py); lanes past n_samples are ignored.
  PEAT_NOINLINE void FlushSamples() {
    const int k = n_samples;
    if (k == 0) return;
    for (int i = k; i < W; ++i) sample_t[i] = sample_g[i] = 0;
    n_samples = 0;
    const VU ut = Tr::Load(sample_t), ug = Tr::Load(sample_g);
    const VF tc = Tr::Value(ut), gc = Tr::Value(ug);
    const VI fin = ((ut & C::kMag) < C::kInf) & ((ug & C::kMag) < C::kInf);
    const VF ad = Min(Abs(tc - gc), Splat<VF>(big));
    const VF rel = Min(ad / Max(Abs(gc), Splat<VF>(tiny)), Splat<VF>(big));
    int32_t ia[W], ir[W];
    HistIndex(ad, ia);
    HistIndex(rel, ir);
    for (int i = 0; i < k; ++i) {
      if (fin[i]) {
        ++hist_abs[ia[i]];
        ++hist_rel[ir[i]];
        ++sample_counts[0];
      }
    }
    sample_counts[1] += k;
    VU valid = VU{};
    for (int i = 0; i < k; ++i) valid[i] = ~U(0);
    const VU rt = RepresentableMask(ut & C::kMag) & valid;
    const VU rg = RepresentableMask(ug & C::kMag) & valid;
    for (int f = 0; f < kNarrow; ++f) {
      repr_t[f] += (rt >> f) & 1;
      repr_g[f] += (rg >> f) & 1;
    }
  }

  // Flushes the waiting samples and adds the representability counts into
  // sample_counts (once, at the end of the unit).
  void FinishSamples() {
    FlushSamples();
    for (int f = 0; f < kNarrow; ++f) {
      for (int i = 0; i < W; ++i) {
        sample_counts[2 + f] += static_cast<int64_t>(repr_t[f][i]);
        sample_counts[2 + kNarrow + f] += static_cast<int64_t>(repr_g[f][i]);
      }
    }
  }

  // Index of the highest set bit of each lane (lanes >= 1 and below 2^24,
  // resp. 2^53: exact in the lane's float type, whose exponent is read).
  static PEAT_MINLINE vi32 HighBit(vu32 x) {
    const vf32 f = __builtin_convertvector((vi32)x, vf32);
    return (vi32)(((vu32)f >> 23) & 0xFFu) - 127;
  }
  static PEAT_MINLINE vi64 HighBit(vu64 x) {
    const vf64 f = __builtin_convertvector((vi64)x, vf64);
    return (vi64)(((vu64)f >> 52) & 0x7FFu) - 1023;
  }

  // Representability of every lane's value, from its magnitude bits (sign
  // cleared): bit f is set when the value is exactly representable in
  // kNarrowFormats[f] (signature.h): finite and +-0, or with the lowest set
  // bit of its significand at or above f's resolution there (its highest
  // set bit minus f.mant, never below f's smallest subnormal) and at most
  // f's maximum. Integer arithmetic only; the rule of _representable in
  // _analyzer.py (tests/test_analyzer_native.py checks them equal).
  static PEAT_MINLINE VU RepresentableMask(VU mag) {
    constexpr int kM = Tr::kMant, kB = static_cast<int>(C::kBias);
    const VU expf = mag >> kM;
    const VU man = mag & ((U(1) << kM) - 1);
    const VU sig = expf != 0 ? (man | (U(1) << kM)) : man;
    const VI q = (VI)(expf != 0 ? expf : Splat<VU>(1)) - (kB + kM);
    const VI low = q + HighBit(sig & -sig);  // lowest set bit
    const VI high = q + HighBit(sig);
    const VI top_bit = high - q;  // highest set bit of sig, 0..kM
    VU out = VU{};
    for (int i = 0; i < kNarrow; ++i) {
      const NarrowFormat& f = kNarrowFormats[i];
      const VI floor_res = Splat<VI>(f.emin - f.mant);
      const VI res = high - f.mant > floor_res ? high - f.mant : floor_res;
      const VI shift = top_bit - f.mant;  // -f.mant .. kM
      const VU right = (VU)(shift > 0 ? shift : VI{});
      const VU left = (VU)(shift < 0 ? -shift : VI{});
      const VU top = shift >= 0 ? sig >> right : sig << left;
      const VI at_emax = (VI)(top <= U(f.max_top));
      const VI ok = low < res ? VI{}
                              : (high != f.emax ? (VI)(high < f.emax) : at_emax);
      out |= (VU)(ok & 1) << i;
    }
    out = mag >= C::kInf ? VU{} : out;
    return mag == 0 ? Splat<VU>((U(1) << kNarrow) - 1) : out;
  }

  // The sampled elements among flat indices [a, b) (_sample_index).
  void Samples(const S* tp, const S* gp, int64_t a, int64_t b, int64_t w) {
    if (w == 0) {
      for (int64_t i = a; i < b; ++i) AddSample(tp[i], gp[i]);
      return;
    }
    const int64_t k0 = std::max<int64_t>(0, (a - (w - 1)) / w);
    const int64_t k1 = std::min<int64_t>(kPctSample, (b - 1) / w + 1);
    for (int64_t k = k0; k < k1; ++k) {
      const uint32_t h = Hash32(static_cast<uint32_t>(k), 0x9E3779B1u,
                                0x7F4A7C15u);
      const int64_t i = k * w + static_cast<int64_t>(h % w);
      if (i >= a && i < b) AddSample(tp[i], gp[i]);
    }
  }

  // Up to kBlock full vectors of a row at t, g (columns from col_ad,
  // col_nd8; reference at hp, lp or nullptr): the fast path when every
  // lane of the block allows it, else the general path for each vector.
  PEAT_MINLINE void Block(const S* tp, const S* gp, const float* hp,
                          const float* lp, F* col_ad, int32_t* col_nd8,
                          int nvec) {
    // Software prefetch 4 KiB ahead (the rest of the row, or the next row):
    // measured ~10% faster than the hardware prefetchers alone.
    constexpr int kAhead = 4096;
    for (int v = 0; v < nvec; ++v) {
      __builtin_prefetch(reinterpret_cast<const char*>(tp + v * W) + kAhead);
      __builtin_prefetch(reinterpret_cast<const char*>(gp + v * W) + kAhead);
    }
    // The range check and the bit statistics in one pass; the block's
    // fast-path results are kept only if every lane is in range.
    FastAcc a;
    Zero(a);
    VU words[kBlock][3];
    VU bad = VU{};
    for (int v = 0; v < nvec; ++v) {
      const VU ut = Tr::Load(tp + v * W), ug = Tr::Load(gp + v * W);
      bad |= NotFast(ut, ug);
      FastBits(a, ut, ug, words[v]);
    }
    if (AnyNonzero(bad)) {
      for (int v = 0; v < nvec; ++v) {
        const VU ut = Tr::Load(tp + v * W), ug = Tr::Load(gp + v * W);
        General(ut, ug, Tr::Value(ut), Tr::Value(ug),
                hp ? hp + v * W : nullptr, lp ? lp + v * W : nullptr,
                col_ad + v * W, col_nd8 + v * W, Splat<VI>(-1));
      }
      return;
    }
    bits.PushBlock(words, nvec);
    VF q[kBlock];
    for (int v = 0; v < nvec; ++v) {
      FastLogs(a, Tr::Load(tp + v * W), Tr::Load(gp + v * W), &q[v]);
    }
    for (int v = 0; v < nvec; ++v) {
      FastFloats(a, Tr::Load(tp + v * W), Tr::Load(gp + v * W), q[v],
                 col_ad + v * W, col_nd8 + v * W);
    }
    if (hp) {
      for (int v = 0; v < nvec; ++v) {
        const VU ut = Tr::Load(tp + v * W), ug = Tr::Load(gp + v * W);
        Reference(hp + v * W, lp + v * W, Tr::Value(ut), Tr::Value(ug),
                  Splat<VI>(-1), Splat<VI>(-1));
      }
    }
    Merge(a, nvec);
  }

  PEAT_MINLINE void Column(F* col_ad, int32_t* col_nd8, VF ad, VI differ) {
    if constexpr (sizeof(F) == 4) {
      VF c;
      std::memcpy(&c, col_ad, sizeof(c));
      c += ad;
      std::memcpy(col_ad, &c, sizeof(c));
      vi32 k;
      std::memcpy(&k, col_nd8, sizeof(k));
      k -= differ;
      std::memcpy(col_nd8, &k, sizeof(k));
    } else {
      // Double lanes: col_ad holds doubles (8 per vector), counts int32.
      VF c;
      std::memcpy(&c, col_ad, sizeof(c));
      c += ad;
      std::memcpy(col_ad, &c, sizeof(c));
      for (int i = 0; i < W; ++i) col_nd8[i] -= static_cast<int32_t>(differ[i]);
    }
  }

  // The general path: every condition, `valid` masks padding lanes (their
  // t and g are +0, which contributes nothing but to the masked counts).
  PEAT_NOINLINE void General(VU ut, VU ug, VF tc, VF gc, const float* hp,
                             const float* lp, F* col_ad, int32_t* col_nd8,
                             VI valid) {
    VU mt = ut & C::kMag, mg = ug & C::kMag;
    VI t0 = (VI)(mt == 0), g0 = (VI)(mg == 0);
    VI fin_t = (VI)(mt < C::kInf), fin_g = (VI)(mg < C::kInf);
    VI nan_t = (VI)(mt > C::kInf), nan_g = (VI)(mg > C::kInf);
    VI inf_t = (VI)(mt == C::kInf), inf_g = (VI)(mg == C::kInf);
    VI fp = fin_t & fin_g;
    VU gexp = mg >> C::kMant;
    VI gsub = (VI)(gexp == 0) & ~g0;
    VI gnorm = fin_g & (VI)(gexp != 0);
    VI beq = (VI)(ut == ug);
    VF d = fp ? tc - gc : VF{};
    VF at = Abs(tc), ag = Abs(gc);
    const VF fmaxv = Splat<VF>(fmax);
    Count(kBitEqual, beq & valid);
    Count(kValueEqual, ((beq & ~nan_t) | (t0 & g0)) & valid);
    Count(kNanT, nan_t);
    Count(kNanG, nan_g);
    Count(kInfT, inf_t);
    Count(kInfG, inf_g);
    Count(kFinitePair, fp & valid);
    Count(kNonfiniteNew, fin_g & ~fin_t);
    Count(kZeroed, fin_g & ~g0 & t0);
    Count(kFlushed, gsub & t0);
    Count(kSaturated, fin_g & (ag < fmaxv) & (inf_t | (at == fmaxv)));
    const VF f16max = Splat<VF>(F(65504)), e4max = Splat<VF>(F(448));
    Count(kSatFp16, fp & (at == f16max) & (ag > f16max));
    Count(kSatE4m3, fp & (at == e4max) & (ag > e4max));
    Count(kGoldenSubnormal, gsub);
    VI pos = d > 0, neg = d < 0;
    Count(kPosErr, pos);
    Count(kNegErr, neg);
    Count(kMagLarger, fp & (at > ag));
    Count(kMagSmaller, fp & (at < ag));
    const VI sign_differs = (VI)((ut ^ ug) & C::kSign) != 0;
    Count(kSignFlip, fp & ~t0 & ~g0 & sign_differs);
    VI ratio_ok = fp & gnorm & ~t0;
    Count(kRatioOk, ratio_ok);
    VI log_ok = fp & (d != 0) & ~g0;
    Count(kLogOk, log_ok);
    Count(kGoldenZero, g0 & valid);
    Count(kOverflow, fin_g & inf_t & (ag > e4max));
    // Floats.
    VF ad = Min(Abs(d), Splat<VF>(big));
    VF rel = fp ? Min(ad / Max(ag, Splat<VF>(tiny)), Splat<VF>(big)) : VF{};
    VF sd = d > 0 ? Splat<VF>(1) : (d < 0 ? Splat<VF>(-1) : VF{});
    AddD(kSErr, d);
    AddD(kSMag, (gc < 0 ? -rel : rel) * sd);
    AddD(kSRel, rel);
    ssq[kQRel].AddGeneral(rel);
    VF gv = fp ? ag : VF{};
    ssq[kQG].AddGeneral(gv);
    const VF one = Splat<VF>(1);
    VF ratio = ratio_ok ? tc / (ratio_ok ? gc : one) : VF{};
    rmin = Min(rmin, ratio_ok ? ratio : Splat<VF>(INFINITY));
    rmax = Max(rmax, ratio_ok ? ratio : Splat<VF>(-INFINITY));
    AddD(kSLr, ratio_ok ? Log2(ratio_ok ? at : one) - Log2(ratio_ok ? ag : one)
                        : VF{});
    Slope(log_ok, ag, ad);
    VU words[3];
    Words(ut, ug, sign_differs, (VU)fp, words);
    bits.Push(words);
    Hashes(hash, ut, ug, (VU)valid);
    // Zeroed elements (those of n_zeroed: t is +-0, g finite and not 0).
    const VI zeroed = fin_g & ~g0 & t0;
    zmax = Max(zmax, zeroed ? ag : VF{});
    // Rows, columns.
    VI differ = ~beq;
    row_nd -= differ;
    row_sum += ad;
    row_ssq.AddGeneral(ad);
    Column(col_ad, col_nd8, ad, differ);
    if (ref) Reference(hp, lp, tc, gc, fp, valid);
  }
};


// Processes unit `u` of the job (one thread; results into the job's partials).
template <class Tr>
void RunUnit(const Job& job, int64_t u) {
  using P = UnitPass<Tr>;
  using S = typename Tr::S;
  using F = typename Tr::F;
  using VU = typename Tr::VU;
  using VI = typename Tr::VI;
  constexpr int W = Tr::W;
  const Plan& pl = job.plan;
  const int64_t stripe = u / pl.n_chunks, chunk = u % pl.n_chunks;
  const int64_t r0 = stripe * pl.row_stripe;
  const int64_t r1 = std::min(pl.rows, r0 + pl.row_stripe);
  const int64_t c0 = chunk * pl.col_chunk;
  const int64_t c1 = std::min(pl.cols, c0 + pl.col_chunk);
  const int64_t width = c1 - c0;
  const int64_t padded = (width + W - 1) / W * W;
  const int64_t tile_rows = pl.rows / 8, tile_cols = pl.cols / 8;
  const S* tp = static_cast<const S*>(job.t);
  const S* gp = static_cast<const S*>(job.g);

  const bool ref = job.hi != nullptr;
  std::unique_ptr<P> pass(new P(ref));
  P& ps = *pass;
  // Column accumulators of this unit (F values; counts of the current
  // 8-row group).
  std::vector<F> col_ad(padded, F(0));
  std::vector<int32_t> col_nd8(padded, 0);
  std::vector<int64_t> col_nd(width, 0);
  alignas(64) S tpad[W];
  alignas(64) S gpad[W];
  alignas(64) float hpad[kLanes32];
  alignas(64) float lpad[kLanes32];

  for (int64_t r = r0; r < r1; ++r) {
    const S* trow = tp + r * pl.cols;
    const S* grow = gp + r * pl.cols;
    const float* hrow = ref ? job.hi + r * pl.cols : nullptr;
    const float* lrow = ref ? job.lo + r * pl.cols : nullptr;
    int64_t c = c0;
    while (c + W <= c1) {
      const int nvec = static_cast<int>(
          std::min<int64_t>(P::kBlock, (c1 - c) / W));
      ps.Block(trow + c, grow + c, ref ? hrow + c : nullptr,
               ref ? lrow + c : nullptr, col_ad.data() + (c - c0),
               col_nd8.data() + (c - c0), nvec);
      c += int64_t{nvec} * W;
    }
    if (c < c1) {
      const int64_t k = c1 - c;
      std::memset(tpad, 0, sizeof(tpad));
      std::memset(gpad, 0, sizeof(gpad));
      std::memcpy(tpad, trow + c, k * sizeof(S));
      std::memcpy(gpad, grow + c, k * sizeof(S));
      if (ref) {
        std::memset(hpad, 0, sizeof(hpad));
        std::memset(lpad, 0, sizeof(lpad));
        std::memcpy(hpad, hrow + c, k * sizeof(float));
        std::memcpy(lpad, lrow + c, k * sizeof(float));
      }
      VI valid;
      for (int i = 0; i < W; ++i) valid[i] = i < k ? -1 : 0;
      VU ut = Tr::Load(tpad), ug = Tr::Load(gpad);
      ps.General(ut, ug, Tr::Value(ut), Tr::Value(ug), hpad, lpad,
                 col_ad.data() + (c - c0),
                 col_nd8.data() + (c - c0), valid);
    }
    ps.Samples(tp, gp, r * pl.cols + c0, r * pl.cols + c1, pl.sample_w);
    // Row results into the row partials of this chunk.
    const int64_t ri = chunk * pl.rows + r;
    job.row_nd[ri] = HSumInt(ps.row_nd);
    job.row_sum[ri] = HSum(ps.row_sum);
    ps.row_ssq.Flush();
    ps.row_ssq.Reduce(&job.row_max[ri], &job.row_ssq[ri]);
    ps.ResetRow();
    // End of an 8-row group: fold its column counts into tiles and columns.
    if ((r + 1) % 8 == 0 || r + 1 == r1) {
      const bool full = (r + 1) % 8 == 0 && r / 8 < tile_rows;
      for (int64_t j = 0; j < width; ++j) col_nd[j] += col_nd8[j];
      if (full) {
        int32_t* trow_out = job.tile + (r / 8) * tile_cols;
        for (int64_t j = 0; j + 8 <= width; j += 8) {
          const int64_t tc8 = (c0 + j) / 8;
          if (tc8 >= tile_cols) break;
          int32_t s = 0;
          for (int q = 0; q < 8; ++q) s += col_nd8[j + q];
          trow_out[tc8] = s;
        }
      }
      std::fill(col_nd8.begin(), col_nd8.end(), 0);
    }
  }
  ps.FlushSums();
  ps.bits.Finish();

  // Unit results.
  UnitOut& o = job.units[u];
  for (int k = 0; k < kFlagSlots; ++k) {
    o.flags[k] = k < kNumFlags ? HSumInt(ps.flag[k]) : 0;
  }
  for (int w = 0; w < 3; ++w) {
    for (int b = 0; b < 64; ++b) o.bits[w][b] = ps.bits.counts[w][b];
  }
  for (int k = 0; k < kNumRefCounts; ++k) o.ref[k] = HSumInt(ps.refc[k]);
  for (int k = 0; k < 4; ++k) {
    uint32_t h = 0;
    for (int i = 0; i < W; ++i) h += static_cast<uint32_t>(ps.hash[k][i]);
    o.hash[k] = h;
  }
  for (int k = 0; k < kNumSums; ++k) o.sum[k] = HSum(ps.dsum[k]);
  for (int k = 0; k < kNumSsq; ++k) ps.ssq[k].Reduce(&o.ssq_max[k], &o.ssq_s[k]);
  ps.FinishSamples();
  std::memcpy(o.hist_abs, ps.hist_abs, sizeof(o.hist_abs));
  std::memcpy(o.hist_rel, ps.hist_rel, sizeof(o.hist_rel));
  std::memcpy(o.sample_counts, ps.sample_counts, sizeof(o.sample_counts));
  o.ratio_min = HMin(ps.rmin);
  o.ratio_max = HMax(ps.rmax);
  o.zeroed_g_max = HMax(ps.zmax);
  // Column partials of this stripe.
  for (int64_t j = 0; j < width; ++j) {
    job.col_nd[stripe * pl.cols + c0 + j] = col_nd[j];
    job.col_sum[stripe * pl.cols + c0 + j] = static_cast<double>(col_ad[j]);
  }
}

// The unit function of each record dtype at this instruction-set level.
inline UnitFn UnitFnFor(int nbits, bool is_bf16) {
  switch (nbits) {
    case 64:
      return &RunUnit<TraitsF64>;
    case 16:
      return is_bf16 ? &RunUnit<TraitsBf16> : &RunUnit<TraitsF16>;
    default:
      return &RunUnit<TraitsF32>;
  }
}

#undef PEAT_SIG_VBYTES
#undef PEAT_INLINE
#undef PEAT_MINLINE
#undef PEAT_NOINLINE
