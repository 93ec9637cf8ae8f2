// Plain float32 reference kernels with the FFI calling convention of every
// site kernel that ffi: KUT specs support (docs/kernels.md), forward and
// backward. ffi_matmul.cc is the one to copy first; this file shows the
// operands, results and attributes of the others, and the tests compile it
// and validate each through ffi: (tests/kernels/test_user_kut.py).
//
//   g++ -std=c++17 -O2 -fPIC -shared \
//       -isystem "$(python -c 'import jax.ffi; print(jax.ffi.include_dir())')" \
//       ffi_kernels.cc -o libffi_kernels.so
//
// | site kernel  | forward symbol | backward symbol |
// | ------------ | -------------- | --------------- |
// | conv_general_dilated | MyConv2d | MyConv2dBwd |
// | softmax      | MySoftmax      | MySoftmaxBwd    |
// | log_softmax  | MyLogSoftmax   | MyLogSoftmaxBwd |
// | layer_norm   | MyLayerNorm    | MyLayerNormBwd  |
// | rms_norm     | MyRmsNorm      | MyRmsNormBwd    |
// | gelu         | MyGelu         | MyGeluBwd       |
// | attention    | MyAttention    | MyAttentionBwd  |
// | cross_entropy| MyCrossEntropy | MyCrossEntropyBwd |

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using F32 = ffi::Buffer<ffi::F32>;
using R32 = ffi::ResultBuffer<ffi::F32>;

namespace {

// Rows and row length of a [R, C] operand.
void RowsCols(const F32& x, int64_t* r, int64_t* c) {
  auto d = x.dimensions();
  *c = d.size() == 0 ? 1 : d[d.size() - 1];
  *r = *c ? static_cast<int64_t>(x.element_count()) / *c : 0;
}

// ---------------------------------------------------------------- conv2d
// x [N, H, W, C] (NHWC), w [KH, KW, C, O] (HWIO) -> y [N, OH, OW, O];
// attributes stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right.
struct ConvDims {
  int64_t n, h, w, c, kh, kw, o, oh, ow;
};

ConvDims Dims(const F32& x, const F32& w, int64_t oh, int64_t ow) {
  auto dx = x.dimensions(), dw = w.dimensions();
  return {dx[0], dx[1], dx[2], dx[3], dw[0], dw[1], dw[3], oh, ow};
}

ffi::Error Conv2dFwd(F32 x, F32 w, R32 y, int32_t sh, int32_t sw, int32_t pt,
                     int32_t pb, int32_t pl, int32_t pr) {
  (void)pb, (void)pr;
  auto dy = y->dimensions();
  ConvDims d = Dims(x, w, dy[1], dy[2]);
  const float *px = x.typed_data(), *pw = w.typed_data();
  float* py = y->typed_data();
  for (int64_t b = 0; b < d.n; ++b)
    for (int64_t i = 0; i < d.oh; ++i)
      for (int64_t j = 0; j < d.ow; ++j)
        for (int64_t o = 0; o < d.o; ++o) {
          float s = 0.0f;
          for (int64_t u = 0; u < d.kh; ++u)
            for (int64_t v = 0; v < d.kw; ++v) {
              const int64_t hi = i * sh + u - pt, wi = j * sw + v - pl;
              if (hi < 0 || hi >= d.h || wi < 0 || wi >= d.w) continue;
              for (int64_t c = 0; c < d.c; ++c)
                s += px[((b * d.h + hi) * d.w + wi) * d.c + c] *
                     pw[((u * d.kw + v) * d.c + c) * d.o + o];
            }
          py[((b * d.oh + i) * d.ow + j) * d.o + o] = s;
        }
  return ffi::Error::Success();
}

// (x, w, dy) -> (dx, dw), same attributes.
ffi::Error Conv2dBwd(F32 x, F32 w, F32 dy, R32 dx, R32 dw, int32_t sh,
                     int32_t sw, int32_t pt, int32_t pb, int32_t pl,
                     int32_t pr) {
  (void)pb, (void)pr;
  auto ddy = dy.dimensions();
  ConvDims d = Dims(x, w, ddy[1], ddy[2]);
  const float *px = x.typed_data(), *pw = w.typed_data(),
              *pg = dy.typed_data();
  float *pdx = dx->typed_data(), *pdw = dw->typed_data();
  std::fill(pdx, pdx + x.element_count(), 0.0f);
  std::fill(pdw, pdw + w.element_count(), 0.0f);
  for (int64_t b = 0; b < d.n; ++b)
    for (int64_t i = 0; i < d.oh; ++i)
      for (int64_t j = 0; j < d.ow; ++j)
        for (int64_t o = 0; o < d.o; ++o) {
          const float g = pg[((b * d.oh + i) * d.ow + j) * d.o + o];
          for (int64_t u = 0; u < d.kh; ++u)
            for (int64_t v = 0; v < d.kw; ++v) {
              const int64_t hi = i * sh + u - pt, wi = j * sw + v - pl;
              if (hi < 0 || hi >= d.h || wi < 0 || wi >= d.w) continue;
              for (int64_t c = 0; c < d.c; ++c) {
                const int64_t xi = ((b * d.h + hi) * d.w + wi) * d.c + c;
                const int64_t wj = ((u * d.kw + v) * d.c + c) * d.o + o;
                pdx[xi] += g * pw[wj];
                pdw[wj] += g * px[xi];
              }
            }
        }
  return ffi::Error::Success();
}

// --------------------------------------------------- softmax, log_softmax
// x [R, C] -> y [R, C] over the last axis; backward (y, dy) -> dx.
template <bool kLog>
ffi::Error RowSoftmax(F32 x, R32 y) {
  int64_t r, c;
  RowsCols(x, &r, &c);
  const float* px = x.typed_data();
  float* py = y->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    const float* row = px + i * c;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < c; ++j) m = std::max(m, row[j]);
    for (int64_t j = 0; j < c; ++j) s += std::exp(row[j] - m);
    for (int64_t j = 0; j < c; ++j)
      py[i * c + j] = kLog ? row[j] - m - std::log(s) : std::exp(row[j] - m) / s;
  }
  return ffi::Error::Success();
}

