#!/usr/bin/env bash
# Kernels that skip roundings eager's result does not need (issue 5; rotary's neg and cat):
# build; rotary with 1, 2 and 4 vectors per thread (MAGI_POINTWISE_UNROLL) beside
# torch.compile; benchmarks/bandwidth.py at its defaults (the issue's table and compile
# latency); tests/gpu/test_fusion_cuda.py.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
SWEEP_ONLY=rotary bash scripts/gpu/sweep_env.sh "" "MAGI_POINTWISE_UNROLL=2" "MAGI_POINTWISE_UNROLL=4"
echo "== benchmarks/bandwidth.py"
timeout 240 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  grep -v "^\[magi" | tail -16
echo "== pytest tests/gpu/test_fusion_cuda.py"
gpu_pytest pytest_fusion.log 240 tests/gpu/test_fusion_cuda.py -rf
