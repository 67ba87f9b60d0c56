#!/usr/bin/env bash
# The CUDA-graph tests at the cuBLAS-workspace fix, the decode-beside-reduce-overhead test among
# them. Log in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
gpu_pytest pytest_graphs_final.log 400 tests/gpu/test_cuda_graphs.py --durations=3
grep -A4 "slowest" "$OUT/pytest_graphs_final.log" | head -5
