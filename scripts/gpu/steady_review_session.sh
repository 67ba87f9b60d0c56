#!/usr/bin/env bash
# Issue 6 (2026-11-28, afternoon), after the review of SteadyInputs and the kept graph inputs:
# the direct call passes the generation it gathered (not one another thread started since),
# keeps parameters only for calls that ran, and treats a tensor refusing storage access as
# untracked. The GPU tests of graphs, padding and direct calls; the CPU direct-call tests on
# Python 3.12.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: graphs, padding, direct calls" | tee -a "$S"
gpu_pytest gpu_tests.log 200 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_runtime_choices_cuda.py | tee -a "$S"
echo "== pytest CPU direct calls (python $(python -c 'import sys; print(sys.version.split()[0])'))" | tee -a "$S"
CUDA_VISIBLE_DEVICES= gpu_pytest cpu_direct.log 120 tests/python/test_fast_dispatch_native.py \
  tests/python/test_fast_dispatch.py | tee -a "$S"
