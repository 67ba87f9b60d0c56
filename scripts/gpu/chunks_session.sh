#!/usr/bin/env bash
# Row kernels holding rows in registers take fewer chunks per thread when they cache many inputs
# (issue 9's residual-stream sum): build; the CUDA fusion and recompute tests; a kernel profile of
# the Llama training step beside torch.compile's. Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest tests/gpu/test_fusion_cuda.py tests/gpu/test_recompute_cuda.py"
gpu_pytest pytest_fusion_recompute.log 240 tests/gpu/test_fusion_cuda.py tests/gpu/test_recompute_cuda.py
echo "== profile llama_train"
gpu_profile llama_train 40 200 | sed -n '/llama_train \/ magi/,$p' | head -45
