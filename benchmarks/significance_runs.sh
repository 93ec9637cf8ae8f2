#!/usr/bin/env bash
# Issue 24's figures: two matmul KUTs (bf16 inputs, and a reordering-only
# tiled summation) on language pretraining (gpt) and language finetuning
# (minilm_finetune), short runs. Each campaign lands in
# runs/sig_<scenario>_<variant>; then
#   .venv/bin/python benchmarks/significance_figures.py runs/sig_* --out=benchmarks/out
# draws the per-layer ratio figures. Usage: bash benchmarks/significance_runs.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p runs
run() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  "$PY" -m peat_jax.tools.validate "$@" --isolate=off \
      --campaign_dir="runs/sig_$name" > "runs/sig_$name.log" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - t0 )) s" >> runs/significance.times
}
: > runs/significance.times
for v in in_bf16 tiled; do
  run "gpt_$v" --scenario=gpt --kut="native:matmul:$v" --steps=60 \
      --checkpoint_every=20 --frequencies=every,every_4 --batch_size=8
  run "minilm_finetune_$v" --scenario=minilm_finetune \
      --kut="native:matmul:$v" --steps=40 --checkpoint_every=10 \
      --frequencies=every,every_4 --batch_size=8
done
echo "all done" >> runs/significance.times
