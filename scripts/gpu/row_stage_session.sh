#!/usr/bin/env bash
# Issue 5 (2026-11-27): row kernels whose rows fit in registers stage each block's next row
# through shared memory (cp.async) while reducing the current one (MAGI_ROW_STAGE_ROWS rows per
# block). Build; the CUDA row-kernel tests with 2 and 4 rows per block; bandwidth.py's four row
# kernels beside torch.compile, one process per setting (L2 prefetch off); the Llama prefill
# with staging off and at 4.   Logs and JSON in $OUT.   (carry .deps)
# Ran at 77b94f3 (H200, 2026-11-27 night); nothing it measured was kept (reverted in 8b1febd; findings in
# benchmarks/results/extra/cuda_row_findings.json), so the variables it sets no longer exist: kept as the
# record of that measurement.
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
export MAGI_ROW_PREFETCH=off
for r in 2 4; do
  echo "== pytest (row kernels), MAGI_ROW_STAGE_ROWS=$r" | tee -a "$S"
  MAGI_ROW_STAGE_ROWS=$r gpu_pytest pytest_rows_$r.log 150 tests/gpu/test_fusion_cuda.py -rf \
    -k "norm or softmax" | tee -a "$S"
done
band() { gpu_row_bandwidth "$S" "$1"; }  # band LABEL
MAGI_ROW_STAGE_ROWS=0 band stage0
MAGI_ROW_STAGE_ROWS=2 band stage2
MAGI_ROW_STAGE_ROWS=4 band stage4
MAGI_ROW_STAGE_ROWS=8 band stage8
MAGI_ROW_STAGE_ROWS=0 band stage0_again
prefill() {  # prefill LABEL: the Llama prefill beside torch.compile, one process
  timeout 150 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants inductor,magi,magi_cg --out "$OUT/prefill_$1.json" 2>&1 | grep -v "^\[magi" | tail -1
  python scripts/gpu/prefill_ratio.py "$OUT/prefill_$1.json" "$1" | tee -a "$S"
}
MAGI_ROW_STAGE_ROWS=4 prefill stage4
MAGI_ROW_STAGE_ROWS=0 prefill stage0
