#!/usr/bin/env bash
# Measures the sink/sibling fusion changes: benchmarks/recompute.py (both stacks, all
# variants: issue 9) and the two Llama-stack runtime workloads (issue 6's prefill and small
# batch, to see the forward did not lose). JSON and logs land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== benchmarks/recompute.py"
timeout 390 python benchmarks/recompute.py --device cuda --budget-s 340 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 | tee "$OUT/recompute.log" |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -40
echo "== benchmarks/run.py llama"
timeout 120 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/bench_llama.json" 2>&1 | tee "$OUT/bench_llama.log" | grep -v "^\[magi" | tail -25
