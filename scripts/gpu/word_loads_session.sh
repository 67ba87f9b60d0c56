#!/usr/bin/env bash
# Issue 5 (2026-11-28): bf16 elements read from 32-bit words (one shift or mask per element
# instead of an extract and a shift) and block reductions finished by a butterfly over the warps'
# values, A/B against the old forms (MAGI_AB_OLD=conv|reduce|both, a switch for this session),
# each in its own process beside torch.compile; then the CUDA row-kernel tests and the CUDA
# input-update tests (first GPU run of the last session's runner and PIECEWISE cases).
# Logs and JSON in $OUT.   (carry .deps)
# Ran at 2f8921e + the word loads (H200, 2026-11-28). The word loads were kept (60a50f5), the
# butterfly was not (level within the spread), and MAGI_AB_OLD no longer exists: kept as the
# record of that measurement.
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
band() { gpu_row_bandwidth "$S" "$1"; }  # band LABEL
band new
MAGI_AB_OLD=both band old_both
MAGI_AB_OLD=reduce band old_reduce
band new_again
MAGI_AB_OLD=both band old_both_again
echo "== pytest (row kernels)" | tee -a "$S"
gpu_pytest pytest_rows.log 120 tests/gpu/test_fusion_cuda.py -rf -k "norm or softmax" | tee -a "$S"
echo "== pytest (input updates)" | tee -a "$S"
gpu_pytest pytest_updates.log 150 tests/gpu/test_input_updates_cuda.py -rf | tee -a "$S"
