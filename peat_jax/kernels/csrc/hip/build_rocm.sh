#!/usr/bin/env bash
# Builds the ROCm (HIP) library of peat_jax's kernels under test from the
# .hip files next to this script and checks what it built. Compiling needs no
# AMD GPU; running the kernels does (this script never runs them). Needs a
# HIP-Clang hipcc; scripts/build_hip.sh (source tree) installs Debian's when
# it is missing, then runs this script. See BUILD.md, "ROCm (HIP)".
#
#   bash peat_jax/kernels/csrc/hip/build_rocm.sh [-o OUT.so] [--strict]
#        [--no-stand-in] [ARCH ...]
#   bash peat_jax/kernels/csrc/hip/build_rocm.sh --compiler   # find hipcc only
#
# ARCH: an AMD GPU processor (target ID), e.g. gfx90a (MI200: MI210/MI250),
# gfx942 (MI300X/MI300A); "--offload-arch=gfx90a" is accepted too. Default:
# gfx90a gfx942. Default output: _peat_kernels_rocm.so in peat_jax/kernels/.
#
# Per arch, the compiler is asked first (an empty HIP file compiled for it).
# An arch it rejects is NOT built and the script says so with the compiler's
# version; for gfx941/gfx942 (MI300) it then builds gfx940, the MI300-family
# ISA older compilers know, as a named stand-in (--no-stand-in: don't). The
# GPU loader runs a code object only on its exact processor, so a gfx940
# stand-in does not run on a gfx942 GPU: it only shows the sources compile for
# GFX9.4. --strict: exit 4 when any requested arch was not built.
#
# Checks after the build: the code objects in the fat binary (roc-obj-ls),
# each one's amdhsa.target note and exported kernel descriptors (llvm-readelf),
# the handler symbols of the .cu sources exported by the library (nm -D), and
# that these flags keep __fadd_rn(s, __fmul_rn(a, b)) unfused on each arch
# (HIP defines both as plain + and *, and HIP clang contracts by default).
#
# Environment: HIPCC (default: hipcc on PATH, else /opt/rocm/bin/hipcc),
# PEAT_PYTHON (a python with jax, for the XLA FFI headers; default: the first
# of <repo>/.venv/bin/python, python3, python that imports jax.ffi),
# PEAT_FFI_INCLUDE (the headers' directory, instead), PEAT_HIP_JOBS (parallel
# compiles, default 2).
#
# Exit status: 0 built and checked; 1 build or check failed; 2 bad usage;
# 3 no HIP compiler; 4 --strict and a requested arch not built.
set -euo pipefail

CSRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="$(cd "$CSRC/../../.." && pwd)"   # the repository, in a source tree
OUT="$(cd "$CSRC/.." && pwd)/_peat_kernels_rocm.so"
COMPILER_ONLY=0
JOBS="${PEAT_HIP_JOBS:-2}"
STRICT=0
STAND_INS=1
REQUESTED=()

say() { echo "[peat hip] $*"; }
die() { echo "[peat hip] error: $1" >&2; exit "${2:-1}"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    -o|--output) [[ $# -ge 2 ]] || die "$1 needs a path" 2; OUT="$2"; shift 2 ;;
    --strict) STRICT=1; shift ;;
    --compiler) COMPILER_ONLY=1; shift ;;
    --no-stand-in) STAND_INS=0; shift ;;
    --offload-arch=*) REQUESTED+=("${1#--offload-arch=}"); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    gfx*) REQUESTED+=("$1"); shift ;;
    *) die "unknown argument '$1' (see --help)" 2 ;;
  esac
