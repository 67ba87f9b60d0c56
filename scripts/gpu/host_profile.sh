#!/usr/bin/env bash
# Where a direct CUDA-graph call's host time goes (scripts/profile_direct_call.py) and the rotary
# kernel's source (scripts/gpu/rotary_source.py). Builds only when the tree has no build.
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh ${BUILD_PHASE:-build} || exit 1
for pad in 1 0; do
  echo "== host time per stage, cudagraph_padding=$pad"
  timeout 120 python scripts/profile_direct_call.py --device cuda --mode FULL --padding $pad \
    --iters 3000 2>&1 | grep -v "^\[magi\|Warning\|warn" | tail -14
done
echo "== rotary"
timeout 120 python scripts/gpu/rotary_source.py 2>&1 | grep -v "^\[magi" | tail -5
ls "$OUT/rotary"
