#!/usr/bin/env bash
# Issue 5 (2026-11-28, fifth session). RMSNorm's gap to torch.compile at 16384 x 8192 bf16 on
# the H200 is a steady rate, not a per-call cost (rmsnorm_fixed_cost_session.sh: 0.3 us at 8192
# rows, 3.1 at 16384, 7.0 at 32768). torch.compile's kernel reads the row under an L2 evict_last
# policy and stores plainly; ours streams both (cs). The two measuring modes that read rows as
# torch.compile's first read does (MAGI_VECTOR_IO=l2last: L1 not allocated; l2last_l1: L1
# evict_last, its exact form), with plain stores, against the default, each in its own process
# beside torch.compile, at 16384 and 32768 rows. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
gpu_row_bandwidth "$S" default
gpu_row_bandwidth "$S" l2last MAGI_VECTOR_IO=l2last
gpu_row_bandwidth "$S" l2last_l1 MAGI_VECTOR_IO=l2last_l1
gpu_row_run "$S" l2last_rows32768 32768 8192 MAGI_VECTOR_IO=l2last
gpu_row_run "$S" rows32768 32768 8192
gpu_row_bandwidth "$S" default_again
