#!/usr/bin/env bash
# Third call of the native-dispatch session: the offload tests (their dump test failed in the
# second call, before direct calls stayed in Python under dumps) and the CUDA-graph tests, then
# the host benchmark and the interleaved host breakdown once more. Logs and JSON in $OUT.
#   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== tests"
gpu_pytest pytest_final.log 240 tests/gpu/test_offload_cuda.py tests/gpu/test_cuda_graphs.py
echo "== host overhead"
timeout 240 python benchmarks/host_overhead.py --device cuda \
  --variants magi_cg,magi_cg_args,magi_cg_no_direct,inductor_ro --out "$OUT/host_overhead.json" \
  2>&1 | grep -v "^\[magi" | tail -8
echo "== host breakdown"
timeout 150 python scripts/gpu/host_breakdown.py --iters 300 --rounds 5 \
  --json "$OUT/host_breakdown.json" 2>&1 | grep -v "^\[magi"
