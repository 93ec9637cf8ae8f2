// What every XLA FFI handler of peat_jax shares, CPU and GPU alike: the
// exported-symbol macro and the FFI dtype -> kernel element type mapping.

#ifndef PEAT_JAX_KERNELS_CSRC_PEAT_FFI_H_
#define PEAT_JAX_KERNELS_CSRC_PEAT_FFI_H_

#include "peat_numerics.h"
#include "xla/ffi/api/ffi.h"

// Handler symbols are looked up by name from Python (ctypes), so they keep
// default visibility although the library is built with -fvisibility=hidden.
#define PEAT_EXPORT_HANDLER(name) \
  extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* name( \
      XLA_FFI_CallFrame* call_frame)

namespace peat {

namespace ffi = xla::ffi;

// Maps an FFI dtype to the kernels' element type; false if unsupported.
inline bool ToElem(ffi::DataType t, Elem* out) {
  switch (t) {
    case ffi::DataType::F32:
      *out = Elem::kF32;
      return true;
    case ffi::DataType::BF16:
      *out = Elem::kBf16;
      return true;
    case ffi::DataType::F16:
      *out = Elem::kF16;
      return true;
    default:
      return false;
  }
}

}  // namespace peat

#endif  // PEAT_JAX_KERNELS_CSRC_PEAT_FFI_H_
