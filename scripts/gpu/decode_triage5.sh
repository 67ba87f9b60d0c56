#!/usr/bin/env bash
# The Llama-1B-shaped decode's illegal memory access (all five variants in one worker): which
# magi variant must be present? Two workers: without magi_cg, then without magi. Logs and JSON
# in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
for variants in eager,magi,inductor,inductor_ro eager,magi_cg,inductor,inductor_ro; do
  tag=${variants//,/_}
  echo "== $variants"
  timeout 220 python benchmarks/run.py --device cuda --only llama1b_decode --variants "$variants" \
    --out "$OUT/l1b_decode_$tag.json" > "$OUT/l1b_decode_$tag.log" 2>&1
  echo "exit $?"
  grep -v "^\[magi\|^DEBUG" "$OUT/l1b_decode_$tag.log" | grep -E "llama1b_|rror|illegal" | cut -c1-300 | head -12
done
