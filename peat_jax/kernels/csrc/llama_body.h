// The arithmetic of the Llama-style kernels under test (rms_norm, silu,
// rope), shared by the CPU (.cc) and GPU (.cu, .hip) handlers so that every
// platform runs the same operations in the same order. Each function is the
// float32 computation of one variant; loads, stores and threading are the
// handlers'. Variant codes: peat_numerics.h (kPairwise, kHf, ...).

#ifndef PEAT_JAX_KERNELS_CSRC_LLAMA_BODY_H_
#define PEAT_JAX_KERNELS_CSRC_LLAMA_BODY_H_

#include <cmath>
#include <cstdint>

#include "peat_numerics.h"

namespace peat {
namespace llama {

// ------------------------------------------------------------------ rms_norm

constexpr float kRmsPortEps = 1e-5f;  // variant eps: the port's constant

PEAT_HD bool IsRmsNormVariant(int32_t v) {
  return v == kDefault || v == kPairwise || v == kHf || v == kAccBf16 ||
         v == kEps || v == kLayerNorm;
}

// term(lo) + ... + term(lo + n - 1) as a balanced binary tree of float
// additions (the left half has n / 2 terms).
template <typename F>
PEAT_HD float PairwiseSum(const F& term, int64_t lo, int64_t n) {
  if (n <= 0) return 0.0f;
  if (n == 1) return term(lo);
  const int64_t h = n / 2;
  return PairwiseSum(term, lo, h) + PairwiseSum(term, lo + h, n - h);
}

// term(0) + ... + term(n - 1) with the variant's accumulation: pairwise
// (tree), acc_bf16 (each term and each running sum rounded to bf16), else
// in float32, in order within runs of kSumBlock (BlockedSum).
template <typename F>
PEAT_HD float RowSum(int32_t variant, const F& term, int64_t n) {
  if (variant == kPairwise) return PairwiseSum(term, 0, n);
  float s = 0.0f;
  if (variant == kAccBf16) {
    for (int64_t i = 0; i < n; ++i) s = RoundBf16(s + RoundBf16(term(i)));
    return s;
  }
  return BlockedSum<float>(term, 0, n);
}

template <typename X>
struct CenteredSquare {
  const X& x;
  float m;
  PEAT_HD float operator()(int64_t i) const {
    const float c = x(i) - m;
    return c * c;
  }
};

// mean (layer_norm: the row mean; others 0) and rstd = 1 / sqrt(mean of
// squares of x - mean + eps) of one row x(0..d-1).
template <typename X>
PEAT_HD void RmsRowStats(int32_t variant, float eps, const X& x, int64_t d,
                         float* mean, float* rstd) {
  float m = 0.0f;
  if (variant == kLayerNorm) {
    m = BlockedSum<float>(x, 0, d) / static_cast<float>(d);
  }
  float ms = RowSum(variant, CenteredSquare<X>{x, m}, d) / static_cast<float>(d);
  if (variant == kAccBf16) ms = RoundBf16(ms);
  const float e = variant == kEps ? kRmsPortEps : eps;
  *mean = m;
  *rstd = 1.0f / std::sqrt(ms + e);
}

// The scale as the variant multiplies by it: hf rounds it to x's dtype.
PEAT_HD float RmsScale(int32_t variant, float s, Elem tx) {
  return variant == kHf ? RoundAs(s, tx) : s;
}

// One output element from x_i, the row's mean and rstd and the (RmsScale'd)
// scale: float32 x * (rstd * scale), or for hf (Hugging Face Llama)
// (x * rstd).to(x's dtype) * scale in x's dtype.
PEAT_HD float RmsOut(int32_t variant, float x, float mean, float rstd, float s,
                     Elem tx) {
  const float v = x - mean;
  if (variant == kHf) return RoundAs(RoundAs(v * rstd, tx) * s, tx);
  return v * (rstd * s);
}

// Backward terms of one element: xhat = (x - mean) * rstd, g = dy * scale,
// and the normalized value the forward multiplied the scale by (hf: xhat
// rounded to x's dtype), whose product with dy adds up to dscale.
struct RmsGrad {
  float xhat, g, n;
};

PEAT_HD RmsGrad RmsGradTerms(int32_t variant, float x, float dy, float s,
                             float mean, float rstd, Elem tx) {
  const float xhat = (x - mean) * rstd;
  return {xhat, dy * s, variant == kHf ? RoundAs(xhat, tx) : xhat};
}

// dscale accumulation over rows (acc_bf16: rounded to bf16 at each add).
PEAT_HD float RmsAddScaleGrad(int32_t variant, float acc, float dy, float n) {
  const float p = dy * n;
  return variant == kAccBf16 ? RoundBf16(acc + p) : acc + p;
}

// dx_i = rstd * (g_i - mean(g) [layer_norm only] - xhat_i * mean(g * xhat)).
PEAT_HD float RmsDx(float rstd, float g, float xhat, float mean_g,
                    float mean_gx) {
  return rstd * (g - mean_g - xhat * mean_gx);
}

// ---------------------------------------------------------------------- silu

PEAT_HD bool IsSiluVariant(int32_t v) {
  return v == kDefault || v == kTanh || v == kBf16 || v == kFastExp ||
         v == kSwapped;
}

// silu(x) in float32 in the variant's closed form.
PEAT_HD float SiluF32(int32_t variant, float x) {
  if (variant == kTanh) return (x * 0.5f) * (1.0f + std::tanh(x * 0.5f));
  if (variant == kFastExp) return x / (1.0f + FastExp(-x));
  return x / (1.0f + std::exp(-x));
}

// sigmoid(x) in the same closed form (for the derivative).
PEAT_HD float SigmoidF32(int32_t variant, float x) {
  if (variant == kTanh) return 0.5f * (1.0f + std::tanh(x * 0.5f));
  if (variant == kFastExp) return 1.0f / (1.0f + FastExp(-x));
  return 1.0f / (1.0f + std::exp(-x));
}

// silu(a) [* b when gated]; bf16 rounds every operation to bfloat16.
PEAT_HD float SiluFwd(int32_t variant, float a, float b, bool gated) {
  if (variant == kBf16) {
    const float xb = RoundBf16(a);
    const float d = RoundBf16(1.0f + RoundBf16(std::exp(-xb)));
    const float s = RoundBf16(xb / d);
    return gated ? RoundBf16(s * RoundBf16(b)) : s;
  }
  const float s = SiluF32(variant, a);
  return gated ? s * b : s;
}

// Gradient of SiluFwd: da = dy * b * silu'(a) (ungated: dy * silu'(a)),
// db = dy * silu(a). silu'(a) = sig(a) * (1 + a * (1 - sig(a))) with the
// variant's sigmoid; bf16 rounds every operation to bfloat16.
PEAT_HD void SiluBwd(int32_t variant, float a, float b, bool gated, float dy,
                     float* da, float* db) {
  if (variant == kBf16) {
    const float xb = RoundBf16(a), g = RoundBf16(dy);
    const float d = RoundBf16(1.0f + RoundBf16(std::exp(-xb)));
    const float sig = RoundBf16(1.0f / d);
    const float ds = RoundBf16(
        sig * RoundBf16(1.0f + RoundBf16(xb * RoundBf16(1.0f - sig))));
    if (gated) {
      *da = RoundBf16(RoundBf16(g * RoundBf16(b)) * ds);
      *db = RoundBf16(g * RoundBf16(xb / d));
    } else {
      *da = RoundBf16(g * ds);
    }
    return;
  }
  const float sig = SigmoidF32(variant, a);
  const float ds = sig * (1.0f + a * (1.0f - sig));
  if (gated) {
    *da = (dy * b) * ds;
    *db = dy * SiluF32(variant, a);
  } else {
    *da = dy * ds;
  }
}

// ---------------------------------------------------------------------- rope

constexpr float kRopeBase500k = 500000.0f;  // variant theta_500k

PEAT_HD bool IsRopeVariant(int32_t v) {
  return v == kDefault || v == kHf || v == kInterleaved || v == kTheta500k ||
         v == kOffset;
}

// inv_freq[i] = theta ** (-2i / D): correctly rounded from double, or for
// hf as Hugging Face computes it, 1.0 / (base ** (float(2i) / D)) in float32.
PEAT_HD float RopeInvFreq(int32_t variant, float theta, int64_t i, int64_t d) {
  const float base = variant == kTheta500k ? kRopeBase500k : theta;
  if (variant == kHf) {
    return 1.0f / powf(base, static_cast<float>(2 * i) / static_cast<float>(d));
  }
  return static_cast<float>(
      pow(static_cast<double>(base),
          -2.0 * static_cast<double>(i) / static_cast<double>(d)));
}

// The position the variant rotates by (offset: one too far).
PEAT_HD float RopePosition(int32_t variant, int32_t p) {
  const int64_t q = static_cast<int64_t>(p) + (variant == kOffset ? 1 : 0);
  return static_cast<float>(q);
}

// cos and sin of the float32 angle position * inv_freq; sign -1 gives the
// inverse rotation (backward); hf rounds both to x's dtype.
PEAT_HD void RopeCosSin(int32_t variant, float pos, float inv_freq, float sign,
                        Elem tx, float* c, float* s) {
  const float angle = pos * inv_freq;
  *c = std::cos(angle);
  *s = sign * std::sin(angle);
  if (variant == kHf) {
    *c = RoundAs(*c, tx);
    *s = RoundAs(*s, tx);
  }
}

// The rotated pair: oa = xa * c - xb * s, ob = xb * c + xa * s, in float32,
// or for hf (q * cos + rotate_half(q) * sin) every operation in x's dtype.
PEAT_HD void RopeRotate(int32_t variant, Elem tx, float xa, float xb, float c,
                        float s, float* oa, float* ob) {
  if (variant == kHf) {
    *oa = RoundAs(RoundAs(xa * c, tx) - RoundAs(xb * s, tx), tx);
    *ob = RoundAs(RoundAs(xb * c, tx) + RoundAs(xa * s, tx), tx);
    return;
  }
  *oa = xa * c - xb * s;
  *ob = xb * c + xa * s;
}

// Offsets (within a head of D) of the i-th rotated pair: the two halves
// (GPT-NeoX / Llama-HF) or adjacent elements (interleaved, GPT-J).
PEAT_HD void RopePair(int32_t variant, int64_t i, int64_t d, int64_t* a,
                      int64_t* b) {
  if (variant == kInterleaved) {
    *a = 2 * i;
    *b = 2 * i + 1;
  } else {
    *a = i;
    *b = i + d / 2;
  }
}

}  // namespace llama
}  // namespace peat

#endif  // PEAT_JAX_KERNELS_CSRC_LLAMA_BODY_H_
