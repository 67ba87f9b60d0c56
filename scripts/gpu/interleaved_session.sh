#!/usr/bin/env bash
# benchmarks/recompute.py with interleaved timing (every variant alive, 40 steps each in 4
# rounds over all of them): build, then the whole benchmark. JSON and log in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== benchmarks/recompute.py"
timeout 450 python benchmarks/recompute.py --device cuda --budget-s 360 --steps 40 --rounds 4 \
  --out "$OUT/cuda_h100_recompute.json" 2>&1 |
  grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tee "$OUT/recompute.log" | tail -40
