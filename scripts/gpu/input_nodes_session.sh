#!/usr/bin/env bash
# Input copy nodes in CUDA graphs and the runner's last-signature fast path (issue 6, host
# time): build; the CUDA-graph, padding, arena, API tests and the SwiGLU peak test; the
# busy-GPU host breakdown (scripts/gpu/host_floor.py) with 4 rotating inputs and with one;
# benchmarks/host_overhead.py beside eager and reduce-overhead, both ways.
# Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
# TESTS and TESTS_S: another set of test files and its time limit (direct_entry_session.sh).
gpu_pytest pytest_graphs.log "${TESTS_S:-240}" ${TESTS:-tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_cuda_graph_padding.py tests/gpu/test_memory_arena_cuda.py \
  tests/gpu/test_api_cuda.py tests/gpu/test_fusion_cuda.py::test_swiglu_product_takes_the_gate_buffer} -rf
for n in 4 1; do
  echo "== host floor, $n inputs"
  timeout 150 python scripts/gpu/host_floor.py --inputs $n --json "$OUT/host_floor_$n.json" 2>&1 |
    grep -v "^\[magi" | tail -60
done
for n in 4 1; do
  echo "== host overhead, $n inputs"
  timeout 150 python benchmarks/host_overhead.py --variants eager,magi_cg,magi_cg_args,inductor_ro \
    --inputs $n --out "$OUT/host_overhead_$n.json" 2>&1 | grep -v "^\[magi" | tail -9
done
