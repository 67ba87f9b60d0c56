#!/usr/bin/env bash
# Session of 2026-11-28 (afternoon), fourth call: issue 6's measurements at this tree (the
# single runner lock of bbe968c, packed bf16 pairs on by default): the Llama stack at 4 x 32 and
# 1 x 4096 tokens beside eager, torch.compile and reduce-overhead, and the host time per
# CUDA-graph call in both guard modes.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== run.py llama" | tee -a "$S"
timeout 200 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/bench_llama.json" 2>&1 | grep -v "^\[magi" | tail -8 | tee -a "$S"
echo "== host time per call" | tee -a "$S"
timeout 220 python benchmarks/host_overhead.py --device cuda \
  --variants magi_cg,magi_cg_args,inductor_ro --out "$OUT/host_overhead.json" 2>&1 |
  grep -v "^\[magi" | tail -10 | tee -a "$S"