template <bool kLog>
ffi::Error RowSoftmaxBwd(F32 y, F32 dy, R32 dx) {
  int64_t r, c;
  RowsCols(y, &r, &c);
  const float *py = y.typed_data(), *pg = dy.typed_data();
  float* pd = dx->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    float s = 0.0f;  // softmax: sum(y * dy); log_softmax: sum(dy)
    for (int64_t j = 0; j < c; ++j)
      s += kLog ? pg[i * c + j] : py[i * c + j] * pg[i * c + j];
    for (int64_t j = 0; j < c; ++j) {
      const int64_t k = i * c + j;
      pd[k] = kLog ? pg[k] - std::exp(py[k]) * s : py[k] * (pg[k] - s);
    }
  }
  return ffi::Error::Success();
}

// ------------------------------------------------------ layer and RMS norm
// layer_norm: (x [R, D], scale [D], bias [D]) -> y, attribute eps (f32);
//   backward (x, scale, dy) -> (dx, dscale, dbias).
// rms_norm: (x [R, D], scale [D]) -> y, attribute eps;
//   backward (x, scale, dy) -> (dx, dscale).
template <bool kCenter>
void NormStats(const float* row, int64_t d, float eps, float* mean,
               float* rstd) {
  float m = 0.0f;
  if (kCenter) {
    for (int64_t j = 0; j < d; ++j) m += row[j];
    m /= d;
  }
  float v = 0.0f;
  for (int64_t j = 0; j < d; ++j) v += (row[j] - m) * (row[j] - m);
  *mean = m;
  *rstd = 1.0f / std::sqrt(v / d + eps);
}

ffi::Error LayerNormFwd(F32 x, F32 scale, F32 bias, R32 y, float eps) {
  int64_t r, d;
  RowsCols(x, &r, &d);
  const float *px = x.typed_data(), *ps = scale.typed_data(),
              *pb = bias.typed_data();
  float* py = y->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    float m, rs;
    NormStats<true>(px + i * d, d, eps, &m, &rs);
    for (int64_t j = 0; j < d; ++j)
      py[i * d + j] = (px[i * d + j] - m) * rs * ps[j] + pb[j];
  }
  return ffi::Error::Success();
}

