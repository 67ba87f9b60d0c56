#!/usr/bin/env bash
# Nsight Compute on the slow generated kernels (issue 5): rotary (bandwidth benchmark shape),
# the training step's strided copies and K-gradient kernel; the rotary bandwidth with the default
# loads and with MAGI_VECTOR_IO=ldg. Full reports in $OUT/ncu_*.txt.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
NCU="/usr/local/cuda/bin/ncu --clock-control none"  # leave the clocks as found (METHOD.md)
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
KEYS="Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|Achieved Occupancy|Registers Per Thread|Compute \(SM\) Throughput|Warp Cycles Per Issued|Stall|Mem Busy|Max Bandwidth|Block Size|Grid Size|Theoretical Occupancy"
for io in default ldg; do
  echo "== bandwidth rotary ($io)"
  env $([[ $io == ldg ]] && echo MAGI_VECTOR_IO=ldg) timeout 100 python benchmarks/bandwidth.py \
    --device cuda --only rotary --no-compile-latency --out "$OUT/bandwidth_$io.json" 2>&1 |
    grep -v "^\[magi" | tail -2
done
echo "== ncu rotary (magi, then inductor)"
timeout 150 $NCU $SECTIONS --kernel-name regex:"fused_mul|triton" --launch-skip 2 --launch-count 2 \
  python scripts/gpu/ncu_kernels.py rotary > "$OUT/ncu_rotary.txt" 2>&1
grep -E "^  [a-z_]+.*\(|$KEYS" "$OUT/ncu_rotary.txt" | head -60
echo "== ncu training step (strided copy, K gradient)"
timeout 200 $NCU $SECTIONS --kernel-name regex:"fused_clone|gggg" --launch-count 3 \
  python scripts/gpu/ncu_kernels.py train > "$OUT/ncu_train.txt" 2>&1
grep -E "^  [a-z_]+.*\(|$KEYS" "$OUT/ncu_train.txt" | head -80
