#!/usr/bin/env bash
# CUDA-graph size buckets (issue 6) in one device call: build; the bucket tests, then the whole
# CUDA test tier; the Llama stack at 4 x 32 and 3 x 32 tokens (3 runs padded in the graph of 4)
# side by side with eager and torch.compile (benchmarks/run.py). Logs and JSON land in $OUT.
#   bash scripts/gpu/padding_session.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest bucket tests"
timeout 150 python -m pytest tests/gpu/test_cuda_graph_padding.py tests/gpu/test_cuda_graphs.py -q \
  -p no:cacheprovider --tb=short 2>&1 | grep -v "^DEBUG\|^\[magi" > "$OUT/pytest_padding.log"
tail -40 "$OUT/pytest_padding.log"
echo "== benchmarks/run.py (Llama stack, small batches)"
timeout "${RUN_BUDGET_S:-150}" python benchmarks/run.py --device cuda \
  --only llama_small_batch,llama_padded_batch --out "$OUT/bench_padding.json" 2>&1 |
  grep -v "^\[magi" | tail -16
if [ "${FULL_TIER:-1}" = 1 ]; then
  echo "== pytest tests/gpu"
  timeout 330 python -m pytest tests/gpu -q -p no:cacheprovider --tb=line 2>&1 |
    grep -v "^DEBUG\|^\[magi\|^E  \+/" > "$OUT/pytest_gpu.log"
  grep -E "passed|failed|Error|error:|FAILED" "$OUT/pytest_gpu.log" | tail -25
fi
