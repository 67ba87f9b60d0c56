#!/usr/bin/env bash
# Which change ends the Llama-3.2-1B-shaped decode (benchmarks/run.py llama1b_decode) in an
# illegal memory access: each run in its own process, magi_compile variants only, with
# group_query_attention off and on, then on with CUDA_LAUNCH_BLOCKING=1 to name the call; and
# the decode tests of test_runtime_choices_cuda.py. Logs in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "== decode tests"
gpu_pytest pytest_decode.log 100 tests/gpu/test_runtime_choices_cuda.py -k "decode or grouped"
run() {  # NAME VARIANTS [ENV...]
  local name="$1" variants="$2"
  shift 2
  echo "== $name"
  env "$@" timeout 100 python benchmarks/run.py --device cuda --only llama1b_decode \
    --variants "$variants" --in-process --out "$OUT/decode_$name.json" > "$OUT/decode_$name.log" 2>&1
  grep -v "^\[magi\|^DEBUG" "$OUT/decode_$name.log" | grep -E "llama1b_decode|rror" | head -8
}
run gqa_off eager,magi,magi_cg MAGI_DISABLE_PASSES=group_query_attention
run gqa_on eager,magi,magi_cg
run gqa_on_cg_blocking eager,magi_cg CUDA_LAUNCH_BLOCKING=1 MAGI_LOGGING_LEVEL=debug
grep -B30 -m1 "illegal" "$OUT/decode_gqa_on_cg_blocking.log" | grep -v "^DEBUG.*pass" | tail -30
