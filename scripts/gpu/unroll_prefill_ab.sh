#!/usr/bin/env bash
# Vectors per thread of the rotary kernels at the prefill's shape (4096 tokens x 16 and 8
# heads): for MAGI_POINTWISE_UNROLL=1, 2 and 4, the prefill's kernel profile (magi_compile) and
# the prefill timed beside torch.compile.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
for u in 1 2 4; do
  echo "== MAGI_POINTWISE_UNROLL=$u: profile"
  MAGI_POINTWISE_UNROLL=$u timeout 90 python scripts/gpu/profile_workloads.py --only llama_prefill \
    --variants magi --rows 8 --json "$OUT/profile_u$u.json" 2>&1 | grep -E "fused_mul_slice|=====" 
  echo "== MAGI_POINTWISE_UNROLL=$u: prefill"
  MAGI_POINTWISE_UNROLL=$u timeout 100 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants magi,inductor --out "$OUT/prefill_u$u.json" 2>&1 | grep -v "^\[magi" | tail -3
done
