#!/usr/bin/env bash
# 2026-11-28 (issue 6): the record after the runner's lock and the strided vectors. The GPU
# tests the whole-tier run before this one did not reach or failed (test_runtime_choices_cuda.py,
# the loop test of test_cuda_graphs.py, made independent of the allocator's addresses), then
# the host time per call of the 4-layer stack at batch 4 x 32 with 4 input tensors in turn
# (variants alternating) beside reduce-overhead, and the Llama stack (prefill and small batch)
# beside torch.compile. At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: the loop test, runtime choices" | tee -a "$S"
gpu_pytest gpu_tests.log 120 tests/gpu/test_cuda_graphs.py tests/gpu/test_runtime_choices_cuda.py \
  -k "loop or threads or stream or runtime_choices" | tee -a "$S"
echo "== host overhead" | tee -a "$S"
timeout 130 python benchmarks/host_overhead.py --device cuda \
  --variants magi_cg,magi_cg_args,magi_cg,magi_cg_args,inductor_ro \
  --out "$OUT/host_overhead.json" 2>&1 | grep -v "^\[magi" | grep -E "µs|graphs|reduce" | tail -7 | tee -a "$S"
echo "== llama stack" | tee -a "$S"
timeout 200 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/llama_stack.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
python scripts/gpu/prefill_ratio.py "$OUT/llama_stack.json" prefill | tee -a "$S"
