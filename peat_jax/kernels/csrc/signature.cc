// The Analyzer's statistics pass on CPU (XLA FFI): one read of a
// (test, golden[, reference]) record computes every full-pass statistic of
// peat_jax._analyzer.SignatureState.
//
//   peat_signature(t, g, dims s32[2])
//   peat_signature_ref(t, g, ref_hi f32, ref_lo f32, dims s32[2])
//     the record is (R, C) = dims, the first R * C elements of each buffer
//     (any shape, equal sizes: a record padded to a size bucket), and the
//     row, column and tile outputs are at least R, C and (R / 8) * (C / 8)
//     long, zero beyond
//     -> ints   s32[32 + 3 * nbits + 7]: flag counts (_F_* order), bits_up,
//                                        bits_down, ulp_cum, reference counts
//        hashes u32[4]: order-free hash sums (2 of t, 2 of g)
//        floats c[22]: scalar float statistics (kFloat* order)
//        row_ndiff s32[R], row_abs_max c[R], row_abs_sum c[R], row_abs_sqs c[R]
//        col_ndiff s32[C], col_abs_sum c[C]
//        tile_ndiff s32[(R / 8) * (C / 8)], row-major
//        hist_abs s32[1024], hist_rel s32[1024]: percentile histograms of
//                             the sampled elements
//        sample_counts s32[12]: pct_n, sample_n, repr_t[5], repr_g[5]
//   with t, g float32, bfloat16, float16 or float64 and c the compute dtype
//   (float64 for float64 records, else float32).
//
// Every formula is the one of the pure-JAX pass (peat_jax/_analyzer.py,
// _element_words / _element_floats / _accumulate); docs/signature.md says
// what each statistic means. Float arithmetic and comparisons run under the
// caller's MXCSR (XLA:CPU sets FTZ/DAZ), copied into every worker, so that
// subnormals behave as in the compiled JAX pass.
//
// Speed: the elements are processed a register at a time with GCC vector
// extensions, compiled for AVX-512 (64 bytes: 16 float32 lanes, 8 float64
// lanes), AVX2 (32 bytes) and the baseline (16 bytes) and chosen once by
// CPU ($PEAT_SIGNATURE_ISA=avx512|avx2|base picks a level the CPU runs;
// tests compare them); a vector whose lanes are all
// normal and below 448 in magnitude takes a shorter path that skips the
// conditions that cannot hold there. Exact counts use direct lane counters
// (flags) and Harley-Seal carry-save adders (per-bit counts).
//
// Determinism: the record is cut into units (row stripes x column chunks)
// that depend only on its shape; each unit is reduced by one thread, in
// order, into its own partials; the partials are combined in unit order on
// the calling thread. Threads (XLA's intra-op pool) only decide who computes
// a unit, so results are bitwise identical whatever the thread timing, on
// one machine and level (the levels' lane counts differ, so their float
// sums may differ in the last bits; counts, hashes and histograms do not).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "peat_cpu.h"
#include "peat_parallel.h"
#include "signature.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

// Fused multiply-add in the polynomial and the sums of squares of this file
// (the rest of the library keeps one rounding per operation).
#pragma GCC optimize("fp-contract=fast")
// Vector arguments of the out-of-line helpers stay within one ISA level.
#pragma GCC diagnostic ignored "-Wpsabi"

// The vector code, once per instruction-set level (see signature_body.h).
#if defined(__x86_64__) && defined(__GNUC__)
#define PEAT_SIG_X86 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,fma")
#define PEAT_SIG_ISA 512
namespace peat {
namespace sig {
namespace avx512 {
#include "signature_body.h"
}  // namespace avx512
}  // namespace sig
}  // namespace peat
#undef PEAT_SIG_ISA
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define PEAT_SIG_ISA 2
namespace peat {
namespace sig {
namespace avx2 {
#include "signature_body.h"
}  // namespace avx2
}  // namespace sig
}  // namespace peat
#undef PEAT_SIG_ISA
#pragma GCC pop_options
#endif
#define PEAT_SIG_ISA 0
namespace peat {
namespace sig {
namespace base {
#include "signature_body.h"
}  // namespace base
}  // namespace sig
}  // namespace peat
#undef PEAT_SIG_ISA

