#!/usr/bin/env bash
# Issues 5 and 6 (2026-11-27, evening): 32-bit index arithmetic in strided and shifted pointwise
# kernels (rotary: 452 -> 297 SASS instructions) and dependent launches of generated kernels
# (MAGI_DEPENDENT_LAUNCH, default on). Logs and JSON in $OUT.   (carry .deps)
#   bash scripts/gpu/dependent_launch_session.sh tests   build, the CUDA tests, the prefill with
#                                                        dependent launches on and off
#   bash scripts/gpu/dependent_launch_session.sh bench   the bandwidth table, the prefill's gaps
set -uo pipefail
source "$(dirname "$0")/env.sh"
phase="${1:-tests}"
bash scripts/gpu/run_gpu.sh build || exit 1
prefill() {  # prefill LABEL: the Llama prefill beside torch.compile, one process
  timeout 170 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants inductor,magi,magi_cg --out "$OUT/prefill_$1.json" 2>&1 | grep -v "^\[magi" | tail -3
  python scripts/gpu/prefill_ratio.py "$OUT/prefill_$1.json" "$1"
}
if [[ "$phase" == tests ]]; then
  echo "== tests/gpu"
  gpu_pytest pytest_gpu.log 280 tests/gpu/test_fusion_cuda.py tests/gpu/test_cuda_end_to_end.py \
    tests/gpu/test_recompute_cuda.py tests/gpu/test_api_cuda.py tests/gpu/test_cuda_graphs.py
  echo "== prefill, dependent launches on"
  prefill on
  echo "== prefill, dependent launches off"
  MAGI_DEPENDENT_LAUNCH=0 prefill off
  echo "== prefill, dependent launches on (again)"
  prefill on2
else
  echo "== benchmarks/bandwidth.py"
  timeout 240 python benchmarks/bandwidth.py --device cuda --variants eager,torch.compile,magi_compile \
    --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -14
  echo "== prefill gaps"
  timeout 200 python scripts/gpu/prefill_gaps.py --variants inductor,magi,magi_cg \
    --json "$OUT/prefill_gaps.json" 2>&1 | grep -v "^\[magi" | tail -40
fi
