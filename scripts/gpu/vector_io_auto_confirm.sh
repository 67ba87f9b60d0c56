#!/usr/bin/env bash
# Issue 5 (2026-11-28, sixth session): RMSNorm at 16384 x 8192 bf16 under the new default
# MAGI_VECTOR_IO=auto, three more processes beside torch.compile, then the placement probe
# moving the inputs (where l2last had been sensitive).  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
for i in 1 2 3; do gpu_row_bandwidth "$S" "auto_confirm$i"; done
echo "== placement (inputs moved), auto" | tee -a "$S"
timeout 100 python scripts/gpu/placement_probe.py --move inputs 2>&1 | grep -E "^copy|^pad" | tee -a "$S"
