#!/usr/bin/env bash
# Issue 5 (2026-11-28, fifth session). With MAGI_VECTOR_IO=l2last our RMSNorm no longer moved
# with where the outputs land (100.5-100.6% of copy bandwidth) but still moved with where the
# inputs land (92.4-97.0%; torch.compile 99.7-99.9%). The weight lands with the inputs, and
# every block reads all of it: torch.compile loads it under L1 evict_last, we through __ldg.
# MAGI_KEEP_LOADS=l1last loads it as torch.compile does; in the probe with the inputs moved,
# with either vector I/O mode; then bandwidth.py at 16384 and 32768 rows. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
for io in l2last cs; do
  echo "== placement (inputs moved), MAGI_VECTOR_IO=$io MAGI_KEEP_LOADS=l1last" | tee -a "$S"
  MAGI_VECTOR_IO=$io MAGI_KEEP_LOADS=l1last timeout 150 python scripts/gpu/placement_probe.py \
    --move inputs 2>&1 | grep -v "^\[magi" | tail -8 | tee -a "$S"
done
gpu_row_bandwidth "$S" l2last_l1last MAGI_VECTOR_IO=l2last MAGI_KEEP_LOADS=l1last
gpu_row_bandwidth "$S" cs_l1last MAGI_KEEP_LOADS=l1last
gpu_row_run "$S" l2last_l1last_rows32768 32768 8192 MAGI_VECTOR_IO=l2last MAGI_KEEP_LOADS=l1last