namespace peat {
namespace sig {
namespace {

namespace ffi = xla::ffi;

// The instruction-set levels this CPU runs, best first.
std::vector<std::string> SupportedLevels() {
  std::vector<std::string> out;
#ifdef PEAT_SIG_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("fma")) {
    out.push_back("avx512");
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    out.push_back("avx2");
  }
#endif
  out.push_back("base");
  return out;
}

// The unit function of a record dtype at an instruction-set level.
UnitFn UnitFnAt(const std::string& level, int nbits, bool is_bf16) {
#ifdef PEAT_SIG_X86
  if (level == "avx512") return avx512::UnitFnFor(nbits, is_bf16);
  if (level == "avx2") return avx2::UnitFnFor(nbits, is_bf16);
#endif
  return base::UnitFnFor(nbits, is_bf16);
}

// The unit function for a record dtype on this CPU (chosen once per dtype):
// the best level it runs, or the one $PEAT_SIGNATURE_ISA names (avx512,
// avx2 or base; tests compare the levels). nullptr, with *error set, for a
// level that variable names and this CPU does not run.
UnitFn PickUnitFn(int nbits, bool is_bf16, std::string* error) {
  const std::vector<std::string> levels = SupportedLevels();
  const char* env = std::getenv("PEAT_SIGNATURE_ISA");
  if (env == nullptr || *env == '\0') {
    return UnitFnAt(levels.front(), nbits, is_bf16);
  }
  if (std::find(levels.begin(), levels.end(), env) != levels.end()) {
    return UnitFnAt(env, nbits, is_bf16);
  }
  std::string known;
  for (const std::string& l : levels) known += (known.empty() ? "" : ", ") + l;
  *error = std::string("PEAT_SIGNATURE_ISA=") + env +
           " is not an instruction-set level this CPU runs; expected one of " +
           known + " (or unset it: the best level is chosen)";
  return nullptr;
}

// ------------------------------------------------------------- threads

// Runs every unit: on the calling thread and, for large records, on tasks
// of XLA's intra-op pool (peat_parallel.h). Returns once all units are done.
void RunUnits(ffi::ThreadPool& pool, UnitFn fn, const Job& job) {
  const int64_t n = job.plan.rows * job.plan.cols;
  ParallelFor(&pool, job.plan.units(), n >= (int64_t{1} << 16),
              [fn, &job](int64_t u) { fn(job, u); });
}

// ------------------------------------------------------------- handler

int NBits(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32:
      return 32;
    case ffi::DataType::BF16:
    case ffi::DataType::F16:
      return 16;
    case ffi::DataType::F64:
      return 64;
    default:
      return 0;
  }
}

std::string DtypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32:
      return "float32";
    case ffi::DataType::BF16:
      return "bfloat16";
    case ffi::DataType::F16:
      return "float16";
    case ffi::DataType::F64:
      return "float64";
    case ffi::DataType::S32:
      return "int32";
    case ffi::DataType::U32:
      return "uint32";
    default:
      return "dtype code " + std::to_string(static_cast<int>(t));
  }
}

// The outputs, in the handler's order.
enum Out {
  kOutInts = 0, kOutHashes, kOutFloats, kOutRowNd, kOutRowMax, kOutRowSum,
  kOutRowSqs, kOutColNd, kOutColSum, kOutTile, kOutHistAbs, kOutHistRel,
  kOutSampleCounts, kNumOut
};
using Outs = ffi::Result<ffi::AnyBuffer>* [kNumOut];

