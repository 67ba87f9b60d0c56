#!/usr/bin/env bash
# Issue 5 (2026-11-28, fifth session). RMSNorm at 16384 x 8192 bf16 on the H200 stays ~2 points
# under torch.compile's whatever the chunks per thread (rmsnorm_chunks_session.sh: 98.0-98.3%
# with 3-8 chunks against 99.9-100.0%). Is the gap a per-call cost (launch, the first wave, the
# tail) or a steady rate? Each in its own process beside torch.compile: the default; without
# programmatic dependent launches; a persistent grid that reads the weight once per block
# (MAGI_KERNEL_GRID=wave MAGI_ROW_COLUMN_LOADS=block); the default over twice and half the rows
# (a per-call cost halves and doubles its share). (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
gpu_row_bandwidth "$S" default
gpu_row_bandwidth "$S" no_dependent_launch MAGI_DEPENDENT_LAUNCH=0
gpu_row_bandwidth "$S" wave_block_weight MAGI_KERNEL_GRID=wave MAGI_ROW_COLUMN_LOADS=block
gpu_row_run "$S" rows32768 32768 8192
gpu_row_run "$S" rows8192 8192 8192
gpu_row_bandwidth "$S" default_again
