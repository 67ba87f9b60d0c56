#!/usr/bin/env bash
# Session of 2026-11-28 (afternoon), third call: the GPU test files not yet run at this tree
# (packed pairs on by default; the runner and fusion files passed in the first two calls), and
# two row layouts beside torch.compile: 512 threads of 2 held vectors with the weight read in the
# output pass (32 registers, 4 blocks of 512 per SM: torch.compile's shape, which reloads the row
# from L1 instead of holding it), and 256 threads with the weight in the output pass (40
# registers, 6 blocks).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_CHUNKS=2 MAGI_ROW_COLUMN_LOADS=late gpu_row_bandwidth "$S" t512_k2_late
MAGI_ROW_COLUMN_LOADS=late gpu_row_bandwidth "$S" t256_k4_late
echo "== pytest GPU: the other files" | tee -a "$S"
SECONDS=0
gpu_pytest gpu_rest.log 330 tests/gpu/test_cuda_end_to_end.py tests/gpu/test_recompute_cuda.py \
  tests/gpu/test_memory_arena_cuda.py tests/gpu/test_offload_cuda.py \
  tests/gpu/test_memory_trace_cuda.py tests/gpu/test_cuda_driver.py \
  tests/gpu/test_runtime_choices_cuda.py | tee -a "$S"
echo "($SECONDS s)" | tee -a "$S"
