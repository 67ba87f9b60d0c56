#!/usr/bin/env bash
# Issue 6 (2026-11-28, evening): a graph whose inputs keep arriving at other addresses gets up
# to four executables (CudaGraphRunner.num_executables), and a replay picks the one whose
# input copy nodes already read the call's tensors. The GPU tests of graphs, padding, input
# updates and direct calls; the CPU direct-call tests on Python 3.12.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: graphs, padding, input updates" | tee -a "$S"
gpu_pytest gpu_tests.log 240 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_input_updates_cuda.py | tee -a "$S"
echo "== pytest GPU: direct calls and runtime choices" | tee -a "$S"
gpu_pytest gpu_tests_runtime.log 200 tests/gpu/test_runtime_choices_cuda.py | tee -a "$S"
