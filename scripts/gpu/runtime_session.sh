#!/usr/bin/env bash
# Issue 6 (runtime) in one device call: build; the CUDA test tier; the attention kernels chosen
# at the Llama shapes; host time per call (benchmarks/host_overhead.py); the Llama stack at
# 4 x 32 and 1 x 4096 tokens side by side with eager and torch.compile (benchmarks/run.py).
# Logs and JSON land in $OUT.   bash scripts/gpu/runtime_session.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest tests/gpu"
timeout 300 python -m pytest tests/gpu -q -p no:cacheprovider --tb=line 2>&1 |
  grep -v "^DEBUG\|^\[magi\|^E  \+/" > "$OUT/pytest_gpu.log"
grep -E "passed|failed|Error|error:|^/|FAILED" "$OUT/pytest_gpu.log" | tail -25
echo "== attention choices"
timeout 120 python scripts/gpu/attention_choices.py --out "$OUT/attention.json" 2>&1 |
  grep -v "^\[magi" | tail -12
echo "== host time per call"
timeout 240 python benchmarks/host_overhead.py --device cuda --out "$OUT/host_overhead.json" 2>&1 |
  grep -v "^\[magi" | tail -14
echo "== benchmarks/run.py (Llama stack)"
timeout "${RUN_BUDGET_S:-200}" python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/bench_llama.json" 2>&1 | grep -v "^\[magi" | tail -16
