#!/usr/bin/env bash
# Where torch.compile's reduce-overhead beats our CUDA graphs (GPT-2 and Llama-1B prefill, full
# suite of 2026-11-27): kernel tables of one step under both, and without graphs, in one device
# call. Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 4
echo "== profiles" | tee -a "$S"
timeout 420 python scripts/gpu/profile_workloads.py --only gpt2_prefill,llama1b_prefill \
  --variants inductor_ro,magi_cg,inductor,magi --rows 40 --json "$OUT/profile_cg.json" 2>&1 |
  grep -v "^\[magi" | tee "$OUT/profile_cg.log" | tail -400
