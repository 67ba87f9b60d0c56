#!/usr/bin/env bash
# Pointwise outputs written over dying inputs (FusedKernel::reusable_input): build; the CUDA
# fusion tests and the SwiGLU peak test; the Llama stack's prefill and small batch side by side
# with eager and torch.compile (time and peak memory); a kernel and host profile of the prefill
# (what the host blocks on). Logs and JSON in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest"
gpu_pytest pytest_inplace.log 150 tests/gpu/test_fusion_cuda.py tests/gpu/test_cuda_graphs.py
echo "== benchmarks/run.py"
timeout 220 python benchmarks/run.py --device cuda --only llama_prefill,llama_small_batch \
  --out "$OUT/bench_inplace.json" 2>&1 | grep -v "^\[magi\|^DEBUG" | tee "$OUT/bench.log" | tail -24
echo "== profile (host)"
timeout 110 python scripts/gpu/profile_workloads.py --only llama_prefill --variants inductor,magi \
  --rows 12 --host --json "$OUT/profile_host.json" 2>&1 | grep -v "^\[magi" | tail -60
