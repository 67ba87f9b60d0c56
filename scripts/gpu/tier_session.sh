#!/usr/bin/env bash
# The CUDA test tier at the session's final kernel and runtime code, in one call: build; every
# file of tests/gpu (fusion first). Logs land in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== pytest tests/gpu"
gpu_pytest pytest_gpu.log "${TIER_LIMIT:-520}" tests/gpu
