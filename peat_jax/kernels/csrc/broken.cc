// Deliberately broken kernels under test (CPU, XLA FFI), for reliability
// tests of campaigns (docs/reliability.md): a kernel that crashes the
// process, hangs or exhausts memory instead of computing.
//
//   peat_broken_fwd(x, w) -> out (any shape; never computed)
//
// Attribute: mode (int32)
//   1 crash_segv   writes through an invalid pointer: SIGSEGV
//   2 crash_abort  prints a message and calls abort(): SIGABRT
//   3 hang         sleeps in a loop until the process is killed
//   4 oom          allocates and touches 64 MiB blocks until an allocation
//                  fails or a safety cap is reached (PEAT_BROKEN_OOM_CAP_MB,
//                  default 2048), then frees them and returns
//                  RESOURCE_EXHAUSTED. Under process isolation the worker's
//                  memory limit kills it first.
//
// The Python side (kernels/kut.py) calls it only at the sites a broken spec
// selects; every other site runs the golden kernel.

#include <signal.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "peat_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace peat {
namespace {

constexpr int32_t kCrashSegv = 1;
constexpr int32_t kCrashAbort = 2;
constexpr int32_t kHang = 3;
constexpr int32_t kOom = 4;
constexpr size_t kBlock = size_t{64} << 20;

// An address the compiler cannot prove invalid, so the store is emitted as
// a real memory access (a constant null store may be turned into a trap).
volatile uintptr_t g_bad_address = 16;

int64_t OomCapMb() {
  const char* env = std::getenv("PEAT_BROKEN_OOM_CAP_MB");
  if (env == nullptr || *env == '\0') return 2048;
  const long long v = std::atoll(env);
  return v > 0 ? v : 2048;
}

ffi::Error Oom() {
  const int64_t cap = OomCapMb();
  std::vector<void*> blocks;
  int64_t mb = 0;
  bool failed = false;
  while (mb < cap) {
    void* p = std::malloc(kBlock);
    if (p == nullptr) {
      failed = true;
      break;
    }
    std::memset(p, 0x5a, kBlock);  // touch every page: resident memory
    blocks.push_back(p);
    mb += static_cast<int64_t>(kBlock >> 20);
  }
  for (void* p : blocks) std::free(p);
  return ffi::Error(
      ffi::ErrorCode::kResourceExhausted,
      "peat broken kernel oom: out of memory after allocating " +
          std::to_string(mb) + " MiB (" +
          (failed ? std::string("allocation failed")
                  : "safety cap PEAT_BROKEN_OOM_CAP_MB=" +
                        std::to_string(cap) + " reached") +
          ")");
}

ffi::Error BrokenFwdImpl(ffi::AnyBuffer x, ffi::AnyBuffer w,
                         ffi::Result<ffi::AnyBuffer> out, int32_t mode) {
  (void)x;
  (void)w;
  (void)out;
  switch (mode) {
    case kCrashSegv:
      *reinterpret_cast<volatile float*>(g_bad_address) = 1.0f;
      raise(SIGSEGV);  // not reached: the store faults
      break;
    case kCrashAbort:
      std::fprintf(stderr, "peat broken kernel crash_abort: abort()\n");
      std::fflush(stderr);
      std::abort();
    case kHang: {
      const timespec nap{0, 50 * 1000 * 1000};
      for (;;) nanosleep(&nap, nullptr);
    }
    case kOom:
      return Oom();
    default:
      break;
  }
  return ffi::Error::InvalidArgument("peat broken kernel: unknown mode " +
                                     std::to_string(mode) +
                                     "; expected 1 (crash_segv), 2 "
                                     "(crash_abort), 3 (hang) or 4 (oom)");
}

}  // namespace
}  // namespace peat

PEAT_EXPORT_HANDLER(PeatBrokenFwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PeatBrokenFwd, peat::BrokenFwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("mode"));
