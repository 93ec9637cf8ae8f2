#!/usr/bin/env bash
# Test suite. Creates ./.venv when missing, then runs pytest; its exit status
# is pytest's (non-zero when a test fails or when no test ran). Extra
# arguments go to pytest, e.g. ./test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_env.sh
bash scripts/ensure_chromium.sh
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
