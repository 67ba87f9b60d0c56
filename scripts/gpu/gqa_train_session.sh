#!/usr/bin/env bash
# Grouped key/value heads in training (passes::group_query_attention on forward and backward
# graphs): build; the runtime-choice and recompute CUDA tests; benchmarks/recompute.py (every
# policy beside torch.compile). Logs and JSON in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest (runtime choices, recompute)"
gpu_pytest pytest_gqa_train.log 150 tests/gpu/test_runtime_choices_cuda.py tests/gpu/test_recompute_cuda.py
echo "== benchmarks/recompute.py"
timeout 330 python benchmarks/recompute.py --device cuda --budget-s ${RECOMPUTE_BUDGET:-280} \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -34
