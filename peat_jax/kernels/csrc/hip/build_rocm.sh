#!/usr/bin/env bash
# Builds peat_jax/kernels/_peat_kernels_rocm.so with hipcc (ROCm >= 6).
# Run from the repository root with the project's Python on PATH:
#   bash peat_jax/kernels/csrc/hip/build_rocm.sh [--offload-arch=gfx90a ...]
# Default arch: gfx90a (MI200) and gfx942 (MI300). -ffp-contract=off keeps
# the default variant unfused, as --fmad=false does for nvcc.
set -euo pipefail
ARCHS=("$@")
if [ ${#ARCHS[@]} -eq 0 ]; then
  ARCHS=(--offload-arch=gfx90a --offload-arch=gfx942)
fi
INCLUDE=$(python -c "import jax.ffi; print(jax.ffi.include_dir())")
CSRC=peat_jax/kernels/csrc
hipcc -shared -fPIC -std=c++17 -O3 -ffp-contract=off -fvisibility=hidden \
  -isystem "$INCLUDE" -I "$CSRC" "${ARCHS[@]}" \
  "$CSRC"/hip/matmul.hip "$CSRC"/hip/softmax.hip \
  "$CSRC"/hip/layer_norm.hip "$CSRC"/hip/conv2d.hip \
  -o peat_jax/kernels/_peat_kernels_rocm.so
echo "peat_jax: built peat_jax/kernels/_peat_kernels_rocm.so (${ARCHS[*]})"
