#!/usr/bin/env bash
# Main job on its built-in default. Creates ./.venv when missing, then runs
# golden training of the default model (CNN on the 8x8 digits) with Orbax
# checkpoints, and prints where its output is. Extra flags go to the tool,
# e.g. ./run.sh --scenario=gpt
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_env.sh
exec "$PY" -m peat_jax.tools.golden "$@"
