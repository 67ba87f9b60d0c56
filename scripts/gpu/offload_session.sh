#!/usr/bin/env bash
# Issue 10 (weight offload) in one device call: build; the offload GPU tests; the DiT offload
# benchmark (benchmarks/offload.py). Logs and JSON land in $OUT.
#   bash scripts/gpu/offload_session.sh [--bench-only]   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
if [[ "${1:-}" != "--bench-only" ]]; then
  echo "== pytest tests/gpu/test_offload_cuda.py"
  timeout "${TEST_BUDGET_S:-240}" python -m pytest tests/gpu/test_offload_cuda.py -q -p no:cacheprovider \
    --tb=short -ra 2>&1 | grep -v "^\[magi" > "$OUT/pytest_offload.log"
  tail -60 "$OUT/pytest_offload.log"
fi
echo "== benchmarks/offload.py"
timeout "${BENCH_BUDGET_S:-300}" python benchmarks/offload.py --out "$OUT/offload.json" ${BENCH_ARGS:-} 2>&1 |
  grep -v "^\[magi" | tail -30
