#!/usr/bin/env bash
# Measurements after the session's runtime and kernel changes: generated-kernel bandwidth and
# compile latency (benchmarks/bandwidth.py at its defaults), host time per call, and the Llama
# stack at 4 x 32 and 1 x 4096 tokens. JSON in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || exit 1
echo "== bandwidth"
timeout 220 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -16
echo "== host time per call"
timeout 150 python benchmarks/host_overhead.py --device cuda --variants magi,magi_cg,magi_cg_no_direct,inductor_ro \
  --out "$OUT/host_overhead.json" 2>&1 | grep -v "^\[magi" | tail -8
echo "== run.py llama"
timeout 150 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/bench_llama.json" 2>&1 | grep -v "^\[magi" | tail -5
