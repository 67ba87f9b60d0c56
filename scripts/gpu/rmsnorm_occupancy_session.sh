#!/usr/bin/env bash
# Issue 5 (2026-11-28): RMSNorm against torch.compile's on the H200 after the bf16 word loads
# (60a50f5) cut the row kernels' instructions: does occupancy now decide it? The weight read in
# the output pass (MAGI_ROW_COLUMN_LOADS=late: fewer registers held) and a register bound for 5
# blocks per SM (MAGI_ROW_MIN_BLOCKS=5), against the default, one process each beside
# torch.compile (bandwidth.py's four row kernels).   At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
band() { gpu_row_bandwidth "$S" "$1"; }  # band LABEL
band default
MAGI_ROW_COLUMN_LOADS=late band late
MAGI_ROW_MIN_BLOCKS=5 band min_blocks5
band default_again
MAGI_ROW_COLUMN_LOADS=late band late_again
