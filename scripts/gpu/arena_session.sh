#!/usr/bin/env bash
# The memory arena on the GPU: build; the arena test printing its allocation and peak figures;
# the two Llama-stack runtime workloads with the arena and with MAGI_MEMORY_ARENA=0, each side
# by side with eager and torch.compile; then the whole CUDA test tier (the arena is on by
# default, so every GPU test runs through it; ARENA_TESTS and ARENA_TESTS_S choose the files
# and their time limit). Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== arena test (figures)"
timeout 120 python -m pytest tests/gpu/test_memory_arena_cuda.py -q -s -p no:cacheprovider \
  --tb=short 2>&1 | grep -E "allocations per call|passed|failed|^E " | tail -8
echo "== runtime workloads, arena on"
timeout 150 python benchmarks/run.py --device cuda --only llama_small_batch,llama_prefill \
  --out "$OUT/llama_runtime_arena.json" 2>&1 | grep -v "^\[magi" | tail -6
echo "== runtime workloads, arena off"
MAGI_MEMORY_ARENA=0 timeout 150 python benchmarks/run.py --device cuda \
  --only llama_small_batch,llama_prefill --out "$OUT/llama_runtime_no_arena.json" 2>&1 |
  grep -v "^\[magi" | tail -6
echo "== pytest: ${ARENA_TESTS:=tests/gpu}"
gpu_pytest pytest_gpu.log "${ARENA_TESTS_S:-370}" $ARENA_TESTS -rf
