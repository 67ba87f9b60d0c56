#!/usr/bin/env bash
# Follow-up of runtime_session.sh: the runtime GPU tests with full tracebacks, where a 4 x 32
# step's GPU time goes under CUDA graphs (magi FULL vs torch.compile reduce-overhead, kernels
# by name), and host time per call of the graph variants. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest (runtime choices)"
timeout 180 python -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_runtime_choices_cuda.py \
  tests/gpu/test_cuda_graphs.py 2>&1 | grep -v "^DEBUG\|^\[magi" | tail -40
echo "== profile (llama_small_batch)"
timeout 200 python scripts/gpu/profile_workloads.py --only llama_small_batch --variants magi_cg,inductor_ro \
  --rows 30 --json "$OUT/profile_small.json" 2>&1 | grep -v "^\[magi" | tail -75
echo "== host time per call"
timeout 150 python benchmarks/host_overhead.py --device cuda --variants magi,magi_cg,inductor_ro \
  --out "$OUT/host_overhead.json" 2>&1 | grep -v "^\[magi" | tail -8
