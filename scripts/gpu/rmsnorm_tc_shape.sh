#!/usr/bin/env bash
# Issue 5 (2026-11-28, sixth session). First the CUDA tests of the tuning variables (never run
# since a74e214), then bandwidth.py's four row kernels at 16384 x 8192 bf16 beside
# torch.compile with torch.compile's own load and store policies (MAGI_VECTOR_IO=l2last) in
# our layout and in torch.compile's shape (512 threads x 2 held vectors, weight read in the
# output pass), and the two halves of l2last apart (ldcs: streaming loads with plain stores;
# l2last_cs: evict_last loads with streaming stores). One process per setting.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== CUDA tests of the tuning variables" | tee -a "$S"
gpu_pytest tests_kernel_env.log 240 tests/gpu/test_kernel_env_cuda.py | tee -a "$S"
TC_SHAPE=(MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_CHUNKS=2 MAGI_ROW_COLUMN_LOADS=late)
gpu_row_bandwidth "$S" default
gpu_row_bandwidth "$S" l2last_tcshape MAGI_VECTOR_IO=l2last "${TC_SHAPE[@]}"
gpu_row_bandwidth "$S" l2last_late MAGI_VECTOR_IO=l2last MAGI_ROW_COLUMN_LOADS=late
gpu_row_bandwidth "$S" l2last_cs MAGI_VECTOR_IO=l2last_cs
gpu_row_bandwidth "$S" ldcs MAGI_VECTOR_IO=ldcs
gpu_row_bandwidth "$S" l2last MAGI_VECTOR_IO=l2last
