#!/usr/bin/env bash
# Issue 6 (2026-11-28, second session): captures in thread-local capture mode. The new test
# (another thread allocating and freeing device memory while the main thread captures) with the
# change, then with the capture mode put back to global in a scratch copy of the source, to see
# that the test fails without the change; then the change's tree rebuilt and the four CUDA-graph
# test files.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
T=tests/gpu/test_cuda_graphs.py::test_capture_beside_another_threads_allocations
F=src/runtime/cuda_graph_capture.cpp
gpu_build "$S" 2
echo "== thread-local capture mode (the change)" | tee -a "$S"
gpu_pytest gpu_capture_local.log 120 "$T" | tee -a "$S"
cp "$F" /tmp/capture_saved.cpp
sed -i 's/capture_begin(graph_pool, cudaStreamCaptureModeThreadLocal)/capture_begin(graph_pool, cudaStreamCaptureModeGlobal)/' "$F"
gpu_build /dev/null 2
echo "== global capture mode (before the change), three runs" | tee -a "$S"
for i in 1 2 3; do gpu_pytest "gpu_capture_global_$i.log" 120 "$T" | tee -a "$S"; done
cp /tmp/capture_saved.cpp "$F"
gpu_build /dev/null 2
echo "== CUDA-graph test files" | tee -a "$S"
gpu_pytest gpu_graphs.log 300 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_input_updates_cuda.py tests/gpu/test_api_cuda.py | tee -a "$S"
