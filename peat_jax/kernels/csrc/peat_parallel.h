// Deterministic work sharing for the CPU handlers: a call is cut into units
// that depend only on its shapes, every unit is computed whole by one thread,
// and threads (XLA's intra-op pool, reached through the FFI ThreadPool
// context) only decide who computes which unit. Results are therefore
// bitwise identical whatever the thread timing or the number of threads.

#ifndef PEAT_JAX_KERNELS_CSRC_PEAT_PARALLEL_H_
#define PEAT_JAX_KERNELS_CSRC_PEAT_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "peat_cpu.h"
#include "xla/ffi/api/ffi.h"

namespace peat {

namespace parallel_internal {

// State shared with pool tasks; owned jointly so that a task that starts
// after the call returned finds no unit left and touches nothing else (in
// particular not the caller's function object, which lives on its stack).
struct Shared {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t units = 0;
  unsigned fp_mode = 0;  // the caller's MXCSR (GetFpMode), copied to tasks
  void (*call)(void*, int64_t) = nullptr;
  void* fn = nullptr;
};

inline void Work(Shared& sh) {
  for (;;) {
    const int64_t u = sh.next.fetch_add(1, std::memory_order_relaxed);
    if (u >= sh.units) return;
    sh.call(sh.fn, u);
    sh.done.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace parallel_internal

// Whether a product of `flops` floating-point operations is worth sharing
// among threads: below about 1 MFLOP a task hand-off costs more than it
// saves. The GEMM core and the batched matmul decide with this one rule.
inline bool WorthSharing(double flops) { return flops >= 1.0e6; }

// Runs fn(u) for every u in [0, units): on the calling thread and, when
// `pool` is given and `parallel` is true, on up to (cores - 1) tasks of the
// pool. Returns once every unit is done. fn must not throw.
template <typename Fn>
void ParallelFor(ffi::ThreadPool* pool, int64_t units, bool parallel,
                 Fn&& fn) {
  using parallel_internal::Shared;
  if (units <= 0) return;
  auto sh = std::make_shared<Shared>();
  sh->units = units;
  sh->fp_mode = GetFpMode();
  sh->fn = static_cast<void*>(&fn);
  sh->call = [](void* f, int64_t u) { (*static_cast<Fn*>(f))(u); };
  if (pool != nullptr && parallel && units > 1) {
    const int64_t cores =
        std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t extra =
        std::min<int64_t>({pool->num_threads(), cores - 1, units - 1});
    for (int64_t i = 0; i < extra; ++i) {
      pool->Schedule([sh]() {
        const unsigned saved = GetFpMode();
        SetFpMode(sh->fp_mode);
        parallel_internal::Work(*sh);
        SetFpMode(saved);
      });
    }
  }
  parallel_internal::Work(*sh);
  while (sh->done.load(std::memory_order_acquire) < sh->units) {
    std::this_thread::yield();
  }
}

}  // namespace peat

#endif  // PEAT_JAX_KERNELS_CSRC_PEAT_PARALLEL_H_
