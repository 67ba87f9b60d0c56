#!/usr/bin/env bash
# Issue 6 (2026-11-28), after the review of the guard watch: on the GPU machine's CPython 3.12
# (dict watchers compiled in), the CPU tests of direct calls; host time per call in both guard
# modes beside reduce-overhead, and the stage breakdown; the CUDA tests of input updates, the
# API, end to end and CUDA graphs.   At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest direct calls (CPU, Python 3.12)" | tee -a "$S"
gpu_pytest cpu_tests.log 150 tests/python/test_fast_dispatch_native.py \
  tests/python/test_fast_dispatch.py | tee -a "$S"
gpu_host_time "$S"
echo "== pytest input updates, api, end to end, graphs" | tee -a "$S"
gpu_pytest tests.log 220 tests/gpu/test_input_updates_cuda.py tests/gpu/test_api_cuda.py \
  tests/gpu/test_cuda_end_to_end.py tests/gpu/test_cuda_graphs.py | tee -a "$S"
