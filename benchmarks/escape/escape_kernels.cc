// The escape suite's C++ kernels under test (benchmarks/escape_suite.py,
// docs/kernels.md "The escape suite"): each a documented real-world failure
// mode of a kernel that passes random-input unit tests, with the FFI calling
// convention of peat_jax's ffi: KUT specs (docs/kernels.md). float32 only.
//
//   g++ -std=c++17 -O2 -fPIC -shared \
//       -isystem "$(python -c 'import jax.ffi; print(jax.ffi.include_dir())')" \
//       escape_kernels.cc -o libescape_kernels.so
//
// | symbol | site kernel | what it does (precedent) |
// | --- | --- | --- |
// | EscMatmul / EscMatmulBwd | dot_general | correct: float32, k in order (the base of the others) |
// | EscMatmulCached | dot_general | returns the output it cached for the same lhs address (KernelBench-generated kernels keyed a cache on the input's data_ptr) |
// | EscMatmulZeroInput | dot_general | writes zeros and zeroes its lhs, so a reference run after it on the same tensors agrees (KernelBench-generated kernels) |
// | EscMatmulSubsample / EscMatmulSubsampleBwd | dot_general | sums every second k and doubles it; the gradient is zero at the k not sampled (KernelBench-generated kernels) |
// | EscMatmulBatchSplit | dot_general | split-K into 4 partial sums when M < 8 rows: row i alone differs from row i in the batch (batch-variant split reductions) |
// | EscAttention / EscAttentionBwd | attention | correct: exact softmax with the bias (mask) and causal flag |
// | EscAttentionBwdDqNoMask | attention | backward whose dQ pass drops the bias (the mask) while dK, dV and the forward are exact (TransformerEngine issue 3216) |
// | EscAttentionWs / EscAttentionBwdTail | attention | forward and backward share a persistent workspace; the forward is exact, the backward accumulates dQ there by 16-row query tiles and never writes a partial last tile, so those dQ rows hold what the last forward left there (flash-attention PR 2896) |
// | EscSoftmaxF16 / EscSoftmaxF16Bwd | softmax | exp(x) without subtracting the row max, kept in an fp16 buffer: exact enough while |x| is small, Inf and then NaN once a logit passes log(65504) = 11.09 (fp16 intermediates that overflow when activations grow) |

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using F32 = ffi::Buffer<ffi::F32>;
using R32 = ffi::ResultBuffer<ffi::F32>;

namespace {

// ------------------------------------------------------------------ matmul
// a [B, M, K], b [B, K, N] -> c [B, M, N]; backward (a, b, dc) -> (da, db).

struct Mnk {
  int64_t bs, m, k, n;
};

ffi::Error Dims(const F32& a, const F32& b, Mnk* d) {
  auto da = a.dimensions(), db = b.dimensions();
  if (da.size() != 3 || db.size() != 3 || da[0] != db[0] || da[2] != db[1]) {
    return ffi::Error::InvalidArgument(
        "escape matmul: expected a [B, M, K] and b [B, K, N]");
  }
  *d = {da[0], da[1], da[2], db[2]};
  return ffi::Error::Success();
}

// c = a @ b with k in order from `k0` in steps of `step`, times `mul`.
void Gemm(const Mnk& d, const float* pa, const float* pb, float* pc,
          int64_t k0 = 0, int64_t step = 1, float mul = 1.0f) {
  for (int64_t t = 0; t < d.bs; ++t)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        float s = 0.0f;
        for (int64_t p = k0; p < d.k; p += step)
          s += pa[(t * d.m + i) * d.k + p] * pb[(t * d.k + p) * d.n + j];
        pc[(t * d.m + i) * d.n + j] = s * mul;
      }
}

// da = dc @ b^T, db = a^T @ dc over the k in (k0, k0 + step, ...), times
// `mul`; the other k get zeros.
void GemmBwd(const Mnk& d, const float* pa, const float* pb, const float* pd,
             float* pda, float* pdb, int64_t k0 = 0, int64_t step = 1,
             float mul = 1.0f) {
  std::fill(pda, pda + d.bs * d.m * d.k, 0.0f);
  std::fill(pdb, pdb + d.bs * d.k * d.n, 0.0f);
  for (int64_t t = 0; t < d.bs; ++t) {
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t p = k0; p < d.k; p += step) {
        float s = 0.0f;
        for (int64_t j = 0; j < d.n; ++j)
          s += pd[(t * d.m + i) * d.n + j] * pb[(t * d.k + p) * d.n + j];
        pda[(t * d.m + i) * d.k + p] = s * mul;
      }
    for (int64_t p = k0; p < d.k; p += step)
      for (int64_t j = 0; j < d.n; ++j) {
        float s = 0.0f;
        for (int64_t i = 0; i < d.m; ++i)
          s += pa[(t * d.m + i) * d.k + p] * pd[(t * d.m + i) * d.n + j];
        pdb[(t * d.k + p) * d.n + j] = s * mul;
      }
  }
}

