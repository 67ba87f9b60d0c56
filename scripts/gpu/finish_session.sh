#!/usr/bin/env bash
# The CUDA test files after the fusion tests that shifted_session.sh's time limit cut (memory
# trace, offload), and a second process of each prefill pair of order_session.sh. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest (memory trace, offload)"
gpu_pytest pytest_offload.log 200 tests/gpu/test_memory_trace_cuda.py tests/gpu/test_offload_cuda.py
for pair in magi,inductor magi_cg,inductor; do
  echo "== benchmarks/run.py --variants $pair"
  timeout 90 python benchmarks/run.py --device cuda --only llama_prefill --variants "$pair" \
    --out "$OUT/prefill_${pair/,/_}.json" 2>&1 | grep -v "^\[magi\|^DEBUG" | tail -3
done
