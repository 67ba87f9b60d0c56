#!/usr/bin/env bash
# The CUDA tests the session's changes touch (input updates, fusion, CUDA graphs) and the GPT-2
# prefill's kernels under our CUDA graphs (are the layers' mask selects one kernel again?), in
# one device call. Logs in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 4
echo "== tests" | tee -a "$S"
gpu_pytest pytest_b.log 230 tests/gpu/test_input_updates_cuda.py tests/gpu/test_fusion_cuda.py \
  tests/gpu/test_cuda_graphs.py | tee -a "$S"
echo "== profile" | tee -a "$S"
timeout 70 python scripts/gpu/profile_workloads.py --only gpt2_prefill --variants magi_cg \
  --rows 30 --json "$OUT/profile_gpt2.json" 2>&1 | grep -v "^\[magi" | grep -v "^   gap" |
  tee -a "$S" | tail -32
