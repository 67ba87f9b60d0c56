#!/usr/bin/env bash
# The recompute planner with grouped-head copies free (is_grouped_attention_copy): build, the
# recompute and grouped-query GPU tests, then benchmarks/recompute.py with interleaved timing.
# JSON and logs in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== GPU tests: recompute, grouped-query training"
gpu_pytest tests_recompute.log 150 tests/gpu/test_recompute_cuda.py \
  "tests/gpu/test_runtime_choices_cuda.py::test_grouped_query_training_reads_the_unrepeated_heads"
echo "== benchmarks/recompute.py"
timeout 400 python benchmarks/recompute.py --device cuda --budget-s 330 --steps 40 --rounds 4 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tee "$OUT/recompute.log" | tail -45
