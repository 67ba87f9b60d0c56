#!/usr/bin/env bash
# Strided kernels with the index rank as a constant and 32-bit offsets, lone column sums as
# column kernels (issues 5 and 9): build; the CUDA fusion tests; bandwidth of rotary, the bias
# gradient, RMSNorm and SiLU-mul; a kernel profile of the Llama training step beside
# torch.compile's. Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest tests/gpu/test_fusion_cuda.py"
gpu_pytest pytest_fusion.log 200 tests/gpu/test_fusion_cuda.py
echo "== benchmarks/bandwidth.py"
timeout 150 python benchmarks/bandwidth.py --device cuda --only rotary,bias_grad,rmsnorm,silu_mul \
  --no-compile-latency --out "$OUT/bandwidth.json" 2>&1 | grep -v "^\[magi" | tail -10
echo "== profile llama_train"
gpu_profile llama_train 40 200 | sed -n '/llama_train \/ magi/,$p' | head -60