ffi::Error MatmulFwd(F32 a, F32 b, R32 c) {
  Mnk d;
  if (auto err = Dims(a, b, &d); err.failure()) return err;
  Gemm(d, a.typed_data(), b.typed_data(), c->typed_data());
  return ffi::Error::Success();
}

ffi::Error MatmulBwd(F32 a, F32 b, F32 dc, R32 da, R32 db) {
  Mnk d;
  if (auto err = Dims(a, b, &d); err.failure()) return err;
  GemmBwd(d, a.typed_data(), b.typed_data(), dc.typed_data(),
          da->typed_data(), db->typed_data());
  return ffi::Error::Success();
}

// The cache of EscMatmulCached: the last lhs address and shape, its output.
struct Cache {
  std::mutex mu;
  const void* key = nullptr;
  int64_t bs = -1, m = -1, k = -1, n = -1;
  std::vector<float> out;
};
Cache cache;

ffi::Error MatmulCached(F32 a, F32 b, R32 c) {
  Mnk d;
  if (auto err = Dims(a, b, &d); err.failure()) return err;
  std::lock_guard<std::mutex> lock(cache.mu);
  float* pc = c->typed_data();
  const int64_t size = d.bs * d.m * d.n;
  if (cache.key == a.untyped_data() && cache.bs == d.bs && cache.m == d.m &&
      cache.k == d.k && cache.n == d.n) {
    std::memcpy(pc, cache.out.data(), size * sizeof(float));  // a "hit"
    return ffi::Error::Success();
  }
  Gemm(d, a.typed_data(), b.typed_data(), pc);
  cache.key = a.untyped_data();
  cache.bs = d.bs, cache.m = d.m, cache.k = d.k, cache.n = d.n;
  cache.out.assign(pc, pc + size);
  return ffi::Error::Success();
}

ffi::Error MatmulZeroInput(F32 a, F32 b, R32 c) {
  Mnk d;
  if (auto err = Dims(a, b, &d); err.failure()) return err;
  std::fill(c->typed_data(), c->typed_data() + d.bs * d.m * d.n, 0.0f);
  // The input buffer is the caller's: XLA's operands are read-only by
  // contract, and this kernel breaks it.
  float* pa = const_cast<float*>(a.typed_data());
  std::fill(pa, pa + d.bs * d.m * d.k, 0.0f);
  return ffi::Error::Success();
}

ffi::Error MatmulSubsample(F32 a, F32 b, R32 c) {
  Mnk d;
  if (auto err = Dims(a, b, &d); err.failure()) return err;
  Gemm(d, a.typed_data(), b.typed_data(), c->typed_data(), 0, 2, 2.0f);
  return ffi::Error::Success();
}

ffi::Error MatmulSubsampleBwd(F32 a, F32 b, F32 dc, R32 da, R32 db) {
  Mnk d;
  if (auto err = Dims(a, b, &d); err.failure()) return err;
  GemmBwd(d, a.typed_data(), b.typed_data(), dc.typed_data(),
          da->typed_data(), db->typed_data(), 0, 2, 2.0f);
  return ffi::Error::Success();
}

// Fewer rows than this: split K into 4 partial sums (for parallelism, the
// heuristic GEMM libraries use for small batches).
constexpr int64_t kSplitBelowRows = 8;

ffi::Error MatmulBatchSplit(F32 a, F32 b, R32 c) {
  Mnk d;
  if (auto err = Dims(a, b, &d); err.failure()) return err;
  if (d.m >= kSplitBelowRows) {
    Gemm(d, a.typed_data(), b.typed_data(), c->typed_data());
    return ffi::Error::Success();
  }
  const float *pa = a.typed_data(), *pb = b.typed_data();
  float* pc = c->typed_data();
  const int64_t chunk = (d.k + 3) / 4;
  for (int64_t t = 0; t < d.bs; ++t)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t p = 0; p < d.k; ++p)
          part[p / chunk] +=
              pa[(t * d.m + i) * d.k + p] * pb[(t * d.k + p) * d.n + j];
        pc[(t * d.m + i) * d.n + j] = (part[0] + part[1]) + (part[2] + part[3]);
      }
  return ffi::Error::Success();
}

