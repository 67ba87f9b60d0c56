#!/usr/bin/env bash
# Issue 6 (2026-11-28): host time per call of the two guard modes in alternating order
# (arguments, default, arguments, default) in one process: the earlier runs measured the
# default mode first, and the runner's own stages (identical code in both modes) were slower
# in whichever ran first.   At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
timeout 150 python benchmarks/host_overhead.py --device cuda \
  --variants magi_cg_args,magi_cg,magi_cg_args,magi_cg --out "$OUT/host_overhead_abab.json" 2>&1 |
  grep -v "^\[magi" | tail -9 | tee -a "$S"
