#!/usr/bin/env bash
# The training step after the strided-kernel and lone-reduction changes (issue 9): build; the
# recompute CUDA tests; benchmarks/recompute.py (both stacks, all variants). Logs and JSON land
# in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest tests/gpu/test_recompute_cuda.py"
gpu_pytest pytest_recompute.log 120 tests/gpu/test_recompute_cuda.py
echo "== benchmarks/recompute.py"
timeout 380 python benchmarks/recompute.py --device cuda --budget-s 340 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 | tee "$OUT/recompute.log" |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -45
