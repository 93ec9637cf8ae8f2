#!/usr/bin/env bash
# Creates the fault-injection peers' own environment for
# benchmarks/bench_fi_peers.py when it is missing or when this script changed:
# torch 2.13.0 (CPU), PyTorchFI 0.6.0, MRFI 2.1.0, numpy, scikit-learn.
# Idempotent and quiet when the environment is there.
# Usage: source scripts/ensure_peers_env.sh   (sets $PEERS_PY)
#    or: bash scripts/ensure_peers_env.sh     (prints nothing when ready)
#
# Where: benchmarks/fi_peers/.venv (git-ignored by the existing `.venv/` rule;
# override with PEERS_VENV).
#
# Why this order: the peers' metadata asks for torch (MRFI also for
# torchvision), which pip could satisfy with a CUDA build from the index. torch
# is installed first, alone and pinned (the CPU wheel lies on this machine's
# disk), then the peers with --no-deps and their real remaining dependencies
# by name: PyTorchFI needs only torch; MRFI's package imports torch, numpy,
# PyYAML and scipy (torchvision is used only by the example scripts in its
# separate `mrfi_dataset` package, which the benchmark does not import).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEERS_VENV:-$ROOT/benchmarks/fi_peers/.venv}"
PEERS_PY="$VENV/bin/python"
STAMP="$VENV/.peers_install_stamp"
TORCH_VERSION="2.13.0"
PYTORCHFI_VERSION="0.6.0"
MRFI_VERSION="2.1.0"

want="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"

_peers_pip() {
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 \
    | grep -v '^WARNING: Location' >&2 || true
}

if [[ ! -x "$PEERS_PY" ]]; then
  echo "[peers] creating virtual environment at $VENV" >&2
  python3 -m venv "$VENV"
  have=""
fi
if [[ "$want" != "$have" ]]; then
  echo "[peers] installing torch $TORCH_VERSION (CPU), pytorchfi" \
       "$PYTORCHFI_VERSION, mrfi $MRFI_VERSION into $VENV" >&2
  start=$(date +%s)
  _peers_pip "torch==$TORCH_VERSION"
  _peers_pip numpy scikit-learn scipy PyYAML
  # Refuse anything but the CPU build before the peers go in.
  "$PEERS_PY" - "$TORCH_VERSION" <<'EOF' || { echo "[peers] torch check failed" >&2; exit 1; }
import sys, torch
want = sys.argv[1]
if torch.__version__.split("+")[0] != want or torch.version.cuda is not None:
  sys.exit(f"[peers] expected the CPU torch {want}, got {torch.__version__} "
           f"(cuda {torch.version.cuda})")
EOF
  _peers_pip --no-deps "pytorchfi==$PYTORCHFI_VERSION" "mrfi==$MRFI_VERSION"
  "$PEERS_PY" - "$TORCH_VERSION" "$PYTORCHFI_VERSION" "$MRFI_VERSION" <<'EOF' \
    || { echo "[peers] install failed: see pip output above" >&2; exit 1; }
import sys
from importlib.metadata import version
import torch, pytorchfi.core, mrfi, numpy, sklearn.datasets, scipy, yaml
got = (torch.__version__.split("+")[0], version("pytorchfi"), version("mrfi"))
if got != tuple(sys.argv[1:]) or torch.version.cuda is not None:
  sys.exit(f"[peers] wrong versions installed: {got}, torch {torch.__version__}")
EOF
  echo "$want" > "$STAMP"
  echo "[peers] environment ready in $(( $(date +%s) - start )) s" >&2
fi
export PEERS_PY
