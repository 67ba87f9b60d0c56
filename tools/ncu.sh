#!/usr/bin/env bash
# Usage: bash tools/ncu.sh WORKLOAD [KERNEL_REGEX]   (WORKLOAD: a benchmarks/bandwidth.py workload)
# On the GPU machine, after `tools/run_gpu.sh build`: Nsight Compute on the kernels magi_compile
# generates for WORKLOAD (16384 x 8192 bf16) and on torch.compile's for the same function, three
# calls each. KERNEL_REGEX picks the kernels (default: magi's fused_* and Inductor's triton_*).
# The full report goes to $OUT/ncu_WORKLOAD.txt, the key metrics to stdout. The clocks are left
# as found (--clock-control none), so the durations match what the benchmarks see.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
workload="${1:?usage: bash tools/ncu.sh WORKLOAD [KERNEL_REGEX]}"
regex="${2:-fused|triton}"
NCU="${NCU:-/usr/local/cuda/bin/ncu}"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats"
KEYS="Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|Mem Busy|Block Size|Grid Size|Theoretical Occupancy|Waves Per SM|Eligible Warps|Issued Warp"
report="$OUT/ncu_${workload//[^a-z0-9_]/_}.txt"
timeout 300 "$NCU" --clock-control none $SECTIONS --kernel-name regex:"$regex" --launch-count 8 \
  python - "$workload" >"$report" 2>&1 <<'PY'
import sys

import torch

sys.path.insert(0, "benchmarks")
import bandwidth  # noqa: E402

(w,) = [w for w in bandwidth.WORKLOADS if w.name == sys.argv[1]]
args = w.inputs(16384, 8192, torch.bfloat16, "cuda")
for variant in ("magi_compile", "torch.compile"):
    f = bandwidth.make_variant(variant, w)
    for _ in range(3):
        f(*args)
torch.cuda.synchronize()
PY
grep -E "^  [a-zA-Z_]+.*\(|$KEYS" "$report" | head -120
