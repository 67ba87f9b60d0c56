#!/usr/bin/env bash
# The session's last device call: build; the bucket, CUDA-graph and fusion GPU tests; the
# generated kernels' bandwidth and compile latency at the final defaults. Logs and JSON in $OUT.
#   bash scripts/gpu/final_session.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || exit 1
echo "== pytest buckets, CUDA graphs, fusion"
timeout 240 python -m pytest tests/gpu/test_cuda_graph_padding.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_fusion_cuda.py -q -p no:cacheprovider --tb=short 2>&1 |
  grep -v "^DEBUG\|^\[magi" > "$OUT/pytest_final.log"
grep -E "passed|failed|FAILED|Error" "$OUT/pytest_final.log" | tail -12
echo "== bandwidth"
timeout 230 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  grep -v "^\[magi" | tail -14
