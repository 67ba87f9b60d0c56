#!/usr/bin/env bash
# Row-kernel schedule sweep on the GPU machine (after `run_gpu.sh build`): the bandwidth of the
# generated norm and softmax kernels under each tuning setting (MAGI_ROW_COLUMN_LOADS,
# MAGI_ROW_CHUNKS, MAGI_MAX_BLOCK_THREADS, MAGI_KERNEL_GRID, MAGI_ROW_MIN_BLOCKS; see
# docs/config.md), one process per setting; SWEEP_ARGS adds arguments to benchmarks/bandwidth.py
# (e.g. another shape), SWEEP_VARIANTS replaces its variants (default magi_compile).
#   bash scripts/gpu/sweep_rows.sh ["loads chunks threads [grid [min_blocks]]" ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
configs=("$@")
((${#configs[@]})) || configs=("row 4 256" "block 4 256" "late 4 256" "row 2 512" "late 2 512"
  "row 1 1024" "row 8 256" "late 8 256")
for c in "${configs[@]}"; do
  read -r loads chunks threads grid min_blocks <<<"$c"
  grid="${grid:-wave}"
  min_blocks="${min_blocks:-0}"
  tag="${loads}_k${chunks}_t${threads}_${grid}_m${min_blocks}${SWEEP_TAG:-}"
  echo "== $tag"
  MAGI_ROW_COLUMN_LOADS=$loads MAGI_ROW_CHUNKS=$chunks MAGI_MAX_BLOCK_THREADS=$threads MAGI_KERNEL_GRID=$grid \
    MAGI_ROW_MIN_BLOCKS=$min_blocks timeout 150 python benchmarks/bandwidth.py --device cuda \
    --no-compile-latency --variants "${SWEEP_VARIANTS:-magi_compile}" --only rmsnorm,add_rmsnorm,layer_norm,softmax ${SWEEP_ARGS:-} \
    --out "$OUT/sweep_$tag.json" 2>&1 | tail -8
done
