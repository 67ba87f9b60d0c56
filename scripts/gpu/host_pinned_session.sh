#!/usr/bin/env bash
# Issue 6 (2026-11-28, afternoon): host time per call of the 4-layer stack (both guard modes
# in alternating order, reduce-overhead last) in three processes: one as before, two with the
# process pinned to four cores (taskset -c 2-5), to see how much of the spread between
# variants of one process comes from the host's scheduling.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee -a "$S"
host() {  # LABEL VARIANTS PREFIX...
  local label=$1 variants=$2
  shift 2
  echo "== $label" | tee -a "$S"
  "$@" timeout 170 python benchmarks/host_overhead.py --device cuda --variants "$variants" \
    --out "$OUT/host_$label.json" 2>&1 | grep -v "^\[magi" | tail -9 | tee -a "$S"
}
host unpinned magi_cg,magi_cg_args,magi_cg,magi_cg_args,inductor_ro env
host pinned_1 magi_cg,magi_cg_args,magi_cg,magi_cg_args,inductor_ro taskset -c 2-5
host pinned_2 magi_cg_args,magi_cg,magi_cg_args,magi_cg taskset -c 2-5
