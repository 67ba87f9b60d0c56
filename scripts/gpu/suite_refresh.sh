#!/usr/bin/env bash
# The full benchmark suite (benchmarks/run.py, every workload beside eager and torch.compile) at
# the current code, for the tables at the top of benchmarks/RESULTS.md. JSON and log in $OUT.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
timeout "${SUITE_LIMIT:-470}" python benchmarks/run.py --device cuda --out "$OUT/bench.json" 2>&1 |
  grep -v "^\[magi" > "$OUT/bench.log"
tail -45 "$OUT/bench.log"
