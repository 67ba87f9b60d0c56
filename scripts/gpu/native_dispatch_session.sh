#!/usr/bin/env bash
# Issue 6, host time per call: direct calls run from C++ (python/csrc/bind_dispatch.cpp) and
# fast_dispatch_guards=arguments, on the 4-layer Llama stack at 4 x 32 tokens beside
# torch.compile's reduce-overhead; the host-time breakdown; the CUDA-graph, runtime-choice and
# fast-dispatch tests. Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== tests"
gpu_pytest pytest_dispatch.log 300 tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_runtime_choices_cuda.py tests/python/test_fast_dispatch.py
echo "== host breakdown"
timeout 120 python scripts/gpu/host_breakdown.py --json "$OUT/host_breakdown.json" 2>&1 |
  grep -v "^\[magi"
echo "== host overhead"
timeout 300 python benchmarks/host_overhead.py --device cuda \
  --variants eager,magi,magi_cg,magi_cg_args,inductor_ro --out "$OUT/host_overhead.json" 2>&1 |
  grep -v "^\[magi" | tail -14
