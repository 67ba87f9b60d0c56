#!/usr/bin/env bash
# After write_inputs_in_place and the narrower fusion barriers (a write splits only groups that
# read what it writes), in one device call: build; the input-update, CUDA-graph and end-to-end
# CUDA tests; the causal-LM and Llama-stack workloads side by side. Logs and JSON in $OUT.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 4
echo "== tests" | tee -a "$S"
gpu_pytest pytest_a.log 150 tests/gpu/test_input_updates_cuda.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_cuda_end_to_end.py | tee -a "$S"
echo "== run.py" | tee -a "$S"
timeout 320 python benchmarks/run.py --device cuda \
  --only gpt2_prefill,gpt2_decode,llama1b_prefill,llama1b_decode,llama_prefill,llama_small_batch \
  --out "$OUT/bench_lm.json" 2>&1 | grep -v "^\[magi" | tail -12 | tee -a "$S"
