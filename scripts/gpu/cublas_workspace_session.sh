#!/usr/bin/env bash
# Graphs own their cuBLAS workspace: the new CUDA-graph test at the fix, then with the fix
# reverted (.deps/cublas_fix.patch, carried) to see it fail; then the Llama-1B-shaped decode with
# magi_cg beside torch.compile's variants (which faulted before). Logs and JSON in $OUT.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "== with the fix"
gpu_pytest pytest_cublas_fixed.log 120 tests/gpu/test_cuda_graphs.py
echo "== decode: eager, magi_cg, inductor, inductor_ro"
timeout 220 python benchmarks/run.py --device cuda --only llama1b_decode \
  --variants eager,magi_cg,inductor,inductor_ro --out "$OUT/l1b_decode_fixed.json" \
  > "$OUT/l1b_decode_fixed.log" 2>&1
grep -v "^\[magi\|^DEBUG" "$OUT/l1b_decode_fixed.log" | grep -E "llama1b_|rror|illegal" | cut -c1-300 | head -12
echo "== without the fix"
patch -R -p1 < .deps/cublas_fix.patch && bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo rebuild failed; exit 1; }
gpu_pytest pytest_cublas_reverted.log 120 tests/gpu/test_cuda_graphs.py -k cublas
grep -E "illegal|ok [0-9]" "$OUT/pytest_cublas_reverted.log" | head -3