// Combines the units' partials in unit order and writes the outputs.
template <class F>
void CombineAndStore(const Job& job, int nbits, const Outs& out) {
  const Plan& pl = job.plan;
  const int64_t nu = pl.units();
  int64_t flags[kFlagSlots] = {};
  int64_t bits[3][64] = {};
  int64_t ref[kNumRefCounts] = {};
  int64_t samples[kSampleCounts] = {};
  uint32_t hash[4] = {};
  double sum[kNumSums] = {};
  double sm[kNumSsq] = {}, ss[kNumSsq] = {};
  double rmin = INFINITY, rmax = -INFINITY, zmax = 0;
  int32_t* hist_abs = (*out[kOutHistAbs])->typed_data<int32_t>();
  int32_t* hist_rel = (*out[kOutHistRel])->typed_data<int32_t>();
  std::fill(hist_abs, hist_abs + kHistBuckets, 0);
  std::fill(hist_rel, hist_rel + kHistBuckets, 0);
  for (int64_t u = 0; u < nu; ++u) {
    const UnitOut& o = job.units[u];
    for (int k = 0; k < kFlagSlots; ++k) flags[k] += o.flags[k];
    for (int w = 0; w < 3; ++w) {
      for (int b = 0; b < 64; ++b) bits[w][b] += o.bits[w][b];
    }
    for (int k = 0; k < kNumRefCounts; ++k) ref[k] += o.ref[k];
    for (int k = 0; k < kSampleCounts; ++k) samples[k] += o.sample_counts[k];
    for (int k = 0; k < kHistBuckets; ++k) {
      hist_abs[k] += o.hist_abs[k];
      hist_rel[k] += o.hist_rel[k];
    }
    for (int k = 0; k < 4; ++k) hash[k] += o.hash[k];
    for (int k = 0; k < kNumSums; ++k) sum[k] += o.sum[k];
    for (int k = 0; k < kNumSsq; ++k) {
      MergeScaled(sm[k], ss[k], o.ssq_max[k], o.ssq_s[k]);
    }
    rmin = std::min(rmin, o.ratio_min);
    rmax = std::max(rmax, o.ratio_max);
    zmax = std::max(zmax, o.zeroed_g_max);
  }
  int32_t* ints = (*out[kOutInts])->typed_data<int32_t>();
  for (int k = 0; k < kFlagSlots; ++k) ints[k] = static_cast<int32_t>(flags[k]);
  for (int w = 0; w < 3; ++w) {
    for (int b = 0; b < nbits; ++b) {
      ints[kFlagSlots + w * nbits + b] = static_cast<int32_t>(bits[w][b]);
    }
  }
  for (int k = 0; k < kNumRefCounts; ++k) {
    ints[kFlagSlots + 3 * nbits + k] = static_cast<int32_t>(ref[k]);
  }
  int32_t* sc = (*out[kOutSampleCounts])->typed_data<int32_t>();
  for (int k = 0; k < kSampleCounts; ++k) sc[k] = static_cast<int32_t>(samples[k]);
  uint32_t* hashes = (*out[kOutHashes])->typed_data<uint32_t>();
  for (int k = 0; k < 4; ++k) hashes[k] = hash[k];
  F* fl = (*out[kOutFloats])->typed_data<F>();
  fl[kErrSum] = static_cast<F>(sum[kSErr]);
  fl[kMagErrSum] = static_cast<F>(sum[kSMag]);
  fl[kRelMax] = static_cast<F>(sm[kQRel]);
  fl[kRelSum] = static_cast<F>(sum[kSRel]);
  fl[kRelSqs] = static_cast<F>(ss[kQRel]);
  fl[kGAbsMax] = static_cast<F>(sm[kQG]);
  fl[kGSqs] = static_cast<F>(ss[kQG]);
  fl[kRatioMin] = static_cast<F>(rmin);
  fl[kRatioMax] = static_cast<F>(rmax);
  fl[kLogratioSum] = static_cast<F>(sum[kSLr]);
  fl[kSx] = static_cast<F>(sum[kSX]);
  fl[kSy] = static_cast<F>(sum[kSY]);
  fl[kSxy] = static_cast<F>(sum[kSXY]);
  fl[kSxx] = static_cast<F>(sum[kSXX]);
  fl[kSyy] = static_cast<F>(sum[kSYY]);
  fl[kZeroedGMax] = static_cast<F>(zmax);
  fl[kRefTMax] = static_cast<F>(sm[kQRefT]);
  fl[kRefTSqs] = static_cast<F>(ss[kQRefT]);
  fl[kRefGMax] = static_cast<F>(sm[kQRefG]);
  fl[kRefGSqs] = static_cast<F>(ss[kQRefG]);
  fl[kRefTRelSum] = static_cast<F>(sum[kSRefTRel]);
  fl[kRefGRelSum] = static_cast<F>(sum[kSRefGRel]);
  // Rows: combine the chunks in order.
  int32_t* rnd = (*out[kOutRowNd])->typed_data<int32_t>();
  F* rmx = (*out[kOutRowMax])->typed_data<F>();
  F* rsm = (*out[kOutRowSum])->typed_data<F>();
  F* rsq = (*out[kOutRowSqs])->typed_data<F>();
  for (int64_t r = 0; r < pl.rows; ++r) {
    int64_t nd = 0;
    double m = 0, s = 0, q = 0;
    for (int64_t j = 0; j < pl.n_chunks; ++j) {
      const int64_t i = j * pl.rows + r;
      nd += job.row_nd[i];
      s += job.row_sum[i];
      MergeScaled(m, q, job.row_max[i], job.row_ssq[i]);
    }
    rnd[r] = static_cast<int32_t>(nd);
    rmx[r] = static_cast<F>(m);
    rsm[r] = static_cast<F>(s);
    rsq[r] = static_cast<F>(q);
  }
  // Columns: combine the stripes in order.
  int32_t* cnd = (*out[kOutColNd])->typed_data<int32_t>();
  F* csm = (*out[kOutColSum])->typed_data<F>();
  for (int64_t c = 0; c < pl.cols; ++c) {
    int64_t nd = 0;
    double s = 0;
    for (int64_t st = 0; st < pl.n_stripes; ++st) {
      nd += job.col_nd[st * pl.cols + c];
      s += job.col_sum[st * pl.cols + c];
    }
    cnd[c] = static_cast<int32_t>(nd);
    csm[c] = static_cast<F>(s);
  }
}

