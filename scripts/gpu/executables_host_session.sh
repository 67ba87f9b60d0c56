#!/usr/bin/env bash
# Issue 6 (2026-11-28, evening), after executables_tests_session.sh: host time per call of the
# 4-layer stack at batch 4 x 32 with 4 input tensors in turn, now that each of them keeps an
# executable whose copy node reads it: host_overhead.py (variants alternating) beside
# reduce-overhead, then host_floor.py (its ways interleaved, among them the runner kept to two
# executables per graph).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
HOST_VARIANTS=magi_cg,magi_cg_args,magi_cg,magi_cg_args,inductor_ro \
  HOST_FLOOR_MODES=default,arguments,default gpu_host_time "$S"
