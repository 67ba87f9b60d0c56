#!/usr/bin/env bash
# One device call for the training step's backward fusions: build; the whole CUDA test tier;
# what the Llama training step leaves to ATen on CUDA; a kernel-level profile of the step
# (torch.compile beside magi). Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest tests/gpu"
gpu_pytest pytest_gpu.log 330 tests/gpu
echo "== ATen calls left in the training step"
MAGI_LOGGING_LEVEL=warn timeout 120 python scripts/gpu/fallback_summary.py llama_train 2>&1 | tail -40
echo "== profile llama_train"
gpu_profile llama_train 30 200 | tail -70
