#!/usr/bin/env bash
# Issue 6 (2026-11-28, evening): the GPU tests of executables per input address (after the fix
# of the 7-address test), then where the replay's launch time goes (launch_probe.py: the
# default legacy stream against a side stream, one executable against four in turn) and the
# bare-graph probe of input feeding on this host.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: executables per input address" | tee -a "$S"
gpu_pytest gpu_tests.log 120 tests/gpu/test_cuda_graphs.py -k "addresses or copy_nodes or loop" | tee -a "$S"
echo "== launch probe" | tee -a "$S"
timeout 200 python scripts/gpu/launch_probe.py --json "$OUT/launch_probe.json" 2>&1 | grep -v "^\[magi" | tail -20 | tee -a "$S"
echo "== input feed probe (bare graphs)" | tee -a "$S"
nvcc -O2 -arch=sm_90 -o /tmp/feed scripts/gpu/input_feed_probe.cu -lcuda && { timeout 60 /tmp/feed; FEED_STREAM=legacy timeout 60 /tmp/feed; } | tee -a "$S"
