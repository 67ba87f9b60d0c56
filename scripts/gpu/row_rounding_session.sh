#!/usr/bin/env bash
# Issue 5, 2026-11-28 (fourth session): row kernels holding rows of more than a warp's worth
# round their block up to whole warps (MAGI_ROW_BLOCK_ROUNDING=warp, the new default) instead
# of a power of two (pow2, before): rows of 12288 bf16 values get 384 threads of 4 chunks
# instead of 512 with 3 of 4 used, rows of 5120 get 160 instead of 256. The long-row and
# vector-width tests, then each setting in its own process beside torch.compile. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest: long rows, vector widths, one kernel over row lengths" | tee -a "$S"
gpu_pytest gpu_rounding_tests.log 60 tests/gpu/test_fusion_cuda.py -k "long_rows or one_kernel or vector_width" |
  tee -a "$S"
gpu_row_run "$S" warp_12288 8192 12288
gpu_row_run "$S" pow2_12288 8192 12288 MAGI_ROW_BLOCK_ROUNDING=pow2
gpu_row_run "$S" warp_5120 16384 5120
gpu_row_run "$S" pow2_5120 16384 5120 MAGI_ROW_BLOCK_ROUNDING=pow2
