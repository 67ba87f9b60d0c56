#!/usr/bin/env bash
# Issue 9 / 5: norm gradients as one row kernel (expand and detach folding, per-row merges) on
# top of the sink/sibling changes. Build; the fusion and recompute CUDA tests; a kernel profile
# of the training step; benchmarks/recompute.py. Logs and JSON land in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_normgrad.log 200 tests/gpu/test_fusion_cuda.py tests/gpu/test_recompute_cuda.py
echo "== profile llama_train"
gpu_profile llama_train 30 120 | grep -A32 "===== llama_train / magi"
echo "== benchmarks/recompute.py"
timeout 250 python benchmarks/recompute.py --device cuda --budget-s 220 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 | tee "$OUT/recompute.log" |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -40
