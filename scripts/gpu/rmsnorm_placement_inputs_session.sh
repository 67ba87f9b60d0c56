#!/usr/bin/env bash
# Issue 5 (2026-11-28, fifth session). In placement_probe.py on the H200, MAGI_VECTOR_IO=l2last
# held RMSNorm at 100.5-100.6% of copy bandwidth wherever the outputs landed (default 92.7-97.8%,
# torch.compile 100.1-100.4%), yet bandwidth.py measured it at 98.3%. Here the inputs move
# instead (allocated anew after each pad), with both modes, and bandwidth.py once more with
# each. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
for io in cs l2last; do
  echo "== placement (inputs moved), MAGI_VECTOR_IO=$io" | tee -a "$S"
  MAGI_VECTOR_IO=$io timeout 150 python scripts/gpu/placement_probe.py --move inputs 2>&1 |
    grep -v "^\[magi" | tail -8 | tee -a "$S"
done
gpu_row_bandwidth "$S" l2last MAGI_VECTOR_IO=l2last
gpu_row_bandwidth "$S" default
