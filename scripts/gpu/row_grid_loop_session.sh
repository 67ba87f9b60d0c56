#!/usr/bin/env bash
# Issue 5 (written 2026-11-28, second session; not yet run): row kernels without the loop over
# rows (MAGI_ROW_GRID_LOOP=0), which on sm_90 need 10-27 fewer registers (docs/config.md).
# First the CUDA fusion tests with it (correctness of the _g kernels), then the four row kernels
# beside torch.compile at 16384 x 8192 (held rows) and 4096 x 32768 (streamed rows), the loop on
# and off in alternating processes, then the Llama prefill both ways.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log" "$OUT/device.txt"  # 8 files come back
echo "== pytest GPU fusion, MAGI_ROW_GRID_LOOP=0" | tee -a "$S"
MAGI_ROW_GRID_LOOP=0 gpu_pytest gpu_fusion_g.log 150 tests/gpu/test_fusion_cuda.py | tee -a "$S"
for loop in 1 0 1 0; do
  MAGI_ROW_GRID_LOOP=$loop gpu_row_bandwidth "$S" "loop$loop"
done
for loop in 1 0; do
  echo "== 4096 x 32768, MAGI_ROW_GRID_LOOP=$loop" | tee -a "$S"
  MAGI_ROW_GRID_LOOP=$loop timeout 100 python benchmarks/bandwidth.py --device cuda \
    --no-compile-latency --variants torch.compile,magi_compile --rows 4096 --cols 32768 \
    --only rmsnorm,add_rmsnorm,layer_norm,softmax --out "$OUT/band_long_loop$loop.json" 2>&1 |
    grep -v "^\[magi" | grep -E "%|copy" | tail -6 | tee -a "$S"
done
for loop in 1 0; do
  echo "== llama prefill, MAGI_ROW_GRID_LOOP=$loop" | tee -a "$S"
  MAGI_ROW_GRID_LOOP=$loop timeout 100 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants eager,magi,inductor --out "$OUT/prefill_loop$loop.json" 2>&1 | grep -v "^\[magi" |
    grep -E "^llama|workload" | tee -a "$S"
done
