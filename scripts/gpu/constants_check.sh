#!/usr/bin/env bash
# 2026-11-28: the CUDA input-update, API and end-to-end tests after constants_to_device (its
# device copy made past AOTAutograd's FakeTensorMode), then bandwidth.py at its defaults (the
# bf16 word loads of 60a50f5 beside eager and torch.compile, and compile latency).
# At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== pytest input updates, api, end to end" | tee -a "$S"
gpu_pytest pytest.log 200 tests/gpu/test_input_updates_cuda.py tests/gpu/test_api_cuda.py \
  tests/gpu/test_cuda_end_to_end.py -rf | tee -a "$S"
echo "== bandwidth" | tee -a "$S"
timeout 230 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  grep -v "^\[magi" | tail -16 | tee -a "$S"
