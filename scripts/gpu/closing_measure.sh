#!/usr/bin/env bash
# Closing measurements of a session: generated-kernel bandwidth and compile latency
# (benchmarks/bandwidth.py at its defaults), host time per call (CUDA graphs now pick a bucket
# per call), and the offload and recompute GPU tests in suite order (the recompute peak test
# used to miss its bound only after other tests). JSON and logs in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || exit 1
echo "== pytest offload + recompute"
timeout 150 python -m pytest tests/gpu/test_offload_cuda.py tests/gpu/test_recompute_cuda.py -q \
  -p no:cacheprovider --tb=short 2>&1 | grep -v "^DEBUG\|^\[magi" > "$OUT/pytest_tail.log"
tail -6 "$OUT/pytest_tail.log"
echo "== host time per call"
timeout 120 python benchmarks/host_overhead.py --device cuda --variants magi_cg,inductor_ro \
  --out "$OUT/host_overhead.json" 2>&1 | grep -v "^\[magi" | tail -6
echo "== bandwidth"
timeout 230 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  grep -v "^\[magi" | tail -16
