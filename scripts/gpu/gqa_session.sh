#!/usr/bin/env bash
# Grouped-query attention without the repeated copies (passes::group_query_attention): build;
# the runtime-choice, CUDA-graph and end-to-end CUDA tests; the two Llama-stack workloads and
# the Llama-3.2-1B-shaped prefill and decode side by side with eager and torch.compile; a kernel
# profile of the prefill. Logs and JSON in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_gqa.log 200 tests/gpu/test_runtime_choices_cuda.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_cuda_graph_padding.py tests/gpu/test_cuda_end_to_end.py
echo "== benchmarks/run.py"
timeout 240 python benchmarks/run.py --device cuda \
  --only llama_prefill,llama_small_batch,llama1b_prefill,llama1b_decode \
  --out "$OUT/bench_gqa.json" 2>&1 | grep -v "^\[magi\|^DEBUG" | tee "$OUT/bench_gqa.log" | tail -30
echo "== profile"
gpu_profile llama_prefill 25 120 | tail -70
