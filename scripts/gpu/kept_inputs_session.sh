#!/usr/bin/env bash
# Issue 6 (2026-11-28, afternoon), after steady_inputs_session.sh: direct calls also keep the
# graph inputs a runner borrows (the parameters' entries stay from call to call; no reference
# counting for the unchanged) and read a parameter's memory without copying its Storage. The
# GPU tests of graphs and direct calls; host time per call (alternating order, then
# host_floor.py); the Llama stack (prefill and small batch) beside torch.compile.
# At most 8 files in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU: graphs, padding, direct calls, input updates" | tee -a "$S"
gpu_pytest gpu_tests.log 200 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_runtime_choices_cuda.py tests/gpu/test_input_updates_cuda.py | tee -a "$S"
HOST_VARIANTS=magi_cg_args,magi_cg,magi_cg_args,magi_cg,inductor_ro \
  HOST_FLOOR_MODES=arguments,default gpu_host_time "$S"
echo "== llama stack" | tee -a "$S"
timeout 200 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/llama_stack.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
python scripts/gpu/prefill_ratio.py "$OUT/llama_stack.json" prefill | tee -a "$S"
