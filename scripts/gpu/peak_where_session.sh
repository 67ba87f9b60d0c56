#!/usr/bin/env bash
# Issues 9 and 6, diagnosis (second call): which instruction raises the CUDA allocator's peak
# in the 4-layer training step's forward and backward (MAGI_MEMORY_TRACE=1 now reports it),
# for HEURISTIC and AUTOSEARCH at the benchmark's 0.8 budget; and what the host does while the
# GPU idles in the 1 x 4096 prefill (blocking runtime calls, host operations in the gaps).
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== memory at the peak"
MAGI_MEMORY_TRACE=1 timeout 200 python scripts/gpu/recompute_phases.py HEURISTIC AUTOSEARCH=1816 \
  > "$OUT/phases.log" 2>&1
grep -e "allocator" -e "^HEUR" -e "^AUTO" -e "^plan" -e "Error" "$OUT/phases.log" | tail -30
echo "== host profile llama_prefill"
timeout 200 python scripts/gpu/profile_workloads.py --only llama_prefill --variants inductor,magi \
  --rows 6 --host --json "$OUT/profile_host.json" 2>&1 | tee "$OUT/profile_host.log" | grep -v "^\[magi"
