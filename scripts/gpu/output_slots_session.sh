#!/usr/bin/env bash
# Outputs written by the graph into two alternating buffer sets (issue 6) in one device call:
# build; the CUDA-graph and bucket tests; the host-time breakdown and host_overhead.py; the
# two Llama-stack workloads; then the decode regression test. Logs and JSON in $OUT.
#   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest CUDA-graph and bucket tests (the decode regression test last)"
gpu_pytest pytest_graphs.log 150 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  -k "not reduce_overhead"
echo "== host breakdown"
timeout 90 python scripts/gpu/host_breakdown.py --json "$OUT/host_breakdown.json" 2>&1 |
  grep -v "^\[magi" | tail -30
echo "== benchmarks/host_overhead.py"
timeout 200 python benchmarks/host_overhead.py --device cuda --out "$OUT/host_overhead.json" 2>&1 |
  grep -v "^\[magi" | tail -15
echo "== benchmarks/run.py llama_small_batch,llama_prefill"
timeout 200 python benchmarks/run.py --device cuda --only llama_small_batch,llama_prefill \
  --out "$OUT/bench_llama.json" 2>&1 | grep -v "^\[magi" | tail -6
echo "== decode regression test"
gpu_pytest pytest_decode.log 170 tests/gpu/test_cuda_graphs.py -k reduce_overhead
