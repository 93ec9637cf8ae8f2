// A minimal kernel under test as an XLA FFI library: a float32 batched
// matmul and its backward, with the dot_general calling convention of
// peat_jax's ffi: KUT specs (docs/kernels.md). Copy it, put your kernel in
// MatmulFwd / MatmulBwd, build, validate:
//
//   g++ -std=c++17 -O2 -fPIC -shared \
//       -isystem "$(python -c 'import jax.ffi; print(jax.ffi.include_dir())')" \
//       ffi_matmul.cc -o libffi_matmul.so
//   python -m peat_jax.tools.validate --scenario=gpt \
//       --kut=ffi:./libffi_matmul.so:MyMatmul:MyMatmulBwd --kernel=dot_general
//
// Convention (dot_general): every forward dot_general site is brought to a
// batched matmul by peat_jax (free, contracting and batch dims from the
// site's dimension numbers), so the handler sees
//   forward:  a [B, M, K], b [B, K, N]            -> c [B, M, N]
//   backward: a [B, M, K], b [B, K, N], dc [B, M, N] -> da [B, M, K], db [B, K, N]
// row-major, in the site's dtype (here float32 only: a bfloat16 site gets a
// clear error naming the site), no attributes.

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// (B, M, K, N) of the operands, or an error naming what is wrong.
ffi::Error Dims(const ffi::Buffer<ffi::F32>& a, const ffi::Buffer<ffi::F32>& b,
                int64_t* bs, int64_t* m, int64_t* k, int64_t* n) {
  auto da = a.dimensions(), db = b.dimensions();
  if (da.size() != 3 || db.size() != 3 || da[0] != db[0] || da[2] != db[1]) {
    return ffi::Error::InvalidArgument(
        "MyMatmul: expected a [B, M, K] and b [B, K, N]");
  }
  *bs = da[0], *m = da[1], *k = da[2], *n = db[2];
  return ffi::Error::Success();
}

ffi::Error MatmulFwd(ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                     ffi::ResultBuffer<ffi::F32> c) {
  int64_t bs, m, k, n;
  if (auto err = Dims(a, b, &bs, &m, &k, &n); err.failure()) return err;
  const float *pa = a.typed_data(), *pb = b.typed_data();
  float* pc = c->typed_data();
  for (int64_t t = 0; t < bs; ++t) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float s = 0.0f;  // float32 accumulation, k in order
        for (int64_t p = 0; p < k; ++p) {
          s += pa[(t * m + i) * k + p] * pb[(t * k + p) * n + j];
        }
        pc[(t * m + i) * n + j] = s;
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error MatmulBwd(ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                     ffi::Buffer<ffi::F32> dc, ffi::ResultBuffer<ffi::F32> da,
                     ffi::ResultBuffer<ffi::F32> db) {
  int64_t bs, m, k, n;
  if (auto err = Dims(a, b, &bs, &m, &k, &n); err.failure()) return err;
  const float *pa = a.typed_data(), *pb = b.typed_data(),
              *pd = dc.typed_data();
  float *pda = da->typed_data(), *pdb = db->typed_data();
  for (int64_t t = 0; t < bs; ++t) {
    for (int64_t i = 0; i < m; ++i) {      // da = dc @ b^T
      for (int64_t p = 0; p < k; ++p) {
        float s = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          s += pd[(t * m + i) * n + j] * pb[(t * k + p) * n + j];
        }
        pda[(t * m + i) * k + p] = s;
      }
    }
    for (int64_t p = 0; p < k; ++p) {      // db = a^T @ dc
      for (int64_t j = 0; j < n; ++j) {
        float s = 0.0f;
        for (int64_t i = 0; i < m; ++i) {
          s += pa[(t * m + i) * k + p] * pd[(t * m + i) * n + j];
        }
        pdb[(t * k + p) * n + j] = s;
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace

// The symbols the spec names: ffi:<library>:MyMatmul:MyMatmulBwd.
XLA_FFI_DEFINE_HANDLER_SYMBOL(MyMatmul, MatmulFwd,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // a
                                  .Arg<ffi::Buffer<ffi::F32>>()   // b
                                  .Ret<ffi::Buffer<ffi::F32>>()); // c

XLA_FFI_DEFINE_HANDLER_SYMBOL(MyMatmulBwd, MatmulBwd,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // a
                                  .Arg<ffi::Buffer<ffi::F32>>()   // b
                                  .Arg<ffi::Buffer<ffi::F32>>()   // dc
                                  .Ret<ffi::Buffer<ffi::F32>>()   // da
                                  .Ret<ffi::Buffer<ffi::F32>>()); // db
