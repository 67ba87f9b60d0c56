#!/usr/bin/env bash
# Issue 5, after the fast forms (and their subnormal-divisor fix): the CUDA test tier's kernel
# and model tests, the full bandwidth table with compile latency, and the Llama prefill beside
# torch.compile.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== tests/gpu"
gpu_pytest pytest_gpu.log 330 tests/gpu/test_fusion_cuda.py tests/gpu/test_cuda_end_to_end.py \
  tests/gpu/test_recompute_cuda.py tests/gpu/test_api_cuda.py tests/gpu/test_cuda_graphs.py
echo "== benchmarks/bandwidth.py"
timeout 240 python benchmarks/bandwidth.py --device cuda --variants eager,torch.compile,magi_compile \
  --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -14
echo "== Llama prefill"
timeout 150 python benchmarks/run.py --device cuda --only llama_prefill --variants inductor,magi,magi_cg \
  --out "$OUT/prefill.json" 2>&1 | grep -v "^\[magi" | tail -4
