#!/usr/bin/env bash
# Issue 5 (2026-11-27, night): RMSNorm measured 98.7% of copy bandwidth in a process timing
# magi_compile alone and 100.7% beside torch.compile (H100, clocks at 1980 MHz throughout).
# scripts/gpu/placement_probe.py moves where the outputs land; run with both compilers, and
# with magi_compile alone. One summary file in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
for v in "magi_compile torch.compile" "magi_compile"; do
  echo "== $v" | tee -a "$S"
  timeout 200 python scripts/gpu/placement_probe.py $v 2>&1 | grep -v "^\[magi" | tee -a "$S"
done
