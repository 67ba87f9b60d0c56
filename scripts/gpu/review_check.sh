#!/usr/bin/env bash
# 2026-11-28, after the review fixes (70f6a94): constants_to_device keyed by value, the bf16
# words read with memcpy. The CUDA input-update tests and the bf16 row-kernel tests.
# At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest input updates, bf16 row kernels" | tee -a "$S"
gpu_pytest pytest.log 100 tests/gpu/test_input_updates_cuda.py tests/gpu/test_fusion_cuda.py -rf \
  -k "masked_scatter or index_put or index_copy or (bf16 and (norm or softmax))" | tee -a "$S"
