#!/usr/bin/env bash
# Rotary embedding's generated kernel (issue 5): build; the CUDA fusion tests; the bandwidth
# benchmark of rotary beside two other workloads; the kernel's source and a side-by-side time
# (scripts/gpu/rotary_source.py). Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest tests/gpu/test_fusion_cuda.py"
timeout 150 python -m pytest tests/gpu/test_fusion_cuda.py -q -p no:cacheprovider --tb=short 2>&1 |
  grep -v "^DEBUG\|^\[magi" > "$OUT/pytest_fusion.log"
grep -E "passed|failed|^E " "$OUT/pytest_fusion.log" | tail -6
echo "== rotary source and time"
timeout 120 python scripts/gpu/rotary_source.py 2>&1 | grep -v "^\[magi" | tail -4
echo "== benchmarks/bandwidth.py"
timeout 200 python benchmarks/bandwidth.py --device cuda --only rotary,rmsnorm,silu_mul \
  --no-compile-latency --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -12