// Zeroes the row and column outputs beyond the record's rows and columns.
void ZeroTails(int64_t rows, int64_t cols, const Outs& out) {
  for (int k = kOutRowNd; k <= kOutColSum; ++k) {
    ffi::AnyBuffer& b = **out[k];
    const int64_t used = k < kOutColNd ? rows : cols;
    const size_t width = ffi::ByteWidth(b.element_type());
    char* p = static_cast<char*>(b.untyped_data());
    std::memset(p + used * width, 0, (b.element_count() - used) * width);
  }
}

// Validates the buffers, runs the units and stores the outputs.
ffi::Error SignatureImpl(ffi::ThreadPool& pool, ffi::AnyBuffer t,
                         ffi::AnyBuffer g, const ffi::AnyBuffer* hi,
                         const ffi::AnyBuffer* lo, ffi::AnyBuffer dims,
                         const Outs& out) {
  const char* name = hi ? "peat_signature_ref" : "peat_signature";
  const ffi::DataType dt = t.element_type();
  const int nbits = NBits(dt);
  if (nbits == 0) {
    return ffi::Error::InvalidArgument(
        std::string(name) + ": test has " + DtypeName(dt) +
        "; expected float32, bfloat16, float16 or float64");
  }
  if (g.element_type() != dt) {
    return ffi::Error::InvalidArgument(
        std::string(name) + ": golden dtype " +
        DtypeName(g.element_type()) + " != test dtype " + DtypeName(dt) +
        "; expected equal dtypes");
  }
  if (dims.element_type() != ffi::DataType::S32 ||
      dims.element_count() != 2) {
    return ffi::Error::InvalidArgument(
        std::string(name) + ": dims has " + DtypeName(dims.element_type()) +
        " with " + std::to_string(dims.element_count()) +
        " elements; expected int32[2] (rows, cols)");
  }
  // The record is the first rows * cols elements of the buffers, row-major
  // (a record padded to its size bucket: the rest is never read).
  const int32_t* d = dims.typed_data<int32_t>();
  const int64_t rows = d[0], cols = d[1];
  const int64_t cap = static_cast<int64_t>(t.element_count());
  if (rows < 1 || cols < 1 || rows * cols >= (int64_t{1} << 31) - 1 ||
      rows * cols > cap ||
      static_cast<int64_t>(g.element_count()) != cap) {
    return ffi::Error::InvalidArgument(
        std::string(name) + ": dims (" + std::to_string(rows) + ", " +
        std::to_string(cols) + ") with test " + DimsString(t.dimensions()) +
        " and golden " + DimsString(g.dimensions()) +
        "; expected 1 to 2**31 - 2 elements, at most the buffers' equal "
        "sizes");
  }
  for (const ffi::AnyBuffer* r : {hi, lo}) {
    if (r && (r->element_type() != ffi::DataType::F32 ||
              static_cast<int64_t>(r->element_count()) != cap)) {
      return ffi::Error::InvalidArgument(
          std::string(name) + ": expected float32 reference halves of " +
          std::to_string(cap) + " elements; got " +
          DtypeName(r->element_type()) + " " + DimsString(r->dimensions()));
    }
  }
  const ffi::DataType cdt =
      dt == ffi::DataType::F64 ? ffi::DataType::F64 : ffi::DataType::F32;
  const struct {
    ffi::DataType type;
    int64_t size;
    const char* name;
  } want[kNumOut] = {
      {ffi::DataType::S32, kFlagSlots + 3 * nbits + kNumRefCounts, "ints"},
      {ffi::DataType::U32, 4, "hashes"},
      {cdt, kNumFloats, "floats"},
      {ffi::DataType::S32, rows, "row_ndiff"},
      {cdt, rows, "row_abs_max"},
      {cdt, rows, "row_abs_sum"},
      {cdt, rows, "row_abs_sqs"},
      {ffi::DataType::S32, cols, "col_ndiff"},
      {cdt, cols, "col_abs_sum"},
      {ffi::DataType::S32, (rows / 8) * (cols / 8), "tile_ndiff"},
      {ffi::DataType::S32, kHistBuckets, "hist_abs"},
      {ffi::DataType::S32, kHistBuckets, "hist_rel"},
      {ffi::DataType::S32, kSampleCounts, "sample_counts"},
  };
  for (int k = 0; k < kNumOut; ++k) {
    ffi::Result<ffi::AnyBuffer>& b = *out[k];
    // Row, column and tile outputs may be longer than the record needs
    // (a size bucket's): their tails are zeroed.
    const bool at_least = k >= kOutRowNd && k <= kOutTile;
    const int64_t have = static_cast<int64_t>(b->element_count());
    if (b->element_type() != want[k].type ||
        (at_least ? have < want[k].size : have != want[k].size)) {
      return ffi::Error::InvalidArgument(
          std::string(name) + ": output " + want[k].name + " has " +
          DtypeName(b->element_type()) + " with " +
          std::to_string(b->element_count()) + " elements; expected " +
          DtypeName(want[k].type) + " with " +
          (at_least ? "at least " : "") + std::to_string(want[k].size));
    }
  }

  Job job;
  job.t = t.untyped_data();
  job.g = g.untyped_data();
  job.hi = hi ? static_cast<const float*>(hi->untyped_data()) : nullptr;
  job.lo = lo ? static_cast<const float*>(lo->untyped_data()) : nullptr;
  job.plan = MakePlan(rows, cols);
  const Plan& pl = job.plan;
  std::vector<UnitOut> units(pl.units());
  std::vector<int64_t> rnd(pl.n_chunks * rows);
  std::vector<double> rmx(pl.n_chunks * rows), rsm(pl.n_chunks * rows),
      rsq(pl.n_chunks * rows);
  std::vector<int64_t> cnd(pl.n_stripes * cols);
  std::vector<double> csm(pl.n_stripes * cols);
  job.units = units.data();
  job.row_nd = rnd.data();
  job.row_max = rmx.data();
  job.row_sum = rsm.data();
  job.row_ssq = rsq.data();
  job.col_nd = cnd.data();
  job.col_sum = csm.data();
  job.tile = (*out[kOutTile])->typed_data<int32_t>();
  std::fill(job.tile, job.tile + (*out[kOutTile])->element_count(), 0);

  // The level is chosen once per dtype (an error, too, is kept).
  struct Pick {
    std::string error;  // before fn: PickUnitFn writes it
    UnitFn fn;
    Pick(int nbits, bool is_bf16) : fn(PickUnitFn(nbits, is_bf16, &error)) {}
  };
  const Pick* pick = nullptr;
  switch (dt) {
    case ffi::DataType::F32: {
      static const Pick p(32, false);
      pick = &p;
      break;
    }
    case ffi::DataType::BF16: {
      static const Pick p(16, true);
      pick = &p;
      break;
    }
    case ffi::DataType::F16: {
      static const Pick p(16, false);
      pick = &p;
      break;
    }
    default: {
      static const Pick p(64, false);
      pick = &p;
      break;
    }
  }
  if (pick->fn == nullptr) {
    return ffi::Error::InvalidArgument(std::string(name) + ": " + pick->error);
  }
  UnitFn fn = pick->fn;
  RunUnits(pool, fn, job);
  if (cdt == ffi::DataType::F64) {
    CombineAndStore<double>(job, nbits, out);
  } else {
    CombineAndStore<float>(job, nbits, out);
  }
  ZeroTails(rows, cols, out);
  return ffi::Error::Success();
}

