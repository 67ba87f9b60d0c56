#!/usr/bin/env bash
# Row-kernel tuning on the GPU machine (after `run_gpu.sh build`): for each setting, a string of
# environment assignments (the tuning variables of docs/config.md), one process of
# benchmarks/bandwidth.py with torch.compile and magi_compile timed side by side (interleaved).
# With INDUCTOR_CODE=1 also writes the Triton code torch.compile generates for RMSNorm and
# LayerNorm ($OUT/inductor_code.log). SWEEP_ARGS adds arguments to bandwidth.py (another shape),
# SWEEP_ONLY picks the workloads.
#   bash scripts/gpu/sweep_env.sh "" "MAGI_ROW_CHUNKS=2 MAGI_MAX_BLOCK_THREADS=512" ...
set -uo pipefail
source "$(dirname "$0")/env.sh"
if [[ "${INDUCTOR_CODE:-0}" == 1 ]]; then
echo "== Triton code of torch.compile (RMSNorm, LayerNorm; 16384 x 8192 bf16)"
TORCH_LOGS=output_code timeout 120 python - >"$OUT/inductor_code.log" 2>&1 <<'PY'
import sys, torch
sys.path.insert(0, "benchmarks")
from bandwidth import rmsnorm, layer_norm
x = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
w = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
torch.compile(rmsnorm)(x, w)
torch.compile(layer_norm)(x, w, w)
PY
grep -E "def triton|reduction_hint" "$OUT/inductor_code.log" | head -20
fi
i=0
for setting in "$@"; do
  i=$((i + 1))
  echo "== setting $i: ${setting:-defaults}"
  env $setting timeout 180 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
    --variants torch.compile,magi_compile --only "${SWEEP_ONLY:-rmsnorm,add_rmsnorm,layer_norm,softmax}" \
    ${SWEEP_ARGS:-} --out "$OUT/sweep_env_$i.json" 2>&1 | tail -6
done
