#!/usr/bin/env bash
# For the session after 2026-11-28 (issue 6): the GPU tests of the files the review's runner
# changes touch (bbe968c: one lock for all runners, replays ordered per runner across its
# graphs), among them the two-graph thread test and the 33-apart rotary tables, which have
# not run on a GPU yet.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: runner files" | tee -a "$S"
gpu_pytest gpu_runner.log 420 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_input_updates_cuda.py tests/gpu/test_runtime_choices_cuda.py \
  tests/gpu/test_api_cuda.py | tee -a "$S"
echo "== pytest GPU: strided vectors" | tee -a "$S"
gpu_pytest gpu_strided.log 60 tests/gpu/test_fusion_cuda.py -k "unit_strided" | tee -a "$S"
