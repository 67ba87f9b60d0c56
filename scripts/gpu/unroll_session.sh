#!/usr/bin/env bash
# Pointwise kernels with shifted or strided inputs at 4 vectors per thread (issue 5's rotary,
# issue 6's prefill): build; rotary's bandwidth at the defaults; the two Llama-stack runtime
# workloads beside eager, torch.compile and reduce-overhead; the prefill's kernel profile;
# tests/gpu/test_fusion_cuda.py.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== rotary bandwidth"
timeout 90 python benchmarks/bandwidth.py --device cuda --no-compile-latency --only rotary \
  --variants torch.compile,magi_compile --out "$OUT/bandwidth_rotary.json" 2>&1 |
  grep -v "^\[magi" | tail -4
echo "== runtime workloads"
timeout 170 python benchmarks/run.py --device cuda --only llama_small_batch,llama_prefill \
  --out "$OUT/llama_runtime.json" 2>&1 | grep -v "^\[magi" | tail -6
echo "== prefill profile"
timeout 100 python scripts/gpu/profile_workloads.py --only llama_prefill --variants inductor,magi \
  --rows 10 --json "$OUT/profile.json" 2>&1 | grep -v "^\[magi" | tail -30
echo "== pytest tests/gpu/test_fusion_cuda.py"
gpu_pytest pytest_fusion.log 200 tests/gpu/test_fusion_cuda.py -rf
