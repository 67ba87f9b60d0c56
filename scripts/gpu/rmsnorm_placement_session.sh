#!/usr/bin/env bash
# Issue 5 (2026-11-28, fifth session). Does where the outputs land move RMSNorm's gap to
# torch.compile on the H200, as it did on the H100 (placement_probe.py: a pad allocation of
# 0-256 MiB ahead of the outputs)? Once with the default vector I/O and once with
# MAGI_VECTOR_IO=l2last (which closed the gap at 32768 rows and not at 16384). (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== placement, default" | tee -a "$S"
timeout 150 python scripts/gpu/placement_probe.py 2>&1 | grep -v "^\[magi" | tail -8 | tee -a "$S"
echo "== placement, MAGI_VECTOR_IO=l2last" | tee -a "$S"
MAGI_VECTOR_IO=l2last timeout 150 python scripts/gpu/placement_probe.py 2>&1 | grep -v "^\[magi" | tail -8 | tee -a "$S"
