#!/usr/bin/env bash
# 2026-11-28 (issue 6): a free executable never replayed is taken without counting a miss
# (the first two replays after a capture, with one input tensor, had made a loop's graph a
# third executable). The whole CUDA-graph test file.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: CUDA graphs" | tee -a "$S"
gpu_pytest gpu_tests.log 200 tests/gpu/test_cuda_graphs.py | tee -a "$S"
