#!/usr/bin/env bash
# Issue 5 (2026-11-28, third session): MAGI_ROW_GRID_LOOP=auto, the new default, prints
# streamed row kernels (rows too long for registers) without the loop over rows, and keeps it
# for rows held in registers, where taking it out measured no gain (row_sweep_session.sh).
# The CUDA fusion tests at the default; the four row kernels beside torch.compile at 16384 x
# 8192 (held), 8192 x 16384, 4096 x 32768 and 2048 x 65536 (streamed), the last three also with
# the loop (=1); then torch.compile's two-pass layout at 8192 columns without the loop (the row
# reread from L1, 38 or 32 registers) and the long rows with 4 blocks asked of ptxas.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU fusion (default MAGI_ROW_GRID_LOOP=auto)" | tee -a "$S"
gpu_pytest gpu_fusion.log 150 tests/gpu/test_fusion_cuda.py | tee -a "$S"
mkdir -p /tmp/json
export ROW_JSON_DIR=/tmp/json
gpu_row_run "$S" auto_8192 16384 8192
for shape in "8192 16384" "4096 32768" "2048 65536"; do
  set -- $shape
  gpu_row_run "$S" "auto_$2" "$1" "$2"
  gpu_row_run "$S" "loop1_$2" "$1" "$2" MAGI_ROW_GRID_LOOP=1
done
gpu_row_run "$S" stream8192_l1 16384 8192 MAGI_ROW_CHUNKS=1 MAGI_ROW_STREAM_L1=2
gpu_row_run "$S" stream8192_l1_sk1 16384 8192 MAGI_ROW_CHUNKS=1 MAGI_ROW_STREAM_L1=2 MAGI_ROW_STREAM_CHUNKS=1
gpu_row_run "$S" auto_32768_b4 4096 32768 MAGI_ROW_STREAM_MIN_BLOCKS=4
tar -C /tmp -czf "$OUT/band_json.tgz" json
