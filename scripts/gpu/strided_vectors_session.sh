#!/usr/bin/env bash
# 2026-11-28 (issues 5 and 6): strided inputs loaded as whole vectors (KernelVariant::
# strided_vectors, MAGI_STRIDED_VECTORS). Build; the CUDA fusion tests that run strided
# kernels; then with MAGI_STRIDED_VECTORS=1 and 0, each in its own process: the Llama
# prefill's kernel profile (the q and k rotaries' time per step) and bandwidth.py's rotary
# (16384 x 8192) beside torch.compile; last the prefill timed beside torch.compile with the
# default.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest (strided and rotary kernels)" | tee -a "$S"
gpu_pytest pytest_strided.log 240 tests/gpu/test_fusion_cuda.py -rf \
  -k "rotary or rotate or precompiled or strided or transpos or broadcast" | tee -a "$S"
for sv in 1 0; do
  echo "== MAGI_STRIDED_VECTORS=$sv: prefill kernel profile (magi)" | tee -a "$S"
  MAGI_STRIDED_VECTORS=$sv timeout 100 python scripts/gpu/profile_workloads.py \
    --only llama_prefill --variants magi --rows 8 --json "$OUT/profile_sv$sv.json" 2>&1 |
    grep -E "fused_mul_slice|fused_slice|busy|=====" | tee -a "$S"
  echo "== MAGI_STRIDED_VECTORS=$sv: bandwidth, rotary 16384 x 8192" | tee -a "$S"
  MAGI_STRIDED_VECTORS=$sv timeout 150 python benchmarks/bandwidth.py --device cuda \
    --no-compile-latency --variants torch.compile,magi_compile --only rotary \
    --out "$OUT/bandwidth_sv$sv.json" 2>&1 | grep -v "^\[magi" | tail -4 | tee -a "$S"
done
echo "== prefill, magi_compile (strided vectors) beside torch.compile" | tee -a "$S"
timeout 150 python benchmarks/run.py --device cuda --only llama_prefill \
  --variants magi,magi_cg,inductor --out "$OUT/prefill.json" 2>&1 | grep -v "^\[magi" | tail -3
python scripts/gpu/prefill_ratio.py "$OUT/prefill.json" strided_vectors | tee -a "$S"
