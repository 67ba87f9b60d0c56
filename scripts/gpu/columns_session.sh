#!/usr/bin/env bash
# Column kernels' row loop unrolled by 4 (several rows' loads in flight): build; the bandwidth
# benchmark's column sum (bias_grad); the training step of both recompute workloads under
# HEURISTIC beside torch.compile (benchmarks/recompute.py); a kernel profile of the 4-layer
# training step. Logs and JSON in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== benchmarks/bandwidth.py (bias_grad)"
timeout 80 python benchmarks/bandwidth.py --device cuda --only bias_grad \
  --no-compile-latency --out "$OUT/bandwidth_columns.json" 2>&1 | grep -v "^\[magi" | tail -5
echo "== benchmarks/recompute.py (tc, HEURISTIC)"
timeout 250 python benchmarks/recompute.py --device cuda --variants tc,magi_heuristic \
  --budget-s 200 --out "$OUT/recompute_heuristic.json" 2>&1 |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -14
echo "== profile (llama_train)"
timeout 110 python scripts/gpu/profile_workloads.py --only llama_train --variants inductor,magi \
  --rows 16 --json "$OUT/profile_train.json" 2>&1 | grep -v "^\[magi" | tail -40
