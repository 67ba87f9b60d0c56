#!/usr/bin/env bash
# Issue 5, fewer instructions per element (fast exp/division/max forms, packed stores, deep
# rows): the CUDA fusion and end-to-end tests, the full bandwidth table with compile latency,
# and the Llama prefill beside torch.compile with its kernel profile.   Logs and JSON in $OUT.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== tests/gpu: fusion, end to end"
gpu_pytest pytest_fusion.log 300 tests/gpu/test_fusion_cuda.py tests/gpu/test_cuda_end_to_end.py
echo "== benchmarks/bandwidth.py"
timeout 240 python benchmarks/bandwidth.py --device cuda --variants eager,torch.compile,magi_compile \
  --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -14
echo "== Llama prefill"
timeout 150 python benchmarks/run.py --device cuda --only llama_prefill --variants inductor,magi,magi_cg \
  --out "$OUT/prefill.json" 2>&1 | grep -v "^\[magi" | tail -4
timeout 120 python scripts/gpu/prefill_gaps.py --variants magi --json "$OUT/prefill_gaps.json" 2>&1 |
  grep "kernel\|=====" | head -12
