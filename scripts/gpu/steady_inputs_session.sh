#!/usr/bin/env bash
# Issue 6 (2026-11-28, afternoon): direct calls tell the CUDA graph runner when the parameters
# are the tensors its last call checked (SteadyInputs), and the runner skips comparing them.
# The GPU tests of graphs, direct calls and the API; the CPU direct-call tests on this
# machine's Python 3.12; host time per call (host_overhead.py in alternating order, then
# host_floor.py, which times the runner with and without the steady inputs interleaved).
# At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: graphs, padding, direct calls, input updates, API, end to end" | tee -a "$S"
gpu_pytest gpu_tests.log 300 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_runtime_choices_cuda.py tests/gpu/test_input_updates_cuda.py \
  tests/gpu/test_api_cuda.py tests/gpu/test_cuda_end_to_end.py | tee -a "$S"
echo "== pytest CPU direct calls (python $(python -c 'import sys; print(sys.version.split()[0])'))" | tee -a "$S"
CUDA_VISIBLE_DEVICES= gpu_pytest cpu_direct.log 120 tests/python/test_fast_dispatch_native.py \
  tests/python/test_fast_dispatch.py | tee -a "$S"
HOST_VARIANTS=magi_cg_args,magi_cg,magi_cg_args,magi_cg,inductor_ro \
  HOST_FLOOR_MODES=arguments,default,arguments,default gpu_host_time "$S"
