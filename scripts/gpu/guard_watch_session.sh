#!/usr/bin/env bash
# Issue 6 (2026-11-28): host time per call once the default guard mode reuses Dynamo's verdict
# while the Python state its guard tree reads holds (_guard_watch.py). The 4-layer stack's
# host time beside reduce-overhead (host_overhead.py), the stage breakdown in both guard modes
# (host_floor.py), and the CUDA tests of direct calls, input updates and the API.
# At most 8 files in $OUT (what comes back).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== host overhead" | tee -a "$S"
timeout 200 python benchmarks/host_overhead.py --device cuda \
  --variants magi_cg,magi_cg_args,inductor_ro --out "$OUT/host_overhead.json" 2>&1 |
  grep -v "^\[magi" | tail -14 | tee -a "$S"
echo "== host floor" | tee -a "$S"
timeout 150 python scripts/gpu/host_floor.py --json "$OUT/host_floor.json" 2>&1 |
  grep -v "^\[magi" | tail -30 | tee -a "$S"
echo "== pytest input updates, api, end to end" | tee -a "$S"
gpu_pytest tests.log 200 tests/gpu/test_input_updates_cuda.py tests/gpu/test_api_cuda.py \
  tests/gpu/test_cuda_end_to_end.py | tee -a "$S"
