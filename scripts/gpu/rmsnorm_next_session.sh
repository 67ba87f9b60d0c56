#!/usr/bin/env bash
# Issue 5, for the next session (written 2026-11-28, fifth session; not yet run). Our RMSNorm at
# 16384 x 8192 bf16 measures about 93% of copy bandwidth timed alone and 98% in bandwidth.py's
# blocks of 20 calls beside torch.compile (which stays at 100% either way), and MAGI_VECTOR_IO=
# l2last (L2 evict_last row loads, plain stores) made it insensitive to where the outputs land.
# 1. The CUDA tests of the measuring modes (tests/gpu/test_kernel_env_cuda.py: every
#    MAGI_VECTOR_IO mode and MAGI_KEEP_LOADS=l1last against eager), not yet run on a GPU.
# 2. rmsnorm_trend_probe.py: is "alone" slow because of a trend over back-to-back calls?
# 3. placement_probe.py (outputs moved) with cs and l2last as controls in the same machine
#    start, then ldcs (streaming loads, plain stores), ldg (read-only loads, plain stores) and
#    l2last_cs (l2last's evict_last loads, streaming stores): was it l2last's plain stores or
#    its evict_last loads?
# About ten minutes in all: PART=tests runs 1, PART=probes 2 and 3 (default both). (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
if [[ "${PART:-all}" != probes ]]; then
  echo "== CUDA tests of the tuning variables" | tee -a "$S"
  gpu_pytest tests_kernel_env.log 300 tests/gpu/test_kernel_env_cuda.py | tee -a "$S"
fi
[[ "${PART:-all}" == tests ]] && exit 0
for io in cs l2last; do
  echo "== trend, MAGI_VECTOR_IO=$io" | tee -a "$S"
  MAGI_VECTOR_IO=$io timeout 120 python scripts/gpu/rmsnorm_trend_probe.py rmsnorm add_rmsnorm 2>&1 |
    grep -E "^copy|%" | tee -a "$S"
done
for io in cs l2last ldcs ldg l2last_cs; do
  echo "== placement (outputs moved), MAGI_VECTOR_IO=$io" | tee -a "$S"
  MAGI_VECTOR_IO=$io timeout 150 python scripts/gpu/placement_probe.py 2>&1 |
    grep -E "^copy|^pad" | tee -a "$S"
done
