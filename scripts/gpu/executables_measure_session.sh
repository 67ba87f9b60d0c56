#!/usr/bin/env bash
# Issue 6 (2026-11-28, evening): the record after executables per input address. Host time
# per call of the 4-layer stack at batch 4 x 32 with 4 input tensors in turn, in three
# processes (variants alternating, orders differing), beside reduce-overhead; then the Llama
# stack (prefill and small batch) beside torch.compile. At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
n=0
for variants in magi_cg,magi_cg_args,magi_cg,magi_cg_args,inductor_ro \
  magi_cg_args,magi_cg,magi_cg_args,magi_cg,inductor_ro \
  inductor_ro,magi_cg,magi_cg_args,magi_cg,magi_cg_args; do
  n=$((n + 1))
  echo "== host overhead, process $n: $variants" | tee -a "$S"
  timeout 150 python benchmarks/host_overhead.py --device cuda --variants "$variants" \
    --out "$OUT/host_overhead_$n.json" 2>&1 | grep -v "^\[magi" | grep -E "µs|graphs|reduce" | tail -7 | tee -a "$S"
done
echo "== llama stack" | tee -a "$S"
timeout 220 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/llama_stack.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
python scripts/gpu/prefill_ratio.py "$OUT/llama_stack.json" prefill | tee -a "$S"
