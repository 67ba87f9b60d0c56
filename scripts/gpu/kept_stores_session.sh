#!/usr/bin/env bash
# Issues 5 and 6 (2026-11-27, evening): outputs that a matmul or attention reads are stored
# without the streaming hint (KOutput::keep), the others keep it (MAGI_VECTOR_IO=cs, the
# default). The CUDA tests, the Llama prefill beside torch.compile twice, the bandwidth table.
# One summary file and the JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 4
echo "== tests/gpu" | tee -a "$S"
timeout 300 python -m pytest tests/gpu/test_fusion_cuda.py tests/gpu/test_cuda_end_to_end.py \
  tests/gpu/test_recompute_cuda.py tests/gpu/test_api_cuda.py tests/gpu/test_cuda_graphs.py \
  -q -p no:cacheprovider --tb=short 2>&1 | grep -v "^DEBUG\|^\[magi" > /tmp/pytest_gpu.log
grep -E "passed|failed|^E |^FAILED" /tmp/pytest_gpu.log | tail -12 | tee -a "$S"
for round in 1 2; do
  timeout 150 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants inductor,magi,magi_cg --out "$OUT/prefill_$round.json" > /tmp/prefill_$round.log 2>&1
  python scripts/gpu/prefill_ratio.py "$OUT/prefill_$round.json" "prefill $round" | tee -a "$S"
done
echo "== bandwidth" | tee -a "$S"
timeout 200 python benchmarks/bandwidth.py --device cuda --variants eager,torch.compile,magi_compile \
  --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -13 | tee -a "$S"