#define PEAT_SIG_RESULTS                                                     \
  ffi::Result<ffi::AnyBuffer> ints, ffi::Result<ffi::AnyBuffer> hashes,     \
      ffi::Result<ffi::AnyBuffer> floats, ffi::Result<ffi::AnyBuffer> row_nd, \
      ffi::Result<ffi::AnyBuffer> row_max,                                   \
      ffi::Result<ffi::AnyBuffer> row_sum,                                   \
      ffi::Result<ffi::AnyBuffer> row_sqs,                                   \
      ffi::Result<ffi::AnyBuffer> col_nd,                                    \
      ffi::Result<ffi::AnyBuffer> col_sum, ffi::Result<ffi::AnyBuffer> tile, \
      ffi::Result<ffi::AnyBuffer> hist_abs,                                  \
      ffi::Result<ffi::AnyBuffer> hist_rel,                                  \
      ffi::Result<ffi::AnyBuffer> sample_counts
#define PEAT_SIG_OUTS                                                      \
  {&ints, &hashes, &floats, &row_nd, &row_max, &row_sum, &row_sqs, &col_nd, \
   &col_sum, &tile, &hist_abs, &hist_rel, &sample_counts}

ffi::Error SignatureNoRef(ffi::ThreadPool pool, ffi::AnyBuffer t,
                          ffi::AnyBuffer g, ffi::AnyBuffer dims,
                          PEAT_SIG_RESULTS) {
  const Outs out = PEAT_SIG_OUTS;
  return SignatureImpl(pool, t, g, nullptr, nullptr, dims, out);
}

