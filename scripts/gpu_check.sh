#!/usr/bin/env bash
# The GPU check of peat_jax: one run on a machine with an NVIDIA GPU (BUILD.md,
# "GPU check"). Builds the CPU and CUDA libraries against that machine's jax
# (PEAT_BUILD_CUDA=1, pip install --no-deps --no-build-isolation -e .), runs
# tests/kernels on the GPU, a validate campaign on the bf16 llama scenario
# (native:rms_norm:hf), two validate campaigns on the GPT scenario (the
# native CUDA KUT, and XLA's own float32 dot at DEFAULT precision against
# HIGHEST), and times peat.analyze and one playback checkpoint; all within 8
# minutes (--budget_s). Writes OUT_DIR/summary.json, OUT_DIR/gpu_check.log and
# OUT_DIR/logs.tar.gz, prints the summary; a step that fails is recorded and
# the next one runs. Exit status 0 when every step passed, 1 otherwise, 2 on
# bad arguments.
#
#   PEAT_COMMIT=<hash> bash scripts/gpu_check.sh OUT_DIR         # on the GPU machine
#   bash scripts/gpu_check.sh --dry-run [--nvcc] OUT_DIR         # the same steps on the CPU
#   bash scripts/gpu_check.sh --list [--dry-run] OUT_DIR         # the commands only
#   bash scripts/gpu_check.sh --help
#
# The steps run with $PEAT_PYTHON (default: python3; for --dry-run ./.venv's
# python when there is one). The logic is scripts/gpu_check.py (standard
# library only) and scripts/gpu_check_probe.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PEAT_PYTHON:-}"
if [[ -z "$PY" ]]; then
  PY=python3
  for arg in "$@"; do
    if [[ "$arg" == --dry-run && -x "$ROOT/.venv/bin/python" ]]; then
      PY="$ROOT/.venv/bin/python"
    fi
  done
fi
export PYTHONUNBUFFERED=1
exec "$PY" "$ROOT/scripts/gpu_check.py" --python "$PY" "$@"