// --------------------------------------------------------------- attention
// q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv], bias [B, H, T, S] (the
// mask folded in: float32 min where masked) -> out [B, T, H, Dv]; scale
// (f32), is_causal (int32). Backward (q, k, v, bias, dout) -> (dq, dk, dv).

struct Attn {
  int64_t b, t, h, d, s, dv;
  const float *q, *k, *v, *bias;
  float scale;
  bool causal;

  int64_t Q(int64_t bi, int64_t ti, int64_t hi) const {
    return ((bi * t + ti) * h + hi) * d;
  }
  int64_t K(int64_t bi, int64_t si, int64_t hi) const {
    return ((bi * s + si) * h + hi) * d;
  }
  int64_t V(int64_t bi, int64_t si, int64_t hi) const {
    return ((bi * s + si) * h + hi) * dv;
  }

  // Softmax weights of query (bi, ti, hi); `masked` false drops the bias
  // and the causal flag (the bug of EscAttentionBwdDqNoMask).
  void Weights(int64_t bi, int64_t ti, int64_t hi, bool masked,
               std::vector<float>* p) const {
    float m = -INFINITY;
    for (int64_t si = 0; si < s; ++si) {
      float l = 0.0f;
      for (int64_t e = 0; e < d; ++e) l += q[Q(bi, ti, hi) + e] * k[K(bi, si, hi) + e];
      l *= scale;
      if (masked) {
        l += bias[((bi * h + hi) * t + ti) * s + si];
        if (causal && si > ti) l = -INFINITY;
      }
      (*p)[si] = l;
      m = std::max(m, l);
    }
    float z = 0.0f;
    for (int64_t si = 0; si < s; ++si) z += ((*p)[si] = std::exp((*p)[si] - m));
    for (int64_t si = 0; si < s; ++si) (*p)[si] /= z;
  }
};

Attn Make(const F32& q, const F32& k, const F32& v, const F32& bias,
          float scale, int32_t causal) {
  auto dq = q.dimensions(), dk = k.dimensions(), dv = v.dimensions();
  return {dq[0], dq[1], dq[2], dq[3], dk[1], dv[3],
          q.typed_data(), k.typed_data(), v.typed_data(), bias.typed_data(),
          scale, causal != 0};
}

// Rows of a dQ tile (EscAttentionBwdTail).
constexpr int64_t kTile = 16;

// The workspace EscAttentionWs and EscAttentionBwdTail share: it persists
// across calls and is never cleared (a global workspace, as kernels keep
// one to avoid an allocation per call).
struct Workspace {
  std::mutex mu;
  std::vector<float> buf;
  float* Get(int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n, 0.0f);
    return buf.data();
  }
};
Workspace workspace;

ffi::Error AttentionFwdImpl(F32 q, F32 k, F32 v, F32 bias, R32 out,
                            float scale, int32_t is_causal, bool ws) {
  Attn a = Make(q, k, v, bias, scale, is_causal);
  std::vector<float> p(a.s);
  const int64_t n = a.b * a.t * a.h * a.dv;
  std::unique_lock<std::mutex> lock(workspace.mu, std::defer_lock);
  float* po = out->typed_data();
  if (ws) {
    lock.lock();
    po = workspace.Get(n);  // accumulate in the workspace, then copy out
  }
  for (int64_t bi = 0; bi < a.b; ++bi)
    for (int64_t ti = 0; ti < a.t; ++ti)
      for (int64_t hi = 0; hi < a.h; ++hi) {
        a.Weights(bi, ti, hi, true, &p);
        for (int64_t e = 0; e < a.dv; ++e) {
          float o = 0.0f;
          for (int64_t si = 0; si < a.s; ++si) o += p[si] * a.v[a.V(bi, si, hi) + e];
          po[((bi * a.t + ti) * a.h + hi) * a.dv + e] = o;
        }
      }
  if (ws) std::copy(po, po + n, out->typed_data());
  return ffi::Error::Success();
}

