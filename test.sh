#!/usr/bin/env bash
# Test suite. Creates ./.venv when missing, then runs pytest; its exit status
# is pytest's (non-zero when a test fails or when no test ran). Without
# arguments it runs every test not marked slow in two pytest-xdist workers,
# a test file per worker at a time so module fixtures are built once (the
# CI job, under 15 minutes on 2 cores: compilation is mostly one thread);
# extra arguments go to pytest instead, e.g. `./test.sh -m slow` for the
# slow tests or `./test.sh -n 2 --dist loadfile tests` for all of them.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_env.sh
bash scripts/ensure_chromium.sh
if [[ $# -eq 0 ]]; then
  set -- -m "not slow" -n 2 --dist loadfile
fi
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
