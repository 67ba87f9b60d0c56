#!/usr/bin/env bash
# One device call for automatic recomputation in training (after `bash scripts/gpu/run_gpu.sh
# build`, which builds the extension and links it into python/magi_compiler): bfloat16 training
# steps of a 4-layer Llama-style stack and a 2-layer Llama-3-8B-shaped stack, eager,
# torch.compile (default and with activation_memory_budget) and magi_compile (HEURISTIC and
# AUTOSEARCH at three budgets) side by side: step time, measured activation peak, the planner's
# prediction (benchmarks/recompute.py). JSON and log land in $OUT; the JSON is rewritten after
# every variant, so a timeout still leaves what was measured. Extra arguments go to the script
# (e.g. --only llama4, --tc-budgets 0.3,0.5).
#   bash scripts/gpu/run_gpu.sh build && bash scripts/gpu/recompute_session.sh   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
if ! python -c "import magi_compiler._C" 2>"$OUT/recompute_import.log"; then
  echo "magi_compiler._C does not import: run 'bash scripts/gpu/run_gpu.sh build' first"
  tail -5 "$OUT/recompute_import.log"
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== benchmarks/recompute.py"
json="$OUT/cuda_h100_recompute.json"
timeout 540 python benchmarks/recompute.py --device cuda --out "$json" "$@" 2>&1 |
  tee "$OUT/recompute.log" | grep -v -e "^\[magi" -e "^W[0-9]" -e "FutureWarning" -e "var_to_val"
status=${PIPESTATUS[0]}
((status == 124)) && echo "recompute.py: timed out after 540 s (partial JSON kept)"
if [[ -f "$json" ]]; then  # the section report.py will render, to read at once
  python -c "import json, sys; sys.path.insert(0, 'benchmarks'); import report
print(report.extra_section(json.load(open(sys.argv[1])), sys.argv[1]))" "$json" \
    >"${json%.json}.md" 2>&1 && echo "markdown: ${json%.json}.md"
fi
exit "$status"
