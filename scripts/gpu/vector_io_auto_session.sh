#!/usr/bin/env bash
# Issue 5 (2026-11-28, sixth session): the new default MAGI_VECTOR_IO=auto (rows held in
# registers and reduced once read under L2 evict_last with whole plain stores; every other
# kernel streams as cs did) against cs, each in its own process beside torch.compile: the four
# row kernels at four shapes, then the Llama prefill; last the CUDA fusion tests.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
gpu_row_bandwidth "$S" auto
gpu_row_run "$S" auto_32768 32768 8192
gpu_row_run "$S" cs_32768 32768 8192 MAGI_VECTOR_IO=cs
gpu_row_run "$S" auto_8192x16384 8192 16384
gpu_row_run "$S" auto_16384x5120 16384 5120
gpu_row_run "$S" cs_16384x5120 16384 5120 MAGI_VECTOR_IO=cs
for io in auto cs; do
  echo "== llama prefill, MAGI_VECTOR_IO=$io" | tee -a "$S"
  MAGI_VECTOR_IO=$io timeout 120 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants inductor,magi --out "/tmp/prefill_$io.json" 2>&1 | grep -v "^\[magi" | tail -6 | tee -a "$S"
done
echo "== CUDA fusion tests" | tee -a "$S"
gpu_pytest tests_fusion.log 200 tests/gpu/test_fusion_cuda.py | tee -a "$S"
mv "$OUT/tests_fusion.log" /tmp/  # eight files come back: the summary, device.txt, six JSON
