#!/usr/bin/env bash
# The Llama-1B-shaped workloads with all five variants (torch.compile's among them), the
# worker as benchmarks/run.py starts it; when it faults, torch.compile's variants alone in a
# process of their own, then magi_compile's. Logs and JSON in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
run() {  # NAME VARIANTS WORKLOADS
  echo "== $1"
  timeout 170 python benchmarks/run.py --device cuda --only "$3" --variants "$2" \
    --out "$OUT/l1b_$1.json" > "$OUT/l1b_$1.log" 2>&1
  grep -v "^\[magi\|^DEBUG" "$OUT/l1b_$1.log" | grep -E "llama1b_|rror|illegal" | head -14
}
run all eager,magi,magi_cg,inductor,inductor_ro llama1b_prefill,llama1b_decode
if grep -q "illegal" "$OUT/l1b_all.log"; then
  run inductor eager,inductor,inductor_ro llama1b_decode
  run magi eager,magi,magi_cg llama1b_decode
fi
