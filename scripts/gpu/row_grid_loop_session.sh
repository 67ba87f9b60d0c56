#!/usr/bin/env bash
# Issue 5 (written 2026-11-28, second session; not yet run): row kernels without the loop over
# rows (MAGI_ROW_GRID_LOOP=0), which on sm_90 need 7-27 fewer registers (docs/config.md). With
# it, torch.compile's shape (512 threads x 2 held vectors) needs 32 registers for RMSNorm and
# LayerNorm (40 and 52 with the loop) and 31 for softmax: 4 blocks of 512 per SM. The weight
# loaded late (RMSNorm 40 registers either way) for comparison.
# First the CUDA fusion tests with it (the _g kernels' results), then the four row kernels
# beside torch.compile at 16384 x 8192 in each setting, the default again last; rows of 32768
# (streamed) both ways; the Llama prefill both ways. Only the first JSONs come back (8 files).
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log" "$OUT/device.txt"
echo "== pytest GPU fusion, MAGI_ROW_GRID_LOOP=0" | tee -a "$S"
MAGI_ROW_GRID_LOOP=0 gpu_pytest gpu_fusion_g.log 140 tests/gpu/test_fusion_cuda.py | tee -a "$S"
gpu_row_bandwidth "$S" loop1
MAGI_ROW_GRID_LOOP=0 gpu_row_bandwidth "$S" loop0
MAGI_ROW_GRID_LOOP=0 MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_CHUNKS=2 gpu_row_bandwidth "$S" loop0_t512k2
MAGI_ROW_GRID_LOOP=0 MAGI_ROW_COLUMN_LOADS=late gpu_row_bandwidth "$S" loop0_late
mkdir -p /tmp/scratch && OUT=/tmp/scratch gpu_row_bandwidth "$S" loop1_again
for loop in 1 0; do
  ROW_JSON_DIR=/tmp gpu_row_run "$S" "long_loop$loop" 4096 32768 MAGI_ROW_GRID_LOOP=$loop
done
for loop in 1 0; do
  echo "== llama prefill, MAGI_ROW_GRID_LOOP=$loop" | tee -a "$S"
  MAGI_ROW_GRID_LOOP=$loop timeout 90 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants magi,inductor --out "/tmp/prefill_loop$loop.json" 2>&1 | grep -v "^\[magi" |
    grep -E "^llama|workload" | tee -a "$S"
done
