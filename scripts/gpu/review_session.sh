#!/usr/bin/env bash
# Re-read of the session's change: MemoryTrace moved to src/runtime/memory_trace.cpp and
# TensorType::bytes shared by the planner and the peak simulation. Build; the new CUDA test of
# the memory trace and the recompute CUDA tests. Logs in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_review.log 200 tests/gpu/test_memory_trace_cuda.py tests/gpu/test_recompute_cuda.py
