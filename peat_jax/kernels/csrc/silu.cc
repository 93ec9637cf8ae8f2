// SiLU / SwiGLU kernels under test (CPU, XLA FFI), elementwise.
//
//   peat_silu_fwd(x [, up]) -> y              y = silu(x) [* up]
//   peat_silu_bwd(dy, x [, up]) -> dx [, dup]
//
// silu(x) = x * sigmoid(x), float32 inside, rounded once to y's dtype. With
// the optional operand `up` (the SwiGLU up projection, x the gate) y =
// silu(x) * up; x, up, dy and the results share one shape (vmap with
// broadcast_all gives them equal leading dims). The backward is the exact
// gradient of the variant's own formula (the bf16 variant rounds each of its
// operations to bfloat16 there too). Attribute: variant (int32).
//
// Variants (llama_body.h):
//   default   x / (1 + exp(-x)) in float32
//   tanh      x * 0.5 * (1 + tanh(x / 2)) in float32
//   bf16      every operation rounded to bfloat16 (silu computed in bf16)
//   fast_exp  the cubic 2^f exp of peat_numerics.h's FastExp
//   swapped   silu(up) * x: the gate and up projections swapped (without up
//             it is default)

#include <cstdint>
#include <string>

#include "llama_body.h"
#include "peat_cpu.h"
#include "peat_numerics.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

ffi::Error Fail(const std::string& what) {
  return ffi::Error::InvalidArgument("peat silu: " + what);
}

ffi::Error DtypeError() {
  return Fail("supported dtypes are float32, bfloat16, float16");
}

// The optional `up` operand (0 or 1 remaining argument).
ffi::Error OptionalUp(const ffi::RemainingArgs& rest, const ffi::AnyBuffer& x,
                      bool* gated, ffi::AnyBuffer* up, Elem* tu) {
  if (rest.size() > 1) {
    return Fail("expected x and at most one more operand (up), got " +
                std::to_string(1 + rest.size()));
  }
  *gated = rest.size() == 1;
  if (!*gated) return ffi::Error::Success();
  auto b = rest.get<ffi::AnyBuffer>(0);
  if (b.has_error()) return b.error();
  *up = *b;
  if (!(up->dimensions() == x.dimensions())) {
    return Fail("up must have x's shape, got " + DimsString(up->dimensions()) +
                " and " + DimsString(x.dimensions()));
  }
  if (!ToElem(up->element_type(), tu)) return DtypeError();
  return ffi::Error::Success();
}

ffi::Error SiluFwdImpl(ffi::AnyBuffer x, ffi::RemainingArgs rest,
                       ffi::Result<ffi::AnyBuffer> y, int32_t variant) {
  ScopedIeeeSubnormals ieee;
  if (!llama::IsSiluVariant(variant)) {
    return Fail("unknown variant code " + std::to_string(variant));
  }
  Elem tx, ty, tu = Elem::kF32;
  if (!ToElem(x.element_type(), &tx) || !ToElem(y->element_type(), &ty)) {
    return DtypeError();
  }
  bool gated;
  ffi::AnyBuffer up = x;
  if (auto e = OptionalUp(rest, x, &gated, &up, &tu); e.failure()) return e;
  if (!(y->dimensions() == x.dimensions())) {
    return Fail("y must have x's shape " + DimsString(x.dimensions()));
  }
  const int64_t n = static_cast<int64_t>(x.element_count());
  const bool swap = variant == kSwapped && gated;
  const int32_t v = variant == kSwapped ? kDefault : variant;
  for (int64_t i = 0; i < n; ++i) {
    const float xv = LoadElem(x.untyped_data(), i, tx);
    const float uv = gated ? LoadElem(up.untyped_data(), i, tu) : 0.0f;
    const float out = swap ? llama::SiluFwd(v, uv, xv, true)
                           : llama::SiluFwd(v, xv, uv, gated);
    StoreElem(y->untyped_data(), i, ty, out, Rounding::kNearest, false);
  }
  return ffi::Error::Success();
}

ffi::Error SiluBwdImpl(ffi::AnyBuffer dy, ffi::AnyBuffer x,
                       ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> dx,
                       ffi::RemainingRets rest_out, int32_t variant) {
  ScopedIeeeSubnormals ieee;
  if (!llama::IsSiluVariant(variant)) {
    return Fail("unknown variant code " + std::to_string(variant));
  }
  Elem tdy, tx, tdx, tu = Elem::kF32, tdu = Elem::kF32;
  if (!ToElem(dy.element_type(), &tdy) || !ToElem(x.element_type(), &tx) ||
      !ToElem(dx->element_type(), &tdx)) {
    return DtypeError();
  }
  bool gated;
  ffi::AnyBuffer up = x;
  if (auto e = OptionalUp(rest, x, &gated, &up, &tu); e.failure()) return e;
  if (rest_out.size() != (gated ? 1u : 0u)) {
    return Fail("expected one result per operand (dx, and dup with up)");
  }
  if (!(dy.dimensions() == x.dimensions()) ||
      !(dx->dimensions() == x.dimensions())) {
    return Fail("dy and dx must have x's shape " + DimsString(x.dimensions()));
  }
  void* dup = nullptr;
  if (gated) {
    auto r = rest_out.get<ffi::AnyBuffer>(0);
    if (r.has_error()) return r.error();
    ffi::Result<ffi::AnyBuffer> res = *r;
    if (!ToElem(res->element_type(), &tdu)) return DtypeError();
    if (!(res->dimensions() == x.dimensions())) {
      return Fail("dup must have x's shape " + DimsString(x.dimensions()));
    }
    dup = res->untyped_data();
  }
  const int64_t n = static_cast<int64_t>(x.element_count());
  const bool swap = variant == kSwapped && gated;
  const int32_t v = variant == kSwapped ? kDefault : variant;
  for (int64_t i = 0; i < n; ++i) {
    const float g = LoadElem(dy.untyped_data(), i, tdy);
    const float xv = LoadElem(x.untyped_data(), i, tx);
    const float uv = gated ? LoadElem(up.untyped_data(), i, tu) : 0.0f;
    float da = 0.0f, db = 0.0f;
    if (swap) {  // y = silu(up) * x: a = up, b = x
      llama::SiluBwd(v, uv, xv, true, g, &da, &db);
      StoreElem(dx->untyped_data(), i, tdx, db, Rounding::kNearest, false);
      StoreElem(dup, i, tdu, da, Rounding::kNearest, false);
    } else {
      llama::SiluBwd(v, xv, uv, gated, g, &da, &db);
      StoreElem(dx->untyped_data(), i, tdx, da, Rounding::kNearest, false);
      if (gated) StoreElem(dup, i, tdu, db, Rounding::kNearest, false);
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatSiluFwd);
PEAT_EXPORT_HANDLER(PeatSiluBwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatSiluFwd, peat::SiluFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("variant"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatSiluBwd, peat::SiluBwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .RemainingRets()
                                  .Attr<int32_t>("variant"));
