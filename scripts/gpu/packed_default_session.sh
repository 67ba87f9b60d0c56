#!/usr/bin/env bash
# Session of 2026-11-28 (afternoon), second call, after packed bf16 pairs became the default
# (68e642b): the fusion tests with it on; RMSNorm's row kernels beside torch.compile at the
# default and with 5 blocks per SM (MAGI_ROW_MIN_BLOCKS=5: 48 registers, 16 bytes spilled);
# Inductor's RMSNorm kernel (Triton source, PTX, SASS) for issue 5.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== inductor rmsnorm kernel" | tee -a "$S"
timeout 90 python scripts/gpu/inductor_rmsnorm_ptx.py "$OUT/inductor_rmsnorm.txt" 2>&1 | tail -2 | tee -a "$S"
gpu_row_bandwidth "$S" default
MAGI_ROW_MIN_BLOCKS=5 gpu_row_bandwidth "$S" min_blocks5
echo "== pytest GPU: fusion (packed pairs on by default)" | tee -a "$S"
SECONDS=0
gpu_pytest gpu_fusion.log 250 tests/gpu/test_fusion_cuda.py tests/gpu/test_custom_ops_cuda.py | tee -a "$S"
echo "($SECONDS s)" | tee -a "$S"
