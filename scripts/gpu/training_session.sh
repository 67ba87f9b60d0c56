#!/usr/bin/env bash
# One device call after the backward fusions: build; the GPU test files the last call's time
# limit cut (recompute, runtime choices, offload); benchmarks/recompute.py (the training step
# of both Llama stacks against torch.compile). Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest (the files after test_fusion_cuda.py)"
gpu_pytest pytest_rest.log 200 tests/gpu/test_offload_cuda.py tests/gpu/test_recompute_cuda.py \
  tests/gpu/test_runtime_choices_cuda.py
echo "== benchmarks/recompute.py"
timeout 330 python benchmarks/recompute.py --device cuda --budget-s 300 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 | tee "$OUT/recompute.log" |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -45
