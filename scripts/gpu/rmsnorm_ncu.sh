#!/usr/bin/env bash
# Issue 5 (2026-11-27, night): why torch.compile's RMSNorm (16384 x 8192 bf16) beats ours on
# the H200 by about 2 points of copy bandwidth. Inductor's Triton source and launch config
# (TORCH_LOGS=output_code), Nsight Compute on both kernels, the bandwidth of both.
# One summary file plus the logs in $OUT.   (carry .deps)
# The run recorded in benchmarks/RESULTS.md left ncu's clock control at its default (base
# clocks during each profiled kernel); --clock-control none, added after, leaves them alone.
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
NCU="/usr/local/cuda/bin/ncu --clock-control none"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats"
KEYS="Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|Mem Busy|Block Size|Grid Size|Theoretical Occupancy|Waves Per SM|Eligible Warps|Issued Warp|Active Warps|Shared Memory Configuration Size|Dynamic Shared|Static Shared"
echo "== Inductor's kernel" | tee -a "$S"
TORCH_LOGS=output_code timeout 120 python -c "
import sys; sys.path.insert(0, 'benchmarks')
import torch, bandwidth
x = torch.randn(16384, 8192, dtype=torch.bfloat16, device='cuda')
w = torch.randn(8192, dtype=torch.bfloat16, device='cuda')
torch.compile(bandwidth.rmsnorm)(x, w)
" > "$OUT/inductor_code.log" 2>&1
grep -n "triton_heuristics\|def triton\|tl.load\|tl.store\|for r0\|XBLOCK\|R0_BLOCK\|num_warps\|num_stages\|reduction\|persistent\|tl.sum\|grid" "$OUT/inductor_code.log" | grep -v "^.*import" | head -60 | tee -a "$S"
echo "== ncu (magi, then inductor)" | tee -a "$S"
timeout 200 $NCU $SECTIONS --kernel-name regex:"fused_to_copy|triton" --launch-skip 2 --launch-count 1 \
  python scripts/gpu/ncu_kernels.py rmsnorm > "$OUT/ncu_rmsnorm_magi.txt" 2>&1
timeout 200 $NCU $SECTIONS --kernel-name regex:"triton" --launch-skip 2 --launch-count 1 \
  python scripts/gpu/ncu_kernels.py rmsnorm > "$OUT/ncu_rmsnorm_inductor.txt" 2>&1
for f in magi inductor; do
  echo "-- $f" | tee -a "$S"
  grep -E "^  [a-zA-Z_]+.*\(|$KEYS" "$OUT/ncu_rmsnorm_$f.txt" | head -40 | tee -a "$S"
done
echo "== bandwidth" | tee -a "$S"
timeout 150 python benchmarks/bandwidth.py --device cuda --only rmsnorm,add_rmsnorm \
  --variants eager,torch.compile,magi_compile --no-compile-latency --out "$OUT/bandwidth.json" 2>&1 |
  grep -v "^\[magi" | tail -5 | tee -a "$S"
