#!/usr/bin/env bash
# The whole CUDA test tier (tests/gpu) in one call, the log kept in $OUT as it is written
# (a run stopped at its time limit still returns what passed).   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
timeout "${TESTS_LIMIT:-520}" python -m pytest tests/gpu -q -ra -p no:cacheprovider --tb=short \
  --durations=12 2>&1 | grep --line-buffered -v "^DEBUG\|^\[magi" > "$OUT/pytest_gpu.log"
grep -E "passed|failed|^E |^FAILED|^ERROR|slowest|^[0-9.]+s (call|setup)" "$OUT/pytest_gpu.log" | tail -30 | tee -a "$S"
