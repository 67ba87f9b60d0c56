#!/usr/bin/env bash
# Issue 6 (2026-11-28, evening), after the review of executables per input address: a graph
# gets another executable only when a missing call's inputs repeat one of the last four
# misses' (not after 16 re-pointings), never again after CUDA refused one, and a re-captured
# graph starts afresh. The GPU tests of graphs, padding and input updates; host_floor.py in
# the default guard mode (its executables and re-pointings per replay).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: graphs, padding, input updates" | tee -a "$S"
gpu_pytest gpu_tests.log 240 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_input_updates_cuda.py | tee -a "$S"
echo "== host floor (default guards)" | tee -a "$S"
timeout 150 python scripts/gpu/host_floor.py --modes default --json "$OUT/host_floor.json" > /dev/null 2>&1
python -c "
import json; d = json.load(open('$OUT/host_floor.json'))['default']
print({k: round(v, 2) if isinstance(v, float) else v for k, v in d.items() if not k.startswith('stage_')})
" | tee -a "$S"
