#!/usr/bin/env bash
# For the session after 2026-11-28 afternoon: eliminate_common_subexpressions (2d5a4e9) has run
# on the CPU tiers only. The GPU files whose graphs it changes (the Llama stack's rotary tables,
# the static-cache decoder's mask selects), then the Llama stack and host time per call with
# the pass on and off (MAGI_DISABLE_PASSES), alternating processes.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: files the pass changes" | tee -a "$S"
gpu_pytest gpu_cse.log 200 tests/gpu/test_custom_ops_cuda.py tests/gpu/test_input_updates_cuda.py \
  tests/gpu/test_cuda_end_to_end.py | tee -a "$S"
for off in "" eliminate_common_subexpressions; do
  echo "== MAGI_DISABLE_PASSES=$off: run.py llama" | tee -a "$S"
  MAGI_DISABLE_PASSES=$off timeout 150 python benchmarks/run.py --device cuda \
    --only llama_prefill,llama_small_batch --out "$OUT/llama_cse${off:+_off}.json" 2>&1 |
    grep -v "^\[magi" | grep -E "^llama|workload" | tee -a "$S"
  echo "== MAGI_DISABLE_PASSES=$off: host time" | tee -a "$S"
  MAGI_DISABLE_PASSES=$off timeout 90 python benchmarks/host_overhead.py --device cuda \
    --variants magi_cg,magi_cg --out "$OUT/host_cse${off:+_off}.json" 2>&1 | grep "CUDA graphs" |
    tee -a "$S"
done
