#!/usr/bin/env bash
# The grouped and decode tests of test_runtime_choices_cuda.py after the sdpa_kernel fix of
# the cuDNN-traced case. Log in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
gpu_pytest pytest_grouped.log 100 tests/gpu/test_runtime_choices_cuda.py -k "decode or grouped" -rA
grep -E "PASSED|FAILED|^E " "$OUT/pytest_grouped.log" | head -20
