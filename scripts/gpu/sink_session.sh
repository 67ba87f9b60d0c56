#!/usr/bin/env bash
# Issue 9 / 5: groups recompute cheap wide values where they are read (sink_cheap_outputs) and
# pointwise siblings merge (merge_siblings). Build; the fusion and recompute CUDA tests; a
# kernel profile of the training step beside torch.compile. Logs land in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_sink.log 300 tests/gpu/test_fusion_cuda.py tests/gpu/test_recompute_cuda.py
echo "== profile llama_train"
gpu_profile llama_train 40 200 | tail -60
