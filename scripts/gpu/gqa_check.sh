#!/usr/bin/env bash
# After the first group_query_attention run (scripts/gpu/gqa_session.sh) ended the
# Llama-3.2-1B-shaped decode in an illegal memory access: cuDNN attention with grouped heads
# and a mask, probed alone in its own process; the whole CUDA tier (the new decode tests first,
# in a process of their own); the two Llama-1B-shaped workloads. Logs and JSON in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "== cuDNN grouped heads + mask, alone"
timeout 60 python scripts/gpu/cudnn_gqa_mask_probe.py 2>&1 | tee "$OUT/cudnn_gqa_mask_probe.log" | tail -5
echo "== decode tests"
gpu_pytest pytest_decode.log 120 tests/gpu/test_runtime_choices_cuda.py -k "decode or grouped"
echo "== benchmarks/run.py"
timeout 150 python benchmarks/run.py --device cuda --only llama1b_prefill,llama1b_decode \
  --out "$OUT/bench_llama1b.json" 2>&1 | grep -v "^\[magi\|^DEBUG" | tee "$OUT/bench_llama1b.log" | tail -14
echo "== pytest tests/gpu"
gpu_pytest pytest_tier.log 340 tests/gpu