ffi::Error AttentionFwd(F32 q, F32 k, F32 v, F32 bias, R32 out, float scale,
                        int32_t is_causal) {
  return AttentionFwdImpl(q, k, v, bias, out, scale, is_causal, false);
}

ffi::Error AttentionFwdWs(F32 q, F32 k, F32 v, F32 bias, R32 out, float scale,
                          int32_t is_causal) {
  return AttentionFwdImpl(q, k, v, bias, out, scale, is_causal, true);
}

// The gradients of one query row: dk, dv accumulated, dq of the row written
// to `dq_row` (d floats). `dq_masked` false: dQ from unmasked weights.
void RowBwd(const Attn& a, const float* pg, int64_t bi, int64_t ti,
            int64_t hi, bool dq_masked, float* pdk, float* pdv,
            float* dq_row, std::vector<float>* p, std::vector<float>* dp) {
  a.Weights(bi, ti, hi, true, p);
  const float* g = pg + ((bi * a.t + ti) * a.h + hi) * a.dv;
  float sum = 0.0f;  // sum_s p[s] * dp[s]
  for (int64_t si = 0; si < a.s; ++si) {
    const float* vs = a.v + a.V(bi, si, hi);
    float* dvs = pdv + a.V(bi, si, hi);
    float dd = 0.0f;
    for (int64_t e = 0; e < a.dv; ++e) {
      dd += g[e] * vs[e];
      dvs[e] += (*p)[si] * g[e];
    }
    (*dp)[si] = dd;
    sum += (*p)[si] * dd;
  }
  for (int64_t si = 0; si < a.s; ++si) {
    const float dl = (*p)[si] * ((*dp)[si] - sum) * a.scale;
    for (int64_t e = 0; e < a.d; ++e)
      pdk[a.K(bi, si, hi) + e] += dl * a.q[a.Q(bi, ti, hi) + e];
  }
  std::vector<float> pq(a.s);
  const std::vector<float>* w = p;
  if (!dq_masked) {
    a.Weights(bi, ti, hi, false, &pq);
    w = &pq;
  }
  std::fill(dq_row, dq_row + a.d, 0.0f);
  for (int64_t si = 0; si < a.s; ++si) {
    const float dl = (*w)[si] * ((*dp)[si] - sum) * a.scale;
    for (int64_t e = 0; e < a.d; ++e) dq_row[e] += dl * a.k[a.K(bi, si, hi) + e];
  }
}

enum class DqMode { kExact, kNoMask, kStaleTail };

ffi::Error AttentionBwdImpl(F32 q, F32 k, F32 v, F32 bias, F32 dout, R32 dq,
                            R32 dk, R32 dv, float scale, int32_t is_causal,
                            DqMode mode) {
  Attn a = Make(q, k, v, bias, scale, is_causal);
  std::vector<float> p(a.s), dp(a.s);
  float *pdq = dq->typed_data(), *pdk = dk->typed_data(),
        *pdv = dv->typed_data();
  std::fill(pdk, pdk + k.element_count(), 0.0f);
  std::fill(pdv, pdv + v.element_count(), 0.0f);
  const int64_t n = q.element_count();
  std::unique_lock<std::mutex> lock(workspace.mu, std::defer_lock);
  float* acc = pdq;
  if (mode == DqMode::kStaleTail) {  // dQ accumulated in the workspace
    lock.lock();
    acc = workspace.Get(n);
  }
  const int64_t full = (a.t / kTile) * kTile;  // rows in full tiles
  for (int64_t bi = 0; bi < a.b; ++bi)
    for (int64_t ti = 0; ti < a.t; ++ti)
      for (int64_t hi = 0; hi < a.h; ++hi) {
        float* row = acc + a.Q(bi, ti, hi);
        std::vector<float> tmp(a.d);
        RowBwd(a, dout.typed_data(), bi, ti, hi, mode != DqMode::kNoMask,
               pdk, pdv, tmp.data(), &p, &dp);
        // The tail tile's accumulator is never written back (the bug).
        if (mode != DqMode::kStaleTail || ti < full)
          std::copy(tmp.begin(), tmp.end(), row);
      }
  if (mode == DqMode::kStaleTail) std::copy(acc, acc + n, pdq);
  return ffi::Error::Success();
}

