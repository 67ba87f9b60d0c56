#!/usr/bin/env bash
# One device call to check the last session's untested changes and find where time and memory
# go: build; the CUDA-graph tests; a kernel-level profile of the Llama training step and
# prefill (torch.compile beside magi); the CUDA graphs' memory and a graph launch's host floor;
# whether ncu is there. Logs and JSON land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest CUDA-graph tests"
gpu_pytest pytest_graphs.log 200 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py
echo "== graph memory and launch floor"
timeout 200 python scripts/gpu/graph_memory.py 2>&1 | grep -v "^\[magi" | tail -12
echo "== profile ${PROFILE_ONLY:-llama_train,llama_prefill}"
gpu_profile "${PROFILE_ONLY:-llama_train,llama_prefill}" "${PROFILE_ROWS:-40}" 300 | tail -150
echo "== tools"
which ncu nsys 2>&1; ls /usr/local/cuda/bin 2>/dev/null | grep -i -E "ncu|nsys|nsight" | head
