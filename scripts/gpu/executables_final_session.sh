#!/usr/bin/env bash
# Issue 6 (2026-11-28, evening), the last GPU run of the session at the final runtime code:
# the direct-dispatch and runtime-choice tests (they replay graphs through pick_slot), the
# memory arena, API and offload tests.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: runtime choices and direct calls" | tee -a "$S"
gpu_pytest gpu_tests_runtime.log 120 tests/gpu/test_runtime_choices_cuda.py | tee -a "$S"
echo "== pytest GPU: memory arena, API, offload" | tee -a "$S"
gpu_pytest gpu_tests_more.log 150 tests/gpu/test_memory_arena_cuda.py tests/gpu/test_api_cuda.py \
  tests/gpu/test_offload_cuda.py | tee -a "$S"
