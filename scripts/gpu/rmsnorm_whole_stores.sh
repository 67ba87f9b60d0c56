#!/usr/bin/env bash
# Issue 5 (2026-11-28, sixth session). Nsight Compute showed that every vector I/O mode with
# plain stores (l2last, ldcs, ldg, plain) had half its 16-byte stores split into four 4-byte
# stores (2.5 store instructions per 16 bytes); magi_store16_plain now writes them whole.
# bandwidth.py's four row kernels beside torch.compile, one process per setting: the default
# (cs) and the plain-store modes at 16384 x 8192 bf16, then l2last against cs at the shapes
# where l2last lost LayerNorm before.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
gpu_row_bandwidth "$S" cs
gpu_row_bandwidth "$S" l2last MAGI_VECTOR_IO=l2last
gpu_row_bandwidth "$S" ldcs MAGI_VECTOR_IO=ldcs
gpu_row_bandwidth "$S" ldg MAGI_VECTOR_IO=ldg
gpu_row_run "$S" l2last_32768 32768 8192 MAGI_VECTOR_IO=l2last
gpu_row_run "$S" l2last_8192x16384 8192 16384 MAGI_VECTOR_IO=l2last
gpu_row_run "$S" cs_8192x16384 8192 16384
gpu_row_run "$S" l2last_16384x5120 16384 5120 MAGI_VECTOR_IO=l2last
