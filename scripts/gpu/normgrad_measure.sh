#!/usr/bin/env bash
# Final measurements of the session's fusion changes (sink, siblings, norm gradients as one row
# kernel): the two Llama-stack runtime workloads (issue 6) and benchmarks/recompute.py again
# (issue 9; a second process, a second look at the run-to-run spread).  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== benchmarks/run.py llama"
timeout 120 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/bench_llama.json" 2>&1 | tee "$OUT/bench_llama.log" | grep -v "^\[magi" | tail -6
echo "== benchmarks/recompute.py"
timeout 300 python benchmarks/recompute.py --device cuda --budget-s 260 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 | tee "$OUT/recompute.log" |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | grep -e "==" -e "magi" -e "^torch.compile  "
