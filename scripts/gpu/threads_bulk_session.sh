#!/usr/bin/env bash
# 2026-11-29 (issue 6, issue 5): the CUDA-graph runner's lock and per-set stream waits
# (tests/gpu/test_cuda_graphs.py, two new tests among them), then whether RMSNorm's rows
# staged in shared memory by one bulk copy move more bytes per second than rows held in
# registers (row_bulk_probe.cu), beside bandwidth.py's row kernels and torch.compile's.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
echo "== row bulk probe" | tee -a "$S"
nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/row_bulk_probe scripts/gpu/row_bulk_probe.cu &&
  timeout 60 /tmp/row_bulk_probe | tee -a "$S"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: CUDA graphs" | tee -a "$S"
gpu_pytest gpu_tests.log 240 tests/gpu/test_cuda_graphs.py | tee -a "$S"
gpu_row_bandwidth "$S" default
echo "== row bulk probe (again)" | tee -a "$S"
timeout 60 /tmp/row_bulk_probe | tee -a "$S"
