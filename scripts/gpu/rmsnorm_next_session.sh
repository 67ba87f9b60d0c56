#!/usr/bin/env bash
# Issue 5, for the next session (written 2026-11-28, fifth session; not yet run). Our RMSNorm at
# 16384 x 8192 bf16 measures about 93% of copy bandwidth timed alone and 98% in bandwidth.py's
# blocks of 20 calls beside torch.compile (which stays at 100% either way), and MAGI_VECTOR_IO=
# l2last (L2 evict_last row loads, plain stores) made it insensitive to where the outputs land.
# 1. rmsnorm_trend_probe.py: is "alone" slow because of a trend over back-to-back calls?
# 2. placement_probe.py (outputs moved) with ldcs (streaming loads, plain stores), ldg
#    (read-only loads, plain stores) and l2last_cs (l2last's evict_last loads, streaming
#    stores): was it l2last's plain stores or its evict_last loads?
# 3. bandwidth.py with l2last_cs, beside torch.compile.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
for io in cs l2last; do
  echo "== trend, MAGI_VECTOR_IO=$io" | tee -a "$S"
  MAGI_VECTOR_IO=$io timeout 120 python scripts/gpu/rmsnorm_trend_probe.py rmsnorm add_rmsnorm 2>&1 |
    grep -v "^\[magi" | tail -6 | tee -a "$S"
done
for io in ldcs ldg l2last_cs; do
  echo "== placement (outputs moved), MAGI_VECTOR_IO=$io" | tee -a "$S"
  MAGI_VECTOR_IO=$io timeout 150 python scripts/gpu/placement_probe.py 2>&1 |
    grep -v "^\[magi" | tail -8 | tee -a "$S"
done
gpu_row_bandwidth "$S" l2last_cs MAGI_VECTOR_IO=l2last_cs
