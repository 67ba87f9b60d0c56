#!/usr/bin/env bash
# The write_inputs_in_place pass (KV-cache updates in place) in one device call: build; its CUDA
# tests and the CUDA-graph tests; kernel tables of the GPT-2 and Llama-1B prefills under our
# CUDA graphs and reduce-overhead; the four causal-LM workloads side by side. Logs and JSON land
# in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 4
echo "== tests" | tee -a "$S"
gpu_pytest pytest_updates.log 200 tests/gpu/test_input_updates_cuda.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_cuda_graph_padding.py | tee -a "$S"
echo "== profiles" | tee -a "$S"
timeout 200 python scripts/gpu/profile_workloads.py --only gpt2_prefill,llama1b_prefill \
  --variants inductor_ro,magi_cg --rows 12 --json "$OUT/profile_updates.json" 2>&1 |
  grep -v "^\[magi" | grep -v "^   gap" | tee "$OUT/profile_updates.log" | tee -a "$S" | tail -60
echo "== run.py causal LMs" | tee -a "$S"
timeout 330 python benchmarks/run.py --device cuda \
  --only gpt2_prefill,gpt2_decode,llama1b_prefill,llama1b_decode \
  --out "$OUT/bench_lm.json" 2>&1 | grep -v "^\[magi" | tail -30 | tee -a "$S"
