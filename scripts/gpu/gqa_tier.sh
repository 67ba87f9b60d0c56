#!/usr/bin/env bash
# group_query_attention at its final form (cuDNN with a mask rewritten too): the grouped and
# decode tests first, then the whole CUDA tier. Logs in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "== grouped and decode tests"
gpu_pytest pytest_grouped.log 100 tests/gpu/test_runtime_choices_cuda.py -k "decode or grouped" -rA
grep -E "PASSED|FAILED" "$OUT/pytest_grouped.log" | head -12
echo "== pytest tests/gpu"
gpu_pytest pytest_tier.log 380 tests/gpu -ra
