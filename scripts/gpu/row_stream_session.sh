#!/usr/bin/env bash
# Issue 5 (2026-11-27, night), after row_occupancy_session.sh: the streamed-row layout (two
# passes over the row, the second from L2, as Inductor's kernel does) against rows held in
# registers, on 16384 x 8192 bf16 norms and softmax, each setting in its own process.
# MAGI_ROW_CHUNKS=1 makes 8192-wide rows streamed. One summary file in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
run() {  # TAG ENV... : one sweep_rows setting under extra environment
  local tag=$1; shift
  env "$@" SWEEP_TAG="_$tag" bash scripts/gpu/sweep_rows.sh "${CONF:-auto 1 256 all 0}" 2>&1 | tee -a "$S"
}
CONF="auto 4 256 all 0" run held
run s512k2 MAGI_ROW_STREAM_THREADS=512 MAGI_ROW_STREAM_CHUNKS=2
run s512k1 MAGI_ROW_STREAM_THREADS=512 MAGI_ROW_STREAM_CHUNKS=1
run s1024k1 MAGI_ROW_STREAM_THREADS=1024 MAGI_ROW_STREAM_CHUNKS=1
run s256k2 MAGI_ROW_STREAM_THREADS=256 MAGI_ROW_STREAM_CHUNKS=2
run s256k4 MAGI_ROW_STREAM_THREADS=256 MAGI_ROW_STREAM_CHUNKS=4
run s512k2nohint MAGI_ROW_STREAM_THREADS=512 MAGI_ROW_STREAM_CHUNKS=2 MAGI_ROW_STREAM_HINTS=0
CONF="auto 4 256 all 0" run held2
