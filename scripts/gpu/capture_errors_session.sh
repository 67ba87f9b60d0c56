#!/usr/bin/env bash
# Issue 6 (written 2026-11-28, second session; not yet run): what a user sees when a capture
# breaks. A custom op that synchronises (.item()) in a FULL graph must raise UserError with
# what to do, leave PyTorch's allocator with no capture under way (release_invalidated_capture;
# empty_cache() asserts otherwise), and PIECEWISE must then run it between graphs
# (test_cuda_graphs.py); then the
# CUDA-graph test files and the custom-op file, which the capture's error path touches.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== the capture-error test" | tee -a "$S"
gpu_pytest gpu_capture_error.log 120 \
  "tests/gpu/test_cuda_graphs.py::test_a_custom_op_that_synchronises_breaks_a_full_capture_with_advice" |
  tee -a "$S"
grep -A12 "UserError\|capturing a CUDA graph" "$OUT/gpu_capture_error.log" | head -30 >> "$S"
echo "== CUDA-graph and custom-op test files" | tee -a "$S"
gpu_pytest gpu_graphs.log 400 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_input_updates_cuda.py tests/gpu/test_api_cuda.py tests/gpu/test_custom_ops_cuda.py |
  tee -a "$S"
