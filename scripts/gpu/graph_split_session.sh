#!/usr/bin/env bash
# 2026-11-27: cuda_graph.cpp split into the call path, capture and replay (no change of
# behaviour meant). Build; the CUDA-graph tests; host time per call beside reduce-overhead (the
# split must not cost host time); then two row-kernel layouts for the H200's LayerNorm set by
# environment alone (128 threads x 8 vectors; weights loaded with the row).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== pytest (CUDA graphs, padding, arena, end to end)" | tee -a "$S"
gpu_pytest pytest_graphs.log 260 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_memory_arena_cuda.py tests/gpu/test_cuda_end_to_end.py -rf | tee -a "$S"
echo "== host time per call" | tee -a "$S"
timeout 100 python benchmarks/host_overhead.py --device cuda --variants magi_cg,magi_cg_args,inductor_ro \
  --out "$OUT/host.json" 2>&1 | grep -v "^\[magi" | tail -6 | tee -a "$S"
band() { gpu_row_bandwidth "$S" "$1"; }  # band LABEL
MAGI_MAX_BLOCK_THREADS=128 MAGI_ROW_CHUNKS=8 band threads128_chunks8
MAGI_ROW_COLUMN_LOADS=row band column_loads_row
