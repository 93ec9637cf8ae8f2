#!/usr/bin/env bash
# Main job on its built-in default. Creates ./.venv when missing, then runs a
# whole validation campaign: golden training of the default model (the CNN on
# the 8x8 digits) with Orbax checkpoints, playback FI and runtime FI of the
# default native kernel under test (conv2d with bf16-rounded inputs), the
# verdict and the HTML report, and prints where the report is. Extra flags go
# to the tool, e.g. ./run.sh --scenario=vit --kut=native:matmul:acc_bf16
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_env.sh
exec "$PY" -m peat_jax.tools.validate "$@"
