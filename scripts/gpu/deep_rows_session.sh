#!/usr/bin/env bash
# Issue 5, deep rows (row kernels reduced twice whose row fills a block: 8 chunks on 128
# threads): the CUDA fusion tests, the full bandwidth table with compile latency, the row
# kernels with deep rows on and off (MAGI_DEEP_ROWS=0) in two processes, each beside
# torch.compile, and the Llama prefill beside torch.compile.   Logs and JSON in $OUT.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== tests/gpu/test_fusion_cuda.py"
gpu_pytest pytest_fusion.log 240 tests/gpu/test_fusion_cuda.py
echo "== benchmarks/bandwidth.py"
timeout 240 python benchmarks/bandwidth.py --device cuda --variants torch.compile,magi_compile \
  --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -14
SWEEP_ONLY=rmsnorm,add_rmsnorm,layer_norm,softmax bash scripts/gpu/sweep_env.sh "MAGI_DEEP_ROWS=0" "" 2>&1 |
  grep -v "^\[magi"
echo "== Llama prefill"
timeout 150 python benchmarks/run.py --device cuda --only llama_prefill --variants inductor,magi \
  --out "$OUT/prefill.json" 2>&1 | grep -v "^\[magi" | tail -4
