#!/usr/bin/env bash
# Issues 9 and 6, diagnosis: where the 4-layer training step's memory peak is (allocator
# history at the peak, the executor's own trace, the planner's prediction) for HEURISTIC and
# the two AUTOSEARCH budgets the benchmark missed; a kernel profile of the 1 x 4096 prefill
# under torch.compile and magi_compile. Logs land in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== memory at the peak"
MAGI_MEMORY_TRACE=1 timeout 240 python scripts/gpu/recompute_phases.py --where \
  HEURISTIC AUTOSEARCH=1816 AUTOSEARCH=1247 > "$OUT/phases.log" 2>&1
grep -v -e "^  [0-9.]* MiB from" -e "^W[0-9]" -e "FutureWarning" "$OUT/phases.log" | tail -70
echo "== profile llama_prefill"
gpu_profile llama_prefill 40 150 | tail -100
