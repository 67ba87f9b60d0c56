#!/usr/bin/env bash
# Issue 5 (2026-11-27, night): Nsight Compute showed our RMSNorm (16384 x 8192 bf16) at 60
# registers per thread, 50% theoretical occupancy, against Inductor's 24 registers and 100%
# (3.80 against 4.00 TB/s on the H200). Row-kernel settings that trade registers for
# occupancy (MAGI_ROW_MIN_BLOCKS, later per-column loads, fewer chunks per thread), each in its
# own process, torch.compile at the start and the end; then the registers and spills of every
# compiled RMSNorm variant. One summary file in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
SWEEP_VARIANTS=torch.compile,magi_compile SWEEP_TAG=_first bash scripts/gpu/sweep_rows.sh "auto 4 256 all 0" 2>&1 | tee -a "$S"
bash scripts/gpu/sweep_rows.sh "auto 4 256 all 6" "auto 4 256 all 8" "late 4 256 all 0" \
  "late 4 256 all 6" "late 4 256 all 8" "auto 2 512 all 0" "auto 2 512 all 4" "late 2 512 all 4" \
  "auto 1 1024 all 2" 2>&1 | tee -a "$S"
SWEEP_VARIANTS=torch.compile,magi_compile SWEEP_TAG=_last bash scripts/gpu/sweep_rows.sh "auto 4 256 all 0" 2>&1 | tee -a "$S"
echo "== registers of the RMSNorm and softmax variants" | tee -a "$S"
for c in "$MAGI_CACHE_DIR"/*.cubin "$MAGI_CACHE_DIR"/*/*.cubin; do
  [[ -f $c ]] && /usr/local/cuda/bin/cuobjdump -res-usage "$c" 2>/dev/null
done | grep -A1 "Function fused_to_copy_pow_mean\|Function fused_amax\|Function fused_.*softmax" |
  grep -o "Function [a-z0-9_]*\|REG:[0-9]*\|STACK:[0-9]*\|LOCAL:[0-9]*" | paste - - - - | sort -u | tee -a "$S"
