#!/usr/bin/env bash
# The peak simulation with outputs written over dying inputs: build; benchmarks/recompute.py
# (predicted against measured peaks, every policy); the fusion and recompute CUDA tests at the
# column-unroll kernels. Logs and JSON in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== benchmarks/recompute.py"
timeout 300 python benchmarks/recompute.py --device cuda --budget-s 260 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -34
echo "== pytest (fusion, recompute)"
gpu_pytest pytest_fusion_recompute.log 200 tests/gpu/test_fusion_cuda.py tests/gpu/test_recompute_cuda.py
