#!/usr/bin/env bash
# Issues 5 and 6 (2026-11-27, evening): plain stores (MAGI_VECTOR_IO=ldcs, the new default)
# against streaming stores (cs, the old default): the Llama prefill beside torch.compile, twice
# each, alternating, and the bandwidth table under each. One summary file in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > "$OUT/build_summary.txt" 2>&1 || { cat "$OUT/build_summary.txt"; exit 1; }
S="$OUT/summary.txt"
mkdir -p /tmp/runs
prefill() {  # prefill LABEL: the Llama prefill beside torch.compile, one process
  timeout 150 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants inductor,magi,magi_cg --out "/tmp/runs/prefill_$1.json" > /tmp/runs/prefill_$1.log 2>&1
  python scripts/gpu/prefill_ratio.py "/tmp/runs/prefill_$1.json" "$1" | tee -a "$S"
}
for round in 1 2; do
  MAGI_VECTOR_IO=ldcs prefill "ldcs_$round"
  MAGI_VECTOR_IO=cs prefill "cs_$round"
done
for io in ldcs cs; do
  echo "== bandwidth, MAGI_VECTOR_IO=$io" | tee -a "$S"
  MAGI_VECTOR_IO=$io timeout 200 python benchmarks/bandwidth.py --device cuda \
    --variants eager,torch.compile,magi_compile --out "$OUT/bandwidth_$io.json" 2>&1 |
    grep -v "^\[magi" | tail -13 | tee -a "$S"
done
cp /tmp/runs/prefill_ldcs_1.json /tmp/runs/prefill_cs_1.json "$OUT/"
