#!/usr/bin/env bash
# Builds and checks the ROCm (HIP) library of the kernels under test,
# installing the compiler first when it is missing (as ensure_chromium.sh
# does for the browser test). The build and its checks are
# peat_jax/kernels/csrc/hip/build_rocm.sh (shipped with the package, which
# installs nothing); this script adds only the install:
#
#   bash scripts/build_hip.sh [-o OUT.so] [--strict] [--no-stand-in] [ARCH ...]
#
# Same arguments, environment and exit status as build_rocm.sh (default:
# gfx90a gfx942 into peat_jax/kernels/_peat_kernels_rocm.so; run
# `bash scripts/build_hip.sh --help`). When build_rocm.sh finds no hipcc and
# we are root with apt-get, installs Debian's hipcc and libamdhip64-dev
# (ROCm 5.2 on bookworm; log: /tmp/peat_hip_install.log); otherwise, or with
# PEAT_HIP_NO_INSTALL=1, says so and exits 3. The library is compiled, not
# run: running it needs an AMD GPU and a ROCm jaxlib.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/peat_jax/kernels/csrc/hip/build_rocm.sh"
LOG=/tmp/peat_hip_install.log

rc=0
bash "$BUILD" --compiler >/dev/null 2>&1 || rc=$?
if [[ $rc == 3 ]]; then
  why=""
  if [[ "${PEAT_HIP_NO_INSTALL:-0}" == 1 ]]; then
    why="PEAT_HIP_NO_INSTALL=1"
  elif [[ "$(id -u)" != 0 ]]; then
    why="not root"
  elif ! command -v apt-get >/dev/null; then
    why="no apt-get"
  fi
  if [[ -n "$why" ]]; then
    echo "[peat hip] error: no hipcc and cannot install it ($why): install ROCm, or on Debian 'sudo apt-get install hipcc libamdhip64-dev'" >&2
    exit 3
  fi
  echo "[peat hip] no hipcc: installing Debian's hipcc and libamdhip64-dev (log: $LOG)"
  start=$SECONDS
  if ! ( apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y hipcc libamdhip64-dev ) \
      >"$LOG" 2>&1; then
    echo "[peat hip] error: 'apt-get install hipcc libamdhip64-dev' failed (see $LOG)" >&2
    exit 3
  fi
  echo "[peat hip] installed in $((SECONDS - start)) s"
fi
exec bash "$BUILD" "$@"