done
[[ ${#REQUESTED[@]} -gt 0 ]] || REQUESTED=(gfx90a gfx942)
[[ "$OUT" = /* ]] || OUT="$PWD/$OUT"

# hipcc picks NVIDIA's nvcc when HIP_PLATFORM is unset and nvcc is on PATH
# (it is on this machine): this script builds the AMD library only.
if [[ -n "${HIP_PLATFORM:-}" && "$HIP_PLATFORM" != amd ]]; then
  die "HIP_PLATFORM=$HIP_PLATFORM: this script builds the AMD (ROCm) library; unset it or use amd" 2
fi
export HIP_PLATFORM=amd

# --- the compiler -----------------------------------------------------------
find_hipcc() {
  if [[ -n "${HIPCC:-}" ]]; then command -v "$HIPCC" || true; return; fi
  command -v hipcc || { [[ -x /opt/rocm/bin/hipcc ]] && echo /opt/rocm/bin/hipcc; } || true
}
HIPCC_BIN="$(find_hipcc)"
[[ -n "$HIPCC_BIN" ]] || die "no hipcc (\$HIPCC, PATH, /opt/rocm/bin): install ROCm, or on Debian 'apt-get install hipcc libamdhip64-dev' (in a source tree, scripts/build_hip.sh does that)" 3
HIPCC_DIR="$(dirname "$(readlink -f "$HIPCC_BIN")")"
HIP_VERSION="$("$HIPCC_BIN" --version 2>/dev/null | sed -n 's/^HIP version: //p' | sed -n 1p)"
CLANG_VERSION="$("$HIPCC_BIN" --version 2>/dev/null | grep -m1 -i 'clang version' || true)"
[[ -n "$CLANG_VERSION" ]] || die "$HIPCC_BIN --version names no clang (HIP_PLATFORM=amd): not a HIP-Clang hipcc"
COMPILER="hipcc $HIPCC_BIN (HIP ${HIP_VERSION:-?}, $CLANG_VERSION)"
if [[ $COMPILER_ONLY == 1 ]]; then echo "$COMPILER"; exit 0; fi

# Tools of the check: ROCm's roc-obj-ls (Debian: package hipcc) and an LLVM
# readelf that decodes AMDGPU notes.
find_tool() {
  local name
  for name in "$@"; do
    command -v "$name" 2>/dev/null && return
    for dir in "$HIPCC_DIR" /opt/rocm/bin /opt/rocm/llvm/bin; do
      [[ -x "$dir/$name" ]] && { echo "$dir/$name"; return; }
    done
  done
  return 1
}
ROC_OBJ_LS="$(find_tool roc-obj-ls)" || die "roc-obj-ls not found (ROCm; Debian package hipcc): cannot list the code objects"
CLANG_MAJOR="$(sed -n 's/.*clang version \([0-9]*\).*/\1/p' <<<"$CLANG_VERSION")"
READELF="$(find_tool "llvm-readelf-$CLANG_MAJOR" llvm-readelf)" || die "llvm-readelf not found: cannot read the code objects"

# --- XLA FFI headers --------------------------------------------------------
INCLUDE="${PEAT_FFI_INCLUDE:-}"
if [[ -z "$INCLUDE" ]]; then
  for py in "${PEAT_PYTHON:-}" "$ROOT/.venv/bin/python" python3 python; do
    [[ -n "$py" ]] && command -v "$py" >/dev/null || continue
    INCLUDE="$("$py" -c 'import jax.ffi; print(jax.ffi.include_dir())' 2>/dev/null)" && break
    INCLUDE=""
  done
fi
[[ -n "$INCLUDE" && -f "$INCLUDE/xla/ffi/api/ffi.h" ]] \
  || die "no XLA FFI headers: set PEAT_PYTHON to a python with jax (or PEAT_FFI_INCLUDE)"

# --- archs ------------------------------------------------------------------
# The nearest MI300 (GFX9.4) ISA for compilers that predate gfx941/gfx942.
declare -A STAND_IN=([gfx941]=gfx940 [gfx942]=gfx940)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
: > "$WORK/empty.hip"
supports() {  # the compiler accepts this target ID (device code only)
  "$HIPCC_BIN" -x hip --offload-arch="$1" --cuda-device-only -c "$WORK/empty.hip" \
    -o "$WORK/probe.o" >"$WORK/probe.log" 2>&1
}
BUILT=()     # target IDs built
LABEL=()     # how each is reported
MISSING=()   # requested, not built
STOOD_IN=()  # stand-in:requested
for arch in "${REQUESTED[@]}"; do
  if supports "$arch"; then
    [[ " ${BUILT[*]} " == *" $arch "* ]] || { BUILT+=("$arch"); LABEL+=("$arch"); }
    continue
  fi
  MISSING+=("$arch")
  say "NOT BUILT: $arch: this compiler cannot target it: $(grep -m1 error "$WORK/probe.log" || head -1 "$WORK/probe.log")"
  case "$arch" in
    gfx941*|gfx942*) need="a newer LLVM (gfx942 is in LLVM 17 and later, and in ROCm 6's compiler)" ;;
    *) need="a compiler whose AMDGPU backend knows $arch" ;;
  esac
  say "  compiler: $COMPILER; needed: $need"
  alt="${STAND_IN[$arch]:-}"
  if [[ $STAND_INS == 1 && -n "$alt" && " ${REQUESTED[*]} " != *" $alt "* ]] && supports "$alt"; then
    if [[ " ${BUILT[*]} " != *" $alt "* ]]; then BUILT+=("$alt"); LABEL+=("$alt[stand-in for $arch]"); STOOD_IN+=("$alt:$arch"); fi
    say "  building $alt instead as a STAND-IN for $arch: the MI300-family ISA this compiler knows; its code objects load only on $alt GPUs, not on $arch"
  fi
done
[[ ${#BUILT[@]} -gt 0 ]] || die "none of the requested archs (${REQUESTED[*]}) can be targeted by $COMPILER"
ARCH_FLAGS=()
for a in "${BUILT[@]}"; do ARCH_FLAGS+=("--offload-arch=$a"); done

# --- build ------------------------------------------------------------------
# The one compile line. -ffp-contract=off: the default variant stays unfused
# (as --fmad=false for nvcc); -fvisibility=hidden: only the handlers
# (PEAT_EXPORT_HANDLER) are exported; kernels stay visible to the loader.
FLAGS=(-std=c++17 -O3 -fPIC -ffp-contract=off -fvisibility=hidden
       -isystem "$INCLUDE" -I "$CSRC")
mapfile -t SOURCES < <(find "$CSRC/hip" -maxdepth 1 -name '*.hip' | LC_ALL=C sort)
[[ ${#SOURCES[@]} -gt 0 ]] || die "no .hip sources in $CSRC/hip"
say "compiler: $COMPILER"
say "targets:  ${LABEL[*]}   (requested: ${REQUESTED[*]})"
say "sources:  ${#SOURCES[@]} (${SOURCES[*]##*/}), $JOBS parallel compiles"
mkdir -p "$WORK/obj"
t0=$(date +%s.%N)
for src in "${SOURCES[@]}"; do
  obj="$WORK/obj/$(basename "$src" .hip).o"
  ( if "$HIPCC_BIN" "${FLAGS[@]}" "${ARCH_FLAGS[@]}" -c "$src" -o "$obj" \
        >"$obj.log" 2>&1; then echo 0; else echo 1; fi >"$obj.rc" ) &
  while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n || true; done
done
wait
failed=0
for src in "${SOURCES[@]}"; do
  if [[ "$(cat "$WORK/obj/$(basename "$src" .hip).o.rc")" != 0 ]]; then
    failed=1
    echo "[peat hip] compile FAILED: $src" >&2
  fi
done
for src in "${SOURCES[@]}"; do
  log="$WORK/obj/$(basename "$src" .hip).o.log"
  if [[ -s "$log" ]]; then echo "--- compiler output for $(basename "$src"):"; cat "$log"; fi
done
[[ $failed == 0 ]] || die "compile failed (compiler output above)"
mkdir -p "$(dirname "$OUT")"
"$HIPCC_BIN" -shared "${FLAGS[@]}" "${ARCH_FLAGS[@]}" "$WORK"/obj/*.o -o "$OUT"
t1=$(date +%s.%N)
BUILD_S="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
say "built $OUT ($(stat -c %s "$OUT") bytes) in $BUILD_S s wall"

# --- check ------------------------------------------------------------------
problems=0
bad() { echo "[peat hip] CHECK FAILED: $*" >&2; problems=$((problems + 1)); }

# Code objects: one per source and arch; each's target note and kernels.
"$ROC_OBJ_LS" "$OUT" >"$WORK/objs.txt" || bad "roc-obj-ls $OUT failed"
say "code objects (roc-obj-ls):"
sed 's/^/    /' "$WORK/objs.txt"
for a in "${BUILT[@]}"; do
  n=0
  while read -r _ id uri; do
    [[ "$id" == "hipv4-amdgcn-amd-amdhsa--$a" ]] || continue
    n=$((n + 1))
    off="$(sed -n 's/.*#offset=\([0-9]*\)&.*/\1/p' <<<"$uri")"
    size="$(sed -n 's/.*&size=\([0-9]*\).*/\1/p' <<<"$uri")"
    co="$WORK/co_$n.$a.o"
    dd if="$OUT" of="$co" bs=64K iflag=skip_bytes,count_bytes skip="$off" \
      count="$size" status=none
    target="$("$READELF" --notes "$co" | sed -n 's/^ *amdhsa.target: *//p' | sed -n 1p)"
    [[ "$target" == "amdgcn-amd-amdhsa--$a" ]] \
      || bad "code object $n for $a has amdhsa.target '$target'"
    # Kernel descriptors (<kernel>.kd): global and not hidden, or the HIP
    # runtime could not find the kernels.
    kds="$("$READELF" -s --wide "$co" | awk '$8 ~ /\.kd$/')"
    [[ -n "$kds" ]] || bad "code object $n for $a has no kernel descriptors"
    if awk '$5 != "GLOBAL" || $6 == "HIDDEN" { bad = 1 } END { exit !bad }' <<<"$kds"; then
      bad "code object $n for $a has local or hidden kernels"
    fi
  done <"$WORK/objs.txt"
  if [[ $n -ne ${#SOURCES[@]} ]]; then
    bad "$n code objects for $a, expected ${#SOURCES[@]} (one per source)"
  else
    say "  $a: $n code objects, amdhsa.target amdgcn-amd-amdhsa--$a, kernels exported"
  fi
done

# Handler symbols: every PEAT_EXPORT_HANDLER of the .cu sources the .hip
# files include, exported as text symbols.
EXPECTED=()
for src in "${SOURCES[@]}"; do
  while read -r cu; do
    mapfile -t -O "${#EXPECTED[@]}" EXPECTED < <(
      sed -n 's/^PEAT_EXPORT_HANDLER(\([A-Za-z0-9_]*\));.*/\1/p' "$(dirname "$src")/$cu")
  done < <(sed -n 's/^#include "\(.*\.cu\)".*/\1/p' "$src")
done
[[ ${#EXPECTED[@]} -gt 0 ]] || bad "found no PEAT_EXPORT_HANDLER in the sources"
nm -D --defined-only "$OUT" >"$WORK/nm.txt"
for sym in "${EXPECTED[@]}"; do
  grep -q " T $sym\$" "$WORK/nm.txt" || bad "handler $sym not exported (nm -D)"
done
say "handlers exported (nm -D): ${EXPECTED[*]}"

# Contraction: the compile flags above keep a multiply and an add separate.
cat >"$WORK/contract.hip" <<'EOF'
#include <hip/hip_runtime.h>
__global__ void PeatContractProbe(const float* a, const float* b, float* c) {
  const int i = threadIdx.x;
  c[i] = __fadd_rn(c[i], __fmul_rn(a[i], b[i]));
}
EOF
for a in "${BUILT[@]}"; do
  if ! "$HIPCC_BIN" "${FLAGS[@]}" --offload-arch="$a" --cuda-device-only -S \
      "$WORK/contract.hip" -o "$WORK/contract.$a.s" >/dev/null 2>&1; then
    bad "contraction probe does not compile for $a"
  elif grep -Eq '\bv_(pk_)?(fma|fmac|mac|mad)[a-z0-9_]*f32' "$WORK/contract.$a.s" \
      || ! grep -q 'v_mul_f32' "$WORK/contract.$a.s"; then
    bad "$a: __fadd_rn(s, __fmul_rn(a, b)) is contracted with these flags"
  fi
done
[[ $problems != 0 ]] || say "contraction: unfused v_mul_f32 + v_add_f32 on ${BUILT[*]}"
T2=$(date +%s.%N)
say "checks took $(awk -v a="$t1" -v b="$T2" 'BEGIN { printf "%.1f", b - a }') s"
[[ $problems == 0 ]] || die "$problems check(s) failed for $OUT"

# --- summary ----------------------------------------------------------------
join() { local IFS=,; echo "$*"; }
say "result: built=$(join "${BUILT[@]}") not_built=$(join "${MISSING[@]}") stand_in=$(join "${STOOD_IN[@]}") build_s=$BUILD_S"
if [[ ${#MISSING[@]} -gt 0 ]]; then
  say "NOT BUILT (this compiler cannot target them): ${MISSING[*]}"
  [[ $STRICT == 0 ]] || die "--strict: requested archs not built: ${MISSING[*]}" 4
fi
say "OK: $OUT for ${LABEL[*]} in $BUILD_S s (compiled, not run: running needs an AMD GPU)"
exit 0
