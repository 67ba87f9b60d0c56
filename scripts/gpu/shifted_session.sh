#!/usr/bin/env bash
# Shifted vector loads read only inside the row (rotate_half reads one of its two shifted
# vectors per lane): build; the rotary kernel's time beside torch.compile's
# (scripts/gpu/rotary_source.py) and the bandwidth benchmark's rotary; the Llama stack's prefill
# side by side with eager and torch.compile; then the whole CUDA test tier. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== rotary source and time"
timeout 90 python scripts/gpu/rotary_source.py 2>&1 | grep -v "^\[magi" | tail -4
echo "== benchmarks/bandwidth.py"
timeout 100 python benchmarks/bandwidth.py --device cuda --only rotary,rmsnorm \
  --no-compile-latency --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -8
echo "== benchmarks/run.py"
timeout 100 python benchmarks/run.py --device cuda --only llama_prefill \
  --out "$OUT/bench_prefill.json" 2>&1 | grep -v "^\[magi\|^DEBUG" | tee "$OUT/bench.log" | tail -9
echo "== pytest tests/gpu"
gpu_pytest pytest_gpu.log 300 tests/gpu
