#!/usr/bin/env bash
# Issue 6 (2026-11-28), on an H100 (where the earlier host-time figures were taken): host time
# per call with the default guard mode reusing Dynamo's verdict (_guard_watch.py) beside
# fast_dispatch_guards=arguments and reduce-overhead, the stage breakdown, and the CUDA tests of
# fusion (the bf16 word reads of the last session's review, never run on a GPU) and graphs.
# At most 8 files in $OUT (what comes back).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
gpu_host_time "$S"
echo "== pytest fusion, graphs" | tee -a "$S"
gpu_pytest tests.log 280 tests/gpu/test_fusion_cuda.py tests/gpu/test_cuda_graphs.py | tee -a "$S"
