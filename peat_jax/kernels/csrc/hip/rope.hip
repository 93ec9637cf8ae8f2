// HIP (ROCm) build of ../rope.cu: the CUDA source is written against the
// gpu* aliases of peat_gpu.h, which map to HIP when PEAT_GPU_HIP is defined.
// Handlers register for platform "ROCM". Build: see build_rocm.sh / BUILD.md.
#define PEAT_GPU_HIP 1
#include "../rope.cu"
