#!/usr/bin/env bash
# Rotary embedding kernels (issue 5's rotary row, and issue 6's prefill, where the q and k
# rotaries run at about two thirds of copy bandwidth): build; tests/gpu/test_cuda_graphs.py;
# bandwidth.py's rotary at the benchmark shape (64 heads) and at the prefill's (4096 tokens x
# 16 heads; a shape too small for bandwidth.py's timing, whose figures are host-bound there:
# use the kernel profile, scripts/gpu/unroll_prefill_ab.sh), magi_compile with
# 1, 2 and 4 vectors per thread (MAGI_POINTWISE_UNROLL) beside torch.compile; Nsight Compute's
# summary of the default kernel when ncu is there.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest (CUDA graphs, with the parameter .data test)"
gpu_pytest pytest_graphs.log 200 tests/gpu/test_cuda_graphs.py -rf
export SWEEP_ONLY=rotary
bash scripts/gpu/sweep_env.sh "" "MAGI_POINTWISE_UNROLL=2" "MAGI_POINTWISE_UNROLL=4"
mkdir -p "$OUT/prefill_shape"
OUT="$OUT/prefill_shape" SWEEP_ARGS="--rows 4096 --cols 2048" bash scripts/gpu/sweep_env.sh "" \
  "MAGI_POINTWISE_UNROLL=2" "MAGI_POINTWISE_UNROLL=4"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [[ -n "$NCU" ]]; then
  echo "== ncu ($NCU)"
  cat > /tmp/rotary_once.py <<'PY'
import sys, torch
sys.path.insert(0, "benchmarks")
from bandwidth import rotary
from magi_compiler import magi_compile
x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
c = torch.randn(4096, 128, device="cuda", dtype=torch.bfloat16)
s = torch.randn(4096, 128, device="cuda", dtype=torch.bfloat16)
f = magi_compile(rotary, dynamic_arg_dims={})
with torch.no_grad():
    for _ in range(3):
        f(x, c, s)
    torch.cuda.synchronize()
PY
  timeout 200 "$NCU" --clock-control none --kernel-name regex:fused --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis python /tmp/rotary_once.py > "$OUT/ncu_rotary.log" 2>&1
  grep -v "^\[magi\|^DEBUG" "$OUT/ncu_rotary.log" | tail -90
else
  echo "== no ncu on this machine"
fi
