#!/usr/bin/env bash
# End of session (2026-11-27, late): bandwidth.py's eight memory-bound workloads beside eager and
# torch.compile, and host time per call (magi_compile CUDA graphs with and without the
# arguments-only guard, reduce-overhead), at the session's final code.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== bandwidth" | tee -a "$S"
timeout 130 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
  --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -12 | tee -a "$S"
echo "== host time per call" | tee -a "$S"
timeout 90 python benchmarks/host_overhead.py --device cuda --variants magi_cg,magi_cg_args,inductor_ro \
  --out "$OUT/host.json" 2>&1 | grep -v "^\[magi" | tail -8 | tee -a "$S"
