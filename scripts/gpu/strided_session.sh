#!/usr/bin/env bash
# Strided loads decomposed once per row (issue 5) and lone strided copies generated (issue 9):
# build; the CUDA fusion tests; the bandwidth benchmark's rotary beside RMSNorm and SiLU-mul; a
# kernel profile of the Llama training step (torch.compile beside magi); the host-time
# breakdown of a CUDA-graph call (issue 6). Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== host breakdown (padding on, then off)"
timeout 90 python scripts/gpu/host_breakdown.py --json "$OUT/host_breakdown.json" 2>&1 | grep -v "^\[magi" | tail -20
timeout 60 python scripts/gpu/host_breakdown.py --no-padding --json "$OUT/host_breakdown_no_pad.json" 2>&1 | grep -v "^\[magi" | tail -20
echo "== pytest tests/gpu/test_fusion_cuda.py"
gpu_pytest pytest_fusion.log 200 tests/gpu/test_fusion_cuda.py
echo "== benchmarks/bandwidth.py"
timeout 150 python benchmarks/bandwidth.py --device cuda --only rotary,rmsnorm,silu_mul \
  --no-compile-latency --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -10
echo "== profile llama_train"
gpu_profile llama_train 30 200 | tail -70