template <bool kCenter>
void NormBwd(const float* px, const float* ps, const float* pg, int64_t r,
             int64_t d, float eps, float* pdx, float* pds, float* pdb) {
  std::fill(pds, pds + d, 0.0f);
  if (pdb) std::fill(pdb, pdb + d, 0.0f);
  for (int64_t i = 0; i < r; ++i) {
    const float *row = px + i * d, *g = pg + i * d;
    float m, rs;
    NormStats<kCenter>(row, d, eps, &m, &rs);
    float sg = 0.0f, sgx = 0.0f;  // sums of g*scale and g*scale*xhat
    for (int64_t j = 0; j < d; ++j) {
      const float xh = (row[j] - m) * rs, gs = g[j] * ps[j];
      sg += gs;
      sgx += gs * xh;
      pds[j] += g[j] * xh;
      if (pdb) pdb[j] += g[j];
    }
    for (int64_t j = 0; j < d; ++j) {
      const float xh = (row[j] - m) * rs, gs = g[j] * ps[j];
      pdx[i * d + j] = rs * (gs - (kCenter ? sg / d : 0.0f) - xh * sgx / d);
    }
  }
}

ffi::Error LayerNormBwd(F32 x, F32 scale, F32 dy, R32 dx, R32 dscale,
                        R32 dbias, float eps) {
  int64_t r, d;
  RowsCols(x, &r, &d);
  NormBwd<true>(x.typed_data(), scale.typed_data(), dy.typed_data(), r, d,
                eps, dx->typed_data(), dscale->typed_data(),
                dbias->typed_data());
  return ffi::Error::Success();
}

ffi::Error RmsNormFwd(F32 x, F32 scale, R32 y, float eps) {
  int64_t r, d;
  RowsCols(x, &r, &d);
  const float *px = x.typed_data(), *ps = scale.typed_data();
  float* py = y->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    float m, rs;
    NormStats<false>(px + i * d, d, eps, &m, &rs);
    for (int64_t j = 0; j < d; ++j) py[i * d + j] = px[i * d + j] * rs * ps[j];
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormBwd(F32 x, F32 scale, F32 dy, R32 dx, R32 dscale,
                      float eps) {
  int64_t r, d;
  RowsCols(x, &r, &d);
  NormBwd<false>(x.typed_data(), scale.typed_data(), dy.typed_data(), r, d,
                 eps, dx->typed_data(), dscale->typed_data(), nullptr);
  return ffi::Error::Success();
}

// ------------------------------------------------------------------- gelu
// x [N] -> y [N], attribute approximate (int32: 0 erf, 1 tanh);
// backward (x, dy) -> dx.
constexpr float kSqrt2OverPi = 0.7978845608028654f;

ffi::Error GeluFwd(F32 x, R32 y, int32_t approximate) {
  const float* px = x.typed_data();
  float* py = y->typed_data();
  for (size_t i = 0; i < x.element_count(); ++i) {
    const float v = px[i];
    py[i] = approximate
                ? 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi *
                                               (v + 0.044715f * v * v * v)))
                : 0.5f * v * std::erfc(-v * 0.7071067811865476f);
  }
  return ffi::Error::Success();
}

ffi::Error GeluBwd(F32 x, F32 dy, R32 dx, int32_t approximate) {
  const float *px = x.typed_data(), *pg = dy.typed_data();
  float* pd = dx->typed_data();
  for (size_t i = 0; i < x.element_count(); ++i) {
    const float v = px[i];
    float grad;
    if (approximate) {
      const float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
      const float t = std::tanh(u);
      grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi *
                                     (1.0f + 3.0f * 0.044715f * v * v);
    } else {
      grad = 0.5f * std::erfc(-v * 0.7071067811865476f) +
             v * std::exp(-0.5f * v * v) * 0.3989422804014327f;
    }
    pd[i] = pg[i] * grad;
  }
  return ffi::Error::Success();
}

// -------------------------------------------------------------- attention
// q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv], bias [B, H, T, S] (the
// logit bias with the mask folded in: float32 min where masked) -> out
// [B, T, H, Dv]; attributes scale (f32), is_causal (int32). Backward:
// (q, k, v, bias, dout) -> (dq, dk, dv).
struct AttnDims {
  int64_t b, t, h, d, s, dv;
};

