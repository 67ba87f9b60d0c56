#!/usr/bin/env bash
# For the session after 2026-11-28 (issues 5 and 6): bf16 pointwise bodies on packed pairs
# (MAGI_PACKED_BF16, off by default until this runs). Build; the GPU test of bit-exact results
# and the rotary patterns; then with MAGI_PACKED_BF16=1 and 0, each in its own process: the
# Llama prefill's kernel profile (the q and k rotaries' time per step) and bandwidth.py's
# rotary and x*y+z (16384 x 8192) beside torch.compile.   Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest (packed pairs, rotary kernels)" | tee -a "$S"
gpu_pytest pytest_packed.log 240 tests/gpu/test_fusion_cuda.py -rf \
  -k "packed or rotary or rotate or strided" | tee -a "$S"
for p in 1 0; do
  echo "== MAGI_PACKED_BF16=$p: prefill kernel profile (magi)" | tee -a "$S"
  MAGI_PACKED_BF16=$p timeout 100 python scripts/gpu/profile_workloads.py \
    --only llama_prefill --variants magi --rows 8 --json "$OUT/profile_p$p.json" 2>&1 |
    grep -E "fused_mul_slice|fused_slice|busy|=====" | tee -a "$S"
  echo "== MAGI_PACKED_BF16=$p: bandwidth, rotary and x*y+z 16384 x 8192" | tee -a "$S"
  MAGI_PACKED_BF16=$p timeout 150 python benchmarks/bandwidth.py --device cuda \
    --no-compile-latency --variants torch.compile,magi_compile --only rotary,"x*y+z" \
    --out "$OUT/bandwidth_p$p.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
done
