#!/usr/bin/env bash
# The decode alone passed in its own process (decode_triage.sh); it faulted after the
# Llama-1B-shaped prefill in one worker. Run prefill then decode in one process, magi_compile
# variants, group_query_attention on; then off; then on with CUDA_LAUNCH_BLOCKING=1 and debug
# logs, to name the faulting call. Logs in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
run() {  # NAME VARIANTS [ENV...]
  local name="$1" variants="$2"
  shift 2
  echo "== $name"
  env "$@" timeout 110 python benchmarks/run.py --device cuda --only llama1b_prefill,llama1b_decode \
    --variants "$variants" --in-process --out "$OUT/pd_$name.json" > "$OUT/pd_$name.log" 2>&1
  grep -v "^\[magi\|^DEBUG" "$OUT/pd_$name.log" | grep -E "llama1b_|rror" | head -10
}
run gqa_on eager,magi,magi_cg
run gqa_off eager,magi,magi_cg MAGI_DISABLE_PASSES=group_query_attention
if grep -q "illegal" "$OUT/pd_gqa_on.log" "$OUT/pd_gqa_off.log"; then
  run blocking magi,magi_cg CUDA_LAUNCH_BLOCKING=1 MAGI_LOGGING_LEVEL=debug
  grep -n -m3 "illegal" "$OUT/pd_blocking.log"
  grep -B40 -m1 "illegal" "$OUT/pd_blocking.log" | cut -c1-300 | tail -40
fi
