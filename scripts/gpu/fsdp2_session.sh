#!/usr/bin/env bash
# Issue 9: the FSDP2 example on two GPUs of one host (nvidia-h200-x2): magi-compiled layers
# under fully_shard, gradients against the uncompiled run. Log in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
nvidia-smi -L
echo "== torchrun --nproc-per-node 2 examples/fsdp2_train.py"
NCCL_NVLS_ENABLE=0 timeout 300 torchrun --nproc-per-node 2 examples/fsdp2_train.py 2>&1 |
  tee "$OUT/fsdp2.log" | grep -v "^\[magi" | tail -40
echo "exit ${PIPESTATUS[0]}"
