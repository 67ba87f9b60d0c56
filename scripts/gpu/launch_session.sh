#!/usr/bin/env bash
# Direct graph launches (issue 6) in one device call: build; which operator (if any) marks the
# Llama block as drawing random numbers on CUDA; the CUDA-graph tests; host_overhead.py; the
# Llama small batch. Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== random-number check of the Llama block on CUDA"
MAGI_LOGGING_LEVEL=debug timeout 60 python -m pytest tests/gpu/test_cuda_graphs.py -q -s \
  -k launch_directly -p no:cacheprovider 2>&1 | grep -E "may draw|passed|failed|assert" | head
echo "== pytest CUDA-graph tests"
timeout 200 python -m pytest tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py -q \
  -p no:cacheprovider --tb=short 2>&1 | grep -v "^DEBUG\|^\[magi" > "$OUT/pytest_graphs.log"
grep -E "passed|failed|^E " "$OUT/pytest_graphs.log" | tail -8
echo "== benchmarks/host_overhead.py"
timeout 200 python benchmarks/host_overhead.py --device cuda --out "$OUT/host_overhead.json" 2>&1 |
  grep -v "^\[magi" | tail -15
echo "== benchmarks/run.py llama_small_batch"
timeout 150 python benchmarks/run.py --device cuda --only llama_small_batch \
  --out "$OUT/bench_small.json" 2>&1 | grep -v "^\[magi" | tail -4
