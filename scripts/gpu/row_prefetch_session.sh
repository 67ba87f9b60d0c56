#!/usr/bin/env bash
# Issue 5 (2026-11-27): row kernels whose rows fit in registers ask L2 for the row a block
# reaches a wave of resident rows later (MAGI_ROW_PREFETCH, MAGI_ROW_PREFETCH_AHEAD). Build; the
# CUDA row-kernel tests; then bandwidth.py's four row kernels beside torch.compile, one process
# per setting (lines at 100% of a wave ahead, off, bulk, lines at 50% and 200%, lines again);
# last the Llama prefill with prefetch on and off.   Logs and JSON in $OUT.   (carry .deps)
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
band lines
MAGI_ROW_PREFETCH=off band off
MAGI_ROW_PREFETCH=bulk band bulk
MAGI_ROW_PREFETCH_AHEAD=50 band lines50
MAGI_ROW_PREFETCH_AHEAD=200 band lines200
band lines_again
prefill() {  # prefill LABEL: the Llama prefill beside torch.compile, one process
  timeout 150 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants inductor,magi,magi_cg --out "$OUT/prefill_$1.json" 2>&1 | grep -v "^\[magi" | tail -2
  python scripts/gpu/prefill_ratio.py "$OUT/prefill_$1.json" "$1" | tee -a "$S"
}
echo "== prefill" | tee -a "$S"
prefill lines
MAGI_ROW_PREFETCH=off prefill off
