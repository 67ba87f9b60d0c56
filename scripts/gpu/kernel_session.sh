#!/usr/bin/env bash
# One device call after a change to the generated kernels: build, the CUDA tests, the bandwidth
# benchmark at its defaults (with compile latency), the row kernels at head-sized rows
# (393216 x 128), then the settings given as arguments (scripts/gpu/sweep_env.sh form).
# Everything lands in $OUT/kernel_session.tgz, the main JSON and logs also beside it.
#   bash scripts/gpu/kernel_session.sh ["ENV=VALUE ..." ...]        (carry .deps)
set -uo pipefail
final_out="${OUT:-/tmp/magi_final}"
mkdir -p "$final_out"
export OUT=/tmp/magi_out
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build tests || exit 1
echo "== bandwidth.py at the defaults"
timeout 300 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  tee "$OUT/bandwidth.log" | grep -v "^\[magi" | tail -16
echo "== bandwidth, rows of 128"
timeout 120 python benchmarks/bandwidth.py --device cuda --no-compile-latency --rows 393216 --cols 128 \
  --only rmsnorm,layer_norm,softmax --out "$OUT/bandwidth_rows128.json" 2>&1 |
  tee "$OUT/bandwidth_rows128.log" | tail -6
(($#)) && bash scripts/gpu/sweep_env.sh "$@"
tar czf "$final_out/kernel_session.tgz" -C "$OUT" .
cp "$OUT"/bandwidth.json "$OUT"/bandwidth_rows128.json "$OUT"/pytest_gpu.log "$final_out"/ 2>/dev/null
true
