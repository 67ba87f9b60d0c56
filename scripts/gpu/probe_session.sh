#!/usr/bin/env bash
# Issue 6 probes in one device call: build; what cuBLASLt algorithm probing buys per Llama
# matmul shape (scripts/gpu/matmul_probe.cu); where a direct CUDA-graph call's host time goes
# (scripts/profile_direct_call.py, buckets on and off); the Llama small-batch benchmark (peak
# memory with one capture stream). Logs land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== matmul probe"
nvcc -O2 -std=c++17 -arch=sm_90 scripts/gpu/matmul_probe.cu -lcublasLt -lcublas -o /tmp/mp &&
  /tmp/mp > "$OUT/matmul_probe.json" 2> "$OUT/matmul_probe.log"
cat "$OUT/matmul_probe.log"
for pad in 1 0; do
  echo "== host time per stage, cudagraph_padding=$pad"
  timeout 120 python scripts/profile_direct_call.py --device cuda --mode FULL --padding $pad \
    --iters 3000 2>&1 | grep -v "^\[magi\|Warning\|warn" | tail -14
done
echo "== host time per stage, NONE"
timeout 120 python scripts/profile_direct_call.py --device cuda --mode NONE --iters 2000 2>&1 |
  grep -v "^\[magi\|Warning\|warn" | tail -8
echo "== benchmarks/run.py llama_small_batch"
timeout 200 python benchmarks/run.py --device cuda --only llama_small_batch \
  --out "$OUT/bench_small.json" 2>&1 | grep -v "^\[magi" | tail -30
