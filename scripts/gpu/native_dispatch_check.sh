#!/usr/bin/env bash
# Second call of the native-dispatch session: the CUDA test files that run inference through
# direct calls (API, end to end, padding, custom ops, memory trace, offload, driver), then the
# host breakdown with the C++ and Python direct paths interleaved, and the host benchmark again
# on this machine. Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== tests"
gpu_pytest pytest_tier.log 330 tests/gpu/test_api_cuda.py tests/gpu/test_cuda_driver.py \
  tests/gpu/test_cuda_end_to_end.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_custom_ops_cuda.py tests/gpu/test_memory_trace_cuda.py \
  tests/gpu/test_offload_cuda.py
echo "== host breakdown"
timeout 150 python scripts/gpu/host_breakdown.py --iters 300 --rounds 5 \
  --json "$OUT/host_breakdown.json" 2>&1 | grep -v "^\[magi"
echo "== host overhead"
timeout 240 python benchmarks/host_overhead.py --device cuda \
  --variants magi_cg,magi_cg_args,inductor_ro --out "$OUT/host_overhead.json" 2>&1 |
  grep -v "^\[magi" | tail -8
