#!/usr/bin/env bash
# Is the Llama-1B-shaped decode's fault (all five variants in one worker) older than
# group_query_attention? The same run as decode_triage3.sh's first with the pass disabled, which
# leaves the runtime as it was at 893a95c (AttentionCall's grouped-heads check only acts on
# calls the pass rewrote). Logs and JSON in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
MAGI_DISABLE_PASSES=group_query_attention timeout 200 python benchmarks/run.py --device cuda \
  --only llama1b_decode --variants eager,magi,magi_cg,inductor,inductor_ro \
  --out "$OUT/l1b_decode_gqa_off.json" > "$OUT/l1b_decode_gqa_off.log" 2>&1
grep -v "^\[magi\|^DEBUG" "$OUT/l1b_decode_gqa_off.log" | grep -E "llama1b_|rror|illegal" | cut -c1-300 | head -14
