#!/usr/bin/env bash
# Session of 2026-11-28 (afternoon), first call: the GPU tests that bbe968c's runner changes
# (one lock for all runners, replays ordered per runner) and the packed bf16 pairs
# (MAGI_PACKED_BF16, still off by default) have not yet run on a GPU.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest (packed pairs, rotary kernels, strided vectors)" | tee -a "$S"
SECONDS=0
gpu_pytest pytest_packed.log 120 tests/gpu/test_fusion_cuda.py -rf \
  -k "packed or rotary or rotate or strided" | tee -a "$S"
echo "($SECONDS s)" | tee -a "$S"
echo "== pytest GPU: runner files" | tee -a "$S"
SECONDS=0
gpu_pytest gpu_runner.log 360 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_input_updates_cuda.py tests/gpu/test_api_cuda.py | tee -a "$S"
echo "($SECONDS s)" | tee -a "$S"
