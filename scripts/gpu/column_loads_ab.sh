#!/usr/bin/env bash
# A/B of when row kernels load a norm's weight (MAGI_ROW_COLUMN_LOADS late vs row): the Llama
# stack at 4 x 32 tokens with CUDA graphs (latency-bound RMSNorms of 128 rows, where loading the
# weight after the reduction adds a second trip to memory), then the bandwidth of the big row
# kernels. Each setting in its own process, torch.compile reduce-overhead beside it.
#   bash scripts/gpu/column_loads_ab.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || exit 1
for mode in late row late row; do
  echo "== MAGI_ROW_COLUMN_LOADS=$mode: run.py llama_small_batch"
  MAGI_ROW_COLUMN_LOADS=$mode timeout 120 python benchmarks/run.py --device cuda \
    --only llama_small_batch --variants magi_cg,inductor_ro --out "$OUT/small_$mode.json" 2>&1 |
    grep -E "^  llama" | tail -2
done
SWEEP_ONLY=rmsnorm,add_rmsnorm,layer_norm bash scripts/gpu/sweep_env.sh "MAGI_ROW_COLUMN_LOADS=late" \
  "MAGI_ROW_COLUMN_LOADS=row" "MAGI_ROW_COLUMN_LOADS=late" "MAGI_ROW_COLUMN_LOADS=row"
