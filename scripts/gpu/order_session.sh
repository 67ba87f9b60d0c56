#!/usr/bin/env bash
# The CUDA test files the previous tier run did not reach in its time limit, and the Llama
# stack's prefill timed as pairs (magi_compile beside torch.compile alone, without eager's
# rounds before it; then magi's CUDA graphs beside it), one process each. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest (recompute, runtime choices)"
gpu_pytest pytest_rest.log 260 tests/gpu/test_recompute_cuda.py tests/gpu/test_runtime_choices_cuda.py
for pair in magi,inductor magi_cg,inductor; do
  echo "== benchmarks/run.py --variants $pair"
  timeout 90 python benchmarks/run.py --device cuda --only llama_prefill --variants "$pair" \
    --out "$OUT/prefill_${pair/,/_}.json" 2>&1 | grep -v "^\[magi\|^DEBUG" | tail -3
done
