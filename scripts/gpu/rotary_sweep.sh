#!/usr/bin/env bash
# Rotary (the bandwidth benchmark's 16384 x 8192 bf16, heads of 128) under launch and load
# settings (docs/config.md: MAGI_POINTWISE_UNROLL, MAGI_KERNEL_GRID, MAGI_MAX_BLOCK_THREADS,
# MAGI_VECTOR_IO), one process per setting, to see what holds it at ~80% of copy bandwidth.
# Also dumps its CUDA source (scripts/gpu/rotary_source.py). Logs in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
OUT="$OUT" timeout 90 python scripts/gpu/rotary_source.py 2>&1 | grep -v "^\[magi"
configs=("" "MAGI_POINTWISE_UNROLL=2" "MAGI_POINTWISE_UNROLL=4" "MAGI_POINTWISE_UNROLL=2 MAGI_KERNEL_GRID=wave"
  "MAGI_MAX_BLOCK_THREADS=128" "MAGI_MAX_BLOCK_THREADS=512" "MAGI_VECTOR_IO=ldg" "MAGI_VECTOR_IO=plain")
for c in "${configs[@]}"; do
  echo "== ${c:-default}"
  env $c MAGI_CACHE_DIR="/tmp/sweep_cache_${c//[ =]/_}" timeout 120 python benchmarks/bandwidth.py \
    --device cuda --no-compile-latency --variants torch.compile,magi_compile --only rotary,silu_mul \
    2>&1 | grep -E "rotary|silu_mul|copy" | tail -4
done
