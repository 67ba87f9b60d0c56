#!/usr/bin/env bash
# Issue 5, 2026-11-28 (fourth session), after wide_rows_session.sh: the driver and CUDA-graph
# test files once more with time for their last line (38bf95f's capture-release logging), and
# rows of 12288 bf16 columns again, wide (the default) and streamed, since torch.compile's
# RMSNorm measured 79.3% and 99.6% of copy bandwidth in the two processes there. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest: driver and CUDA graphs" | tee -a "$S"
gpu_pytest gpu_graph_tests.log 330 tests/gpu/test_cuda_driver.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_cuda_graph_padding.py --durations=5 | tee -a "$S"
grep -A8 "slowest" "$OUT/gpu_graph_tests.log" | tee -a "$S"
gpu_row_run "$S" wide_12288_again 8192 12288
gpu_row_run "$S" streamed_12288_again 8192 12288 MAGI_ROW_HELD_THREADS=256
