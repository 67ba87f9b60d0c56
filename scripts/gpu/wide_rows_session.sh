#!/usr/bin/env bash
# Issue 5, 2026-11-28 (fourth session): rows that 256 threads do not hold in registers but 512
# do (8192 < cols <= 16384 bf16, 4096 < cols <= 8192 float32) are now held by a wide block of
# 512 threads without the loop over rows (MAGI_ROW_HELD_THREADS, symbol suffix _h_g) instead of
# streamed. long_rows_held_session.sh measured the layout by hand (MAGI_MAX_BLOCK_THREADS=512
# MAGI_ROW_GRID_LOOP=0) at 16384 bf16 columns. Here: the CUDA fusion tests over the new
# default, then the default beside torch.compile at 16384 and 12288 bf16 columns (a row of 3
# chunks per thread) and 8192 float32 columns, each against MAGI_ROW_HELD_THREADS=256 (the
# streamed layout before), and the unchanged 8192-column default; then the driver and
# CUDA-graph test files (150 s were too few for them in the last call). (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest: test_fusion_cuda.py" | tee -a "$S"
gpu_pytest gpu_fusion_tests.log 170 tests/gpu/test_fusion_cuda.py | tee -a "$S"
gpu_row_run "$S" wide_16384 8192 16384
gpu_row_run "$S" streamed_16384 8192 16384 MAGI_ROW_HELD_THREADS=256
gpu_row_run "$S" wide_12288 8192 12288
gpu_row_run "$S" streamed_12288 8192 12288 MAGI_ROW_HELD_THREADS=256
ROW_DTYPE=float32 gpu_row_run "$S" wide_f32_8192 8192 8192
ROW_DTYPE=float32 gpu_row_run "$S" streamed_f32_8192 8192 8192 MAGI_ROW_HELD_THREADS=256
gpu_row_run "$S" held_8192 16384 8192
echo "== pytest: driver and CUDA graphs" | tee -a "$S"
gpu_pytest gpu_graph_tests.log 200 tests/gpu/test_cuda_driver.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_cuda_graph_padding.py | tee -a "$S"
