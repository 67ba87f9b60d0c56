#!/usr/bin/env bash
# After the re-read: build; the CUDA-graph tests (the stage-timer test among them) and the fusion
# tests (precompile now fills strides in the classify loop). Logs land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_reread.log 300 tests/gpu/test_cuda_graphs.py tests/gpu/test_fusion_cuda.py
