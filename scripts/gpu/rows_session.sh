#!/usr/bin/env bash
# One device call after a row-kernel change: build, the CUDA tests, the bandwidth of the row
# kernels at head-sized rows (393216 x 128) and at the default shape, and the video-DiT
# block's profile. Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build tests || exit 1
echo "== bandwidth, rows of 128"
timeout 120 python benchmarks/bandwidth.py --device cuda --no-compile-latency --rows 393216 --cols 128 \
  --only rmsnorm,layer_norm,softmax --out "$OUT/bandwidth_rows128.json" 2>&1 |
  tee "$OUT/bandwidth_rows128.log" | tail -6
echo "== profile"
timeout 200 python scripts/gpu/profile_workloads.py --only "${PROFILE_ONLY:-dit_block}" --variants inductor,magi \
  --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log" | grep -v "^\[magi" | tail -40
