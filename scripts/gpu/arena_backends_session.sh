#!/usr/bin/env bash
# The memory-arena test with the attention kernel named (flash, cuDNN) instead of auto's
# per-process choice, alone and after the tests that ran before it in the whole tier; then the
# Llama stack's prefill and small batch, all five variants in one process.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== arena test, alone" | tee -a "$S"
gpu_pytest arena_alone.log 120 tests/gpu/test_memory_arena_cuda.py -rA -s | tee -a "$S"
grep "allocations per call" "$OUT/arena_alone.log" | tee -a "$S"
echo "== arena test after the fusion and runtime-choice tests" | tee -a "$S"
gpu_pytest arena_after.log 200 tests/gpu/test_runtime_choices_cuda.py \
  tests/gpu/test_memory_arena_cuda.py -rf -s | tee -a "$S"
grep "allocations per call" "$OUT/arena_after.log" | tee -a "$S"
echo "== Llama stack: prefill and small batch" | tee -a "$S"
timeout 240 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/llama_stack.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
python scripts/gpu/prefill_ratio.py "$OUT/llama_stack.json" prefill | tee -a "$S"
