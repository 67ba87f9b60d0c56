#!/usr/bin/env bash
# Does the Llama-1B-shaped decode's fault (magi_cg beside torch.compile's variants in one
# worker) reproduce at the quick shapes? With the cuBLAS-workspace fix reverted
# (.deps/cublas_fix.patch, carried): quick, then full; with the fix: quick. Logs in $OUT.
set -uo pipefail
source "$(dirname "$0")/env.sh"
run() {  # tag, extra args
  local tag=$1
  shift
  timeout 200 python benchmarks/run.py --device cuda --only llama1b_decode \
    --variants eager,magi_cg,inductor,inductor_ro "$@" --out "$OUT/decode_$tag.json" > "$OUT/decode_$tag.log" 2>&1
  echo "$tag: exit $?"
  grep -v "^\[magi\|^DEBUG" "$OUT/decode_$tag.log" | grep -E "^  llama1b_" | cut -c1-160 | head -5
}
patch -R -p1 < .deps/cublas_fix.patch > /dev/null && bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "== without the fix"
run reverted_quick --quick
run reverted_full
patch -p1 < .deps/cublas_fix.patch > /dev/null && bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo rebuild failed; exit 1; }
echo "== with the fix"
run fixed_quick --quick
