#!/usr/bin/env bash
# Issue 5 (2026-11-28, fifth session), with the session's last device minutes: MAGI_VECTOR_IO=
# l2last against the default at the two other shapes the row kernels were tuned on this week
# (8192 x 16384, held by wide blocks; 16384 x 5120, blocks of whole warps), each in its own
# process beside torch.compile, for a later decision on the default. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
gpu_row_run "$S" wide_default 8192 16384
gpu_row_run "$S" wide_l2last 8192 16384 MAGI_VECTOR_IO=l2last
gpu_row_run "$S" warps_default 16384 5120
gpu_row_run "$S" warps_l2last 16384 5120 MAGI_VECTOR_IO=l2last
