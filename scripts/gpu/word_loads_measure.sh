#!/usr/bin/env bash
# Issue 5/6 (2026-11-28), after bf16 elements are read from 32-bit words: the failing CUDA
# masked_scatter input-update tests with their tracebacks; bandwidth.py at its defaults (every
# kernel beside eager and torch.compile, and compile latency); the Llama stack of issue 6.
# At most 8 files in $OUT (what comes back).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== pytest masked_scatter updates" | tee -a "$S"
timeout 90 python -m pytest tests/gpu/test_input_updates_cuda.py -k masked_scatter -q -p no:cacheprovider \
  --tb=long 2>&1 | grep -v "^DEBUG\|^\[magi\|^E   frame #" > "$OUT/masked_scatter.log"
grep -E "Error|error:|^E  |passed|failed" "$OUT/masked_scatter.log" | grep -v "frame #" | head -30 | tee -a "$S"
echo "== bandwidth" | tee -a "$S"
timeout 230 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  grep -v "^\[magi" | tail -24 | tee -a "$S"
echo "== llama stack" | tee -a "$S"
timeout 200 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/llama_stack.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
python scripts/gpu/prefill_ratio.py "$OUT/llama_stack.json" prefill | tee -a "$S"
