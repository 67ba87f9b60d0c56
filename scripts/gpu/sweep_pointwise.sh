#!/usr/bin/env bash
# Launch-shape sweep of generated kernels on the GPU machine (after `run_gpu.sh build`):
# bandwidth per MAGI_POINTWISE_UNROLL x MAGI_KERNEL_GRID setting (docs/config.md), one process
# per setting.   bash scripts/gpu/sweep_pointwise.sh ["unroll grid workloads" ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
configs=("$@")
pw="silu_mul,x*y+z" rows="rmsnorm,add_rmsnorm,layer_norm,softmax"
((${#configs[@]})) || configs=("1 wave $pw" "2 wave $pw" "4 wave $pw" "1 all $pw" "2 all $pw"
  "1 all $rows")
for c in "${configs[@]}"; do
  read -r unroll grid only <<<"$c"
  tag="u${unroll}_${grid}_${only//[*+,]/_}"
  echo "== $tag"
  MAGI_POINTWISE_UNROLL=$unroll MAGI_KERNEL_GRID=$grid \
    timeout 150 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
    --variants magi_compile --only "$only" --out "$OUT/sweep_$tag.json" 2>&1 | tail -6
done
