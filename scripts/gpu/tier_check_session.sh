#!/usr/bin/env bash
# Two device calls that rerun the rest of the CUDA test tier at one commit:
#   PART=training: build; benchmarks/recompute.py (issue 9: HEURISTIC and AUTOSEARCH beside
#     eager and torch.compile); the recompute, memory-trace and runtime-choice test files.
#   PART=inference: build; the driver, end-to-end, custom-op, fusion and offload test files.
# (The CUDA-graph, padding, arena and API files ran in scripts/gpu/input_nodes_session.sh.)
# Logs and JSON in $OUT.   PART=training bash scripts/gpu/tier_check_session.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
case "${PART:?set PART=training or PART=inference}" in
training)
  echo "== benchmarks/recompute.py"
  timeout 310 python benchmarks/recompute.py --device cuda --budget-s 290 --steps 40 --rounds 4 \
    --out "$OUT/cuda_h100_recompute.json" 2>&1 | tee "$OUT/recompute.log" |
    grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val" | tail -30
  echo "== pytest (training, memory trace, runtime choices)"
  gpu_pytest pytest_training.log 320 tests/gpu/test_recompute_cuda.py \
    tests/gpu/test_memory_trace_cuda.py tests/gpu/test_runtime_choices_cuda.py -rfs
  ;;
inference)
  echo "== pytest (API, driver, end to end, custom ops, fusion)"
  gpu_pytest pytest_inference.log 520 tests/gpu/test_cuda_driver.py \
    tests/gpu/test_cuda_end_to_end.py tests/gpu/test_custom_ops_cuda.py \
    tests/gpu/test_fusion_cuda.py tests/gpu/test_offload_cuda.py -rfs
  ;;
esac
