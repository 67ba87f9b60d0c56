#!/usr/bin/env bash
# One device call for "where does the time go": build, a kernel-level profile of whole-model
# workloads (eager, torch.compile, magi_compile), and the norm kernels' bandwidth with and
# without evict-first cache hints (MAGI_CACHE_HINTS). Logs and JSON land in $OUT.
#   PROFILE_ONLY=llama_prefill,dit_block bash scripts/gpu/profile_session.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== profile"
timeout 300 python scripts/gpu/profile_workloads.py --only "${PROFILE_ONLY:-llama_prefill,dit_block,llama_train}" \
  --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log" | grep -v "^\[magi" | tail -150
for hints in default stream; do
  echo "== bandwidth, MAGI_CACHE_HINTS=$hints"
  MAGI_CACHE_HINTS=$hints timeout 150 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
    --only "${BW_ONLY:-rmsnorm,add_rmsnorm,layer_norm,softmax,silu_mul}" --variants torch.compile,magi_compile \
    --out "$OUT/bandwidth_$hints.json" 2>&1 | tee "$OUT/bandwidth_$hints.log" | tail -9
done