AttnDims Dims(const F32& q, const F32& k, const F32& v) {
  auto dq = q.dimensions(), dk = k.dimensions(), dv = v.dimensions();
  return {dq[0], dq[1], dq[2], dq[3], dk[1], dv[3]};
}

// Softmax weights p[s] of query (b, t, h).
void Weights(const AttnDims& a, const float* q, const float* k,
             const float* bias, float scale, bool causal, int64_t b,
             int64_t t, int64_t h, std::vector<float>* p) {
  float m = -INFINITY;
  for (int64_t s = 0; s < a.s; ++s) {
    float l = 0.0f;
    for (int64_t d = 0; d < a.d; ++d)
      l += q[((b * a.t + t) * a.h + h) * a.d + d] *
           k[((b * a.s + s) * a.h + h) * a.d + d];
    l = l * scale + bias[((b * a.h + h) * a.t + t) * a.s + s];
    if (causal && s > t) l = -INFINITY;
    (*p)[s] = l;
    m = std::max(m, l);
  }
  float z = 0.0f;
  for (int64_t s = 0; s < a.s; ++s) z += ((*p)[s] = std::exp((*p)[s] - m));
  for (int64_t s = 0; s < a.s; ++s) (*p)[s] /= z;
}

ffi::Error AttentionFwd(F32 q, F32 k, F32 v, F32 bias, R32 out, float scale,
                        int32_t is_causal) {
  AttnDims a = Dims(q, k, v);
  std::vector<float> p(a.s);
  const float* pv = v.typed_data();
  float* po = out->typed_data();
  for (int64_t b = 0; b < a.b; ++b)
    for (int64_t t = 0; t < a.t; ++t)
      for (int64_t h = 0; h < a.h; ++h) {
        Weights(a, q.typed_data(), k.typed_data(), bias.typed_data(), scale,
                is_causal, b, t, h, &p);
        for (int64_t e = 0; e < a.dv; ++e) {
          float o = 0.0f;
          for (int64_t s = 0; s < a.s; ++s)
            o += p[s] * pv[((b * a.s + s) * a.h + h) * a.dv + e];
          po[((b * a.t + t) * a.h + h) * a.dv + e] = o;
        }
      }
  return ffi::Error::Success();
}

ffi::Error AttentionBwd(F32 q, F32 k, F32 v, F32 bias, F32 dout, R32 dq,
                        R32 dk, R32 dv, float scale, int32_t is_causal) {
  AttnDims a = Dims(q, k, v);
  std::vector<float> p(a.s), dp(a.s);
  const float *pq = q.typed_data(), *pk = k.typed_data(),
              *pv = v.typed_data(), *pg = dout.typed_data();
  float *pdq = dq->typed_data(), *pdk = dk->typed_data(),
        *pdv = dv->typed_data();
  std::fill(pdq, pdq + q.element_count(), 0.0f);
  std::fill(pdk, pdk + k.element_count(), 0.0f);
  std::fill(pdv, pdv + v.element_count(), 0.0f);
  for (int64_t b = 0; b < a.b; ++b)
    for (int64_t t = 0; t < a.t; ++t)
      for (int64_t h = 0; h < a.h; ++h) {
        Weights(a, pq, pk, bias.typed_data(), scale, is_causal, b, t, h, &p);
        const float* g = pg + ((b * a.t + t) * a.h + h) * a.dv;
        float sum = 0.0f;  // sum_s p[s] * dp[s]
        for (int64_t s = 0; s < a.s; ++s) {
          const float* vs = pv + ((b * a.s + s) * a.h + h) * a.dv;
          float* dvs = pdv + ((b * a.s + s) * a.h + h) * a.dv;
          float d = 0.0f;
          for (int64_t e = 0; e < a.dv; ++e) {
            d += g[e] * vs[e];
            dvs[e] += p[s] * g[e];
          }
          dp[s] = d;
          sum += p[s] * d;
        }
        for (int64_t s = 0; s < a.s; ++s) {
          const float dl = p[s] * (dp[s] - sum) * scale;  // d logit
          for (int64_t d = 0; d < a.d; ++d) {
            const int64_t qi = ((b * a.t + t) * a.h + h) * a.d + d;
            const int64_t ki = ((b * a.s + s) * a.h + h) * a.d + d;
            pdq[qi] += dl * pk[ki];
            pdk[ki] += dl * pq[qi];
          }
        }
      }
  return ffi::Error::Success();
}

