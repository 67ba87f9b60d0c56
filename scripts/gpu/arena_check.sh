#!/usr/bin/env bash
# Session of 2026-11-27 (night): the memory-arena test that failed on the H200 at 24b1940
# (test_fewer_allocations_and_no_higher_peak), run with its printed numbers, then the CUDA
# test files outside the five main ones. One summary file in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 4
echo "== arena test, verbose" | tee -a "$S"
timeout 150 python -m pytest tests/gpu/test_memory_arena_cuda.py -q -s -p no:cacheprovider \
  --tb=long 2>&1 | grep -v "^DEBUG\|^\[magi" > "$OUT/arena.log"
grep -E "allocations per call|passed|failed|^E |^FAILED|assert" "$OUT/arena.log" | head -40 | tee -a "$S"
echo "== other CUDA test files" | tee -a "$S"
gpu_pytest others.log 330 tests/gpu/test_cuda_driver.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_custom_ops_cuda.py tests/gpu/test_memory_trace_cuda.py \
  tests/gpu/test_offload_cuda.py tests/gpu/test_runtime_choices_cuda.py --durations=6 | tee -a "$S"
