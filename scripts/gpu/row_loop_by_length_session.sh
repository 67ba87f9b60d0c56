#!/usr/bin/env bash
# Issue 5 (2026-11-28, third session): MAGI_ROW_GRID_LOOP=auto now leaves the loop over rows
# out of streamed rows of at most 64 KiB per input only (rows of 128 KiB lost 3-16 points
# without it, stream_no_loop_session.sh), choosing per row length at each launch (the variant
# key has the choice). The CUDA fusion tests (test_long_rows: 4095 and 9000 columns without
# the loop, 65535 and 65536 with it), then the four row kernels at 2048 x 65536 beside
# torch.compile, which should match the loop's numbers. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU fusion" | tee -a "$S"
gpu_pytest gpu_fusion.log 120 tests/gpu/test_fusion_cuda.py | tee -a "$S"
gpu_row_run "$S" auto_65536 2048 65536
