#!/usr/bin/env bash
# Targeted re-run after runtime_session.sh: the attention-choice tests and the recompute peak
# test, the latter with and without constant folding (MAGI_FOLD_CONSTANTS). (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== attention choices and direct dispatch"
timeout 150 python -m pytest -q -p no:cacheprovider --tb=line tests/gpu/test_runtime_choices_cuda.py 2>&1 |
  grep -v "^DEBUG\|^\[magi\|^E  \+/" | grep -E "passed|failed|Error|FAILED" | tail -12
for fold in 1 0; do
  echo "== recompute peak test, MAGI_FOLD_CONSTANTS=$fold"
  MAGI_FOLD_CONSTANTS=$fold timeout 120 python -m pytest -q -s -p no:cacheprovider --tb=line \
    tests/gpu/test_recompute_cuda.py -k measured_activation_peak 2>&1 |
    grep -E "measured peaks|passed|failed|assert " | tail -5
done
