#!/usr/bin/env bash
# Issue 6, prefill: where the Llama-stack prefill's wall time goes beyond its kernels
# (scripts/gpu/prefill_gaps.py: steady state, host time per step, synchronising calls, gaps
# between kernels by kernel pair) for torch.compile, magi_compile and magi_compile with CUDA
# graphs.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
timeout 300 python scripts/gpu/prefill_gaps.py --json "$OUT/prefill_gaps.json" 2>&1 |
  tee "$OUT/prefill_gaps.log" | grep -v "^\[magi\|^DEBUG"