ffi::Error SignatureRef(ffi::ThreadPool pool, ffi::AnyBuffer t,
                        ffi::AnyBuffer g, ffi::AnyBuffer hi, ffi::AnyBuffer lo,
                        ffi::AnyBuffer dims, PEAT_SIG_RESULTS) {
  const Outs out = PEAT_SIG_OUTS;
  return SignatureImpl(pool, t, g, &hi, &lo, dims, out);
}

}  // namespace
}  // namespace sig
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatSignature);
PEAT_EXPORT_HANDLER(PeatSignatureRef);

#define PEAT_SIG_RETS(b)              \
  b.Ret<xla::ffi::AnyBuffer>()        \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()     \
      .Ret<xla::ffi::AnyBuffer>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatSignature, peat::sig::SignatureNoRef,
    PEAT_SIG_RETS(xla::ffi::Ffi::Bind()
                      .Ctx<xla::ffi::ThreadPool>()
                      .Arg<xla::ffi::AnyBuffer>()
                      .Arg<xla::ffi::AnyBuffer>()
                      .Arg<xla::ffi::AnyBuffer>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    PeatSignatureRef, peat::sig::SignatureRef,
    PEAT_SIG_RETS(xla::ffi::Ffi::Bind()
                      .Ctx<xla::ffi::ThreadPool>()
                      .Arg<xla::ffi::AnyBuffer>()
                      .Arg<xla::ffi::AnyBuffer>()
                      .Arg<xla::ffi::AnyBuffer>()
                      .Arg<xla::ffi::AnyBuffer>()
                      .Arg<xla::ffi::AnyBuffer>()));
