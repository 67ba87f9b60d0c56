#!/usr/bin/env bash
# One device call for "where does the time go": build, the bandwidth benchmark, a kernel-level
# profile of whole-model workloads (eager, torch.compile, magi_compile: kernels by name, idle
# gaps, host time), and the row kernels' bandwidth at head-sized rows (qk-norm: 16384 tokens x 24 heads of 128).
# Logs and JSON land in $OUT.
#   PROFILE_ONLY=llama_prefill,dit_block bash scripts/gpu/profile_session.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== bandwidth (benchmarks/bandwidth.py at its defaults)"
timeout 200 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  tee "$OUT/bandwidth.log" | tail -14
echo "== profile"
timeout 300 python scripts/gpu/profile_workloads.py --only "${PROFILE_ONLY:-llama_prefill,dit_block}" \
  --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log" | grep -v "^\[magi" | tail -120
echo "== bandwidth, rows of 128"
timeout 150 python benchmarks/bandwidth.py --device cuda --no-compile-latency --rows 393216 --cols 128 \
  --only rmsnorm,layer_norm,softmax --out "$OUT/bandwidth_rows128.json" 2>&1 |
  tee "$OUT/bandwidth_rows128.log" | tail -8