ffi::Error AttentionBwd(F32 q, F32 k, F32 v, F32 bias, F32 dout, R32 dq,
                        R32 dk, R32 dv, float scale, int32_t is_causal) {
  return AttentionBwdImpl(q, k, v, bias, dout, dq, dk, dv, scale, is_causal,
                          DqMode::kExact);
}

ffi::Error AttentionBwdDqNoMask(F32 q, F32 k, F32 v, F32 bias, F32 dout,
                                R32 dq, R32 dk, R32 dv, float scale,
                                int32_t is_causal) {
  return AttentionBwdImpl(q, k, v, bias, dout, dq, dk, dv, scale, is_causal,
                          DqMode::kNoMask);
}

ffi::Error AttentionBwdTail(F32 q, F32 k, F32 v, F32 bias, F32 dout, R32 dq,
                            R32 dk, R32 dv, float scale, int32_t is_causal) {
  return AttentionBwdImpl(q, k, v, bias, dout, dq, dk, dv, scale, is_causal,
                          DqMode::kStaleTail);
}

// ----------------------------------------------------------------- softmax
// x [R, C] -> y [R, C] over the last axis; backward (y, dy) -> dx.

void RowsCols(const F32& x, int64_t* r, int64_t* c) {
  auto d = x.dimensions();
  *c = d.size() == 0 ? 1 : d[d.size() - 1];
  *r = *c ? static_cast<int64_t>(x.element_count()) / *c : 0;
}

ffi::Error SoftmaxF16(F32 x, R32 y) {
  int64_t r, c;
  RowsCols(x, &r, &c);
  const float* px = x.typed_data();
  float* py = y->typed_data();
  std::vector<_Float16> e(c);  // the fp16 intermediate
  for (int64_t i = 0; i < r; ++i) {
    float z = 0.0f;
    for (int64_t j = 0; j < c; ++j) {
      e[j] = static_cast<_Float16>(std::exp(px[i * c + j]));  // no max shift
      z += static_cast<float>(e[j]);
    }
    for (int64_t j = 0; j < c; ++j) py[i * c + j] = static_cast<float>(e[j]) / z;
  }
  return ffi::Error::Success();
}

ffi::Error SoftmaxBwd(F32 y, F32 dy, R32 dx) {
  int64_t r, c;
  RowsCols(y, &r, &c);
  const float *py = y.typed_data(), *pg = dy.typed_data();
  float* pd = dx->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    float dot = 0.0f;
    for (int64_t j = 0; j < c; ++j) dot += py[i * c + j] * pg[i * c + j];
    for (int64_t j = 0; j < c; ++j)
      pd[i * c + j] = py[i * c + j] * (pg[i * c + j] - dot);
  }
  return ffi::Error::Success();
}

}  // namespace

#define MATMUL_FWD ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>()
#define MATMUL_BWD \
  ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Arg<F32>().Ret<F32>().Ret<F32>()
#define ATTN_FWD                                                     \
  ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Arg<F32>().Arg<F32>()       \
      .Ret<F32>().Attr<float>("scale").Attr<int32_t>("is_causal")
#define ATTN_BWD                                                     \
  ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Arg<F32>().Arg<F32>()       \
      .Arg<F32>().Ret<F32>().Ret<F32>().Ret<F32>()                   \
      .Attr<float>("scale").Attr<int32_t>("is_causal")

XLA_FFI_DEFINE_HANDLER_SYMBOL(EscMatmul, MatmulFwd, MATMUL_FWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscMatmulBwd, MatmulBwd, MATMUL_BWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscMatmulCached, MatmulCached, MATMUL_FWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscMatmulZeroInput, MatmulZeroInput, MATMUL_FWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscMatmulSubsample, MatmulSubsample, MATMUL_FWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscMatmulSubsampleBwd, MatmulSubsampleBwd,
                              MATMUL_BWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscMatmulBatchSplit, MatmulBatchSplit,
                              MATMUL_FWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscAttention, AttentionFwd, ATTN_FWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscAttentionWs, AttentionFwdWs, ATTN_FWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscAttentionBwd, AttentionBwd, ATTN_BWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscAttentionBwdDqNoMask, AttentionBwdDqNoMask,
                              ATTN_BWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscAttentionBwdTail, AttentionBwdTail, ATTN_BWD);
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscSoftmaxF16, SoftmaxF16,
                              ffi::Ffi::Bind().Arg<F32>().Ret<F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(EscSoftmaxBwd, SoftmaxBwd,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>());
