#!/usr/bin/env bash
# Issue 9: the compiled graphs' simulated peak (fusion included) replaces the joint graph's
# prediction, and AUTOSEARCH plans again when the compiled peak misses the budget. Build; the
# recompute CUDA tests; benchmarks/recompute.py (measured against predicted peaks, budgets).
# Logs and JSON land in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_recompute.log 150 tests/gpu/test_recompute_cuda.py
echo "== benchmarks/recompute.py"
timeout 300 python benchmarks/recompute.py --device cuda --budget-s 260 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 | tee "$OUT/recompute.log" |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -45
