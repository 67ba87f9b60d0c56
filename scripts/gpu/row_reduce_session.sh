#!/usr/bin/env bash
# Issue 5 (2026-11-27): block reductions of row kernels with one barrier (scratch halves
# alternating) against two (MAGI_REDUCE_TWO_BARRIERS, an A/B switch), crossed with the row
# prefetch (MAGI_ROW_PREFETCH off / lines at 100% and 50% of a wave ahead) and a persistent grid
# (MAGI_KERNEL_GRID=wave). Build; the CUDA row-kernel tests; bandwidth.py's four row kernels
# beside torch.compile, one process per setting.   Logs and JSON in $OUT.   (carry .deps)
# Ran at 77b94f3 (H200, 2026-11-27 night); nothing it measured was kept (reverted in 8b1febd; findings in
# benchmarks/results/extra/cuda_row_findings.json), so the variables it sets no longer exist: kept as the
# record of that measurement.
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== pytest (row kernels)" | tee -a "$S"
gpu_pytest pytest_rows.log 150 tests/gpu/test_fusion_cuda.py -rf -k "norm or softmax" | tee -a "$S"
band() { gpu_row_bandwidth "$S" "$1"; }  # band LABEL
export MAGI_ROW_PREFETCH=off
MAGI_REDUCE_TWO_BARRIERS=1 band two_barriers
band one_barrier
MAGI_ROW_PREFETCH=lines band one_barrier_prefetch100
MAGI_ROW_PREFETCH=lines MAGI_ROW_PREFETCH_AHEAD=50 band one_barrier_prefetch50
MAGI_KERNEL_GRID=wave band one_barrier_wave
MAGI_REDUCE_TWO_BARRIERS=1 band two_barriers_again
band one_barrier_again