// ---------------------------------------------------------- cross-entropy
// (logits [R, C], labels int32 [R]) -> losses [R] (per example);
// backward (logits, labels, dlosses) -> dlogits.
ffi::Error CrossEntropyFwd(F32 logits, ffi::Buffer<ffi::S32> labels,
                           R32 losses) {
  int64_t r, c;
  RowsCols(logits, &r, &c);
  const float* pl = logits.typed_data();
  const int32_t* py = labels.typed_data();
  float* po = losses->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    const float* row = pl + i * c;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < c; ++j) m = std::max(m, row[j]);
    for (int64_t j = 0; j < c; ++j) s += std::exp(row[j] - m);
    if (py[i] < 0 || py[i] >= c) {
      return ffi::Error::InvalidArgument("MyCrossEntropy: label out of range");
    }
    po[i] = m + std::log(s) - row[py[i]];
  }
  return ffi::Error::Success();
}

ffi::Error CrossEntropyBwd(F32 logits, ffi::Buffer<ffi::S32> labels,
                           F32 dlosses, R32 dlogits) {
  int64_t r, c;
  RowsCols(logits, &r, &c);
  const float *pl = logits.typed_data(), *pg = dlosses.typed_data();
  const int32_t* py = labels.typed_data();
  float* pd = dlogits->typed_data();
  for (int64_t i = 0; i < r; ++i) {
    const float* row = pl + i * c;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = 0; j < c; ++j) m = std::max(m, row[j]);
    for (int64_t j = 0; j < c; ++j) s += std::exp(row[j] - m);
    for (int64_t j = 0; j < c; ++j)
      pd[i * c + j] = pg[i] * (std::exp(row[j] - m) / s - (j == py[i]));
  }
  return ffi::Error::Success();
}

}  // namespace

#define CONV_ATTRS                                                  \
  .Attr<int32_t>("stride_h").Attr<int32_t>("stride_w")              \
      .Attr<int32_t>("pad_top").Attr<int32_t>("pad_bottom")         \
      .Attr<int32_t>("pad_left").Attr<int32_t>("pad_right")

XLA_FFI_DEFINE_HANDLER_SYMBOL(MyConv2d, Conv2dFwd,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>()
                                  CONV_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyConv2dBwd, Conv2dBwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<F32>().Arg<F32>()
                                  .Ret<F32>().Ret<F32>() CONV_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(MySoftmax, RowSoftmax<false>,
                              ffi::Ffi::Bind().Arg<F32>().Ret<F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MySoftmaxBwd, RowSoftmaxBwd<false>,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyLogSoftmax, RowSoftmax<true>,
                              ffi::Ffi::Bind().Arg<F32>().Ret<F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyLogSoftmaxBwd, RowSoftmaxBwd<true>,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyLayerNorm, LayerNormFwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<F32>().Arg<F32>()
                                  .Ret<F32>().Attr<float>("eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyLayerNormBwd, LayerNormBwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<F32>().Arg<F32>()
                                  .Ret<F32>().Ret<F32>().Ret<F32>()
                                  .Attr<float>("eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyRmsNorm, RmsNormFwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<F32>().Ret<F32>()
                                  .Attr<float>("eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyRmsNormBwd, RmsNormBwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<F32>().Arg<F32>()
                                  .Ret<F32>().Ret<F32>().Attr<float>("eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyGelu, GeluFwd,
                              ffi::Ffi::Bind().Arg<F32>().Ret<F32>()
                                  .Attr<int32_t>("approximate"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyGeluBwd, GeluBwd,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>()
                                  .Attr<int32_t>("approximate"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyAttention, AttentionFwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<F32>().Arg<F32>().Arg<F32>()
                                  .Ret<F32>().Attr<float>("scale")
                                  .Attr<int32_t>("is_causal"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyAttentionBwd, AttentionBwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<F32>().Arg<F32>().Arg<F32>()
                                  .Arg<F32>().Ret<F32>().Ret<F32>().Ret<F32>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("is_causal"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyCrossEntropy, CrossEntropyFwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyCrossEntropyBwd, CrossEntropyBwd,
                              ffi::Ffi::Bind()
                                  .Arg<F32>().Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<F32>().Ret<F32>());
