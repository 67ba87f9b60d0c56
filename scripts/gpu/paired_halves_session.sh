#!/usr/bin/env bash
# Paired halves for rotate_half kernels (KernelVariant::pair_half): build; the CUDA tests that
# run rotary kernels (the fusion patterns rotary, rotary_grad and rotate_computed in three
# dtypes, the paired-against-unpaired test, the precompile test of a Llama block); then with
# MAGI_PAIRED_HALVES=1 and 0, each in its own process: the Llama prefill's kernel profile
# (magi_compile; the q and k rotaries' time per step) and bandwidth.py's rotary at the benchmark
# shape (16384 x 8192, 64 heads) beside torch.compile; last the prefill timed beside
# torch.compile with the default (paired).   Logs and JSON in $OUT.   (carry .deps)
# Ran at 235b783 (H200, 2026-11-27); the paired variant gained nothing and was reverted in the
# next commit, so MAGI_PAIRED_HALVES no longer exists: kept as the record of that measurement.
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
echo "== pytest (rotary kernels)" | tee -a "$S"
gpu_pytest pytest_rotary.log 200 tests/gpu/test_fusion_cuda.py -rf \
  -k "rotary or rotate or precompiled" | tee -a "$S"
for p in 1 0; do
  echo "== MAGI_PAIRED_HALVES=$p: prefill kernel profile (magi)" | tee -a "$S"
  MAGI_PAIRED_HALVES=$p timeout 100 python scripts/gpu/profile_workloads.py --only llama_prefill \
    --variants magi --rows 8 --json "$OUT/profile_p$p.json" 2>&1 |
    grep -E "fused_mul_slice|fused_slice|busy|=====" | tee -a "$S"
  echo "== MAGI_PAIRED_HALVES=$p: bandwidth, rotary 16384 x 8192" | tee -a "$S"
  MAGI_PAIRED_HALVES=$p timeout 150 python benchmarks/bandwidth.py --device cuda \
    --no-compile-latency --variants eager,torch.compile,magi_compile --only rotary \
    --out "$OUT/bandwidth_p$p.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
done
echo "== prefill, magi_compile (paired) beside torch.compile" | tee -a "$S"
timeout 150 python benchmarks/run.py --device cuda --only llama_prefill \
  --variants magi,magi_cg,inductor --out "$OUT/prefill.json" 2>&1 | grep -v "^\[magi" | tail -3
python scripts/gpu/prefill_ratio.py "$OUT/prefill.json" paired | tee -a "$S"
