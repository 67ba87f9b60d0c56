#!/usr/bin/env bash
# Issues 5/6 (2026-11-28), on an H200: how the default guard mode's direct calls evaluated
# Dynamo's guards in host_floor.py (their reuse mode, checks, and the debug line that says why
# a tree is evaluated on every call); then the four row kernels beside torch.compile with
# 512-thread blocks holding two 16-byte chunks per thread (the same 8192-element row, half the
# registers per thread) against the defaults (256 x 4), in alternating processes.
# At most 8 files in $OUT (what comes back).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== host floor (guard reuse)" | tee -a "$S"
MAGI_LOGGING_LEVEL=debug timeout 150 python scripts/gpu/host_floor.py --json "$OUT/host_floor.json" 2>&1 |
  grep -i "evaluated on every\|guard_reuse\|guard_checks\|\"call\"\|native_alone" | sort | uniq -c | head -20 | tee -a "$S"
gpu_row_bandwidth "$S" rows256x4_a
MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_CHUNKS=2 gpu_row_bandwidth "$S" rows512x2_a
gpu_row_bandwidth "$S" rows256x4_b
MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_CHUNKS=2 gpu_row_bandwidth "$S" rows512x2_b
