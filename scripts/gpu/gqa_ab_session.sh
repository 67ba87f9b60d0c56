#!/usr/bin/env bash
# Grouped key/value heads in training, with and without the pass: build; the new CUDA test;
# benchmarks/recompute.py (torch.compile and HEURISTIC, 40 steps) with group_query_attention
# on and off (MAGI_DISABLE_PASSES), alternating; a kernel profile of the 4-layer training step
# both ways. Logs and JSON in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_gqa_train.log 100 tests/gpu/test_runtime_choices_cuda.py -k "grouped_query"
for run in on off on off; do
  echo "== recompute.py, pass $run"
  if [[ $run == off ]]; then export MAGI_DISABLE_PASSES=group_query_attention; else unset MAGI_DISABLE_PASSES; fi
  timeout 130 python benchmarks/recompute.py --device cuda --variants tc,magi_heuristic --steps 40 \
    --budget-s 110 --out "$OUT/recompute_gqa_$run.$RANDOM.json" 2>&1 |
    grep -E "^(torch.compile |magi HEURISTIC) |  magi HEURISTIC:"
done
for run in on off; do
  echo "== profile llama_train, pass $run"
  if [[ $run == off ]]; then export MAGI_DISABLE_PASSES=group_query_attention; else unset MAGI_DISABLE_PASSES; fi
  timeout 100 python scripts/gpu/profile_workloads.py --only llama_train --variants magi \
    --rows 40 --json "$OUT/profile_train_gqa_$run.json" 2>&1 | grep -v "^\[magi" | tail -46
done
