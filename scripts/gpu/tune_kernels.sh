#!/usr/bin/env bash
# One device call for the generated-kernel schedules: build, optionally the CUDA tests, the
# bandwidth benchmark at the default settings (eager, torch.compile, magi_compile, compile
# latency), then row and pointwise launch-shape sweeps, at 16384 x 8192 and at two other
# shapes; one table of all settings last. Everything lands in one archive, $OUT/tune.tgz (the
# device tool returns at most 8 files).
#   TESTS=1 bash scripts/gpu/tune_kernels.sh            (carry .deps; see stage_deps.sh)
# ROW_SWEEP / POINTWISE_SWEEP / SHAPE_SWEEP: ';'-separated settings in the sweep scripts' form
# (empty: skipped).
set -uo pipefail
final_out="${OUT:-/tmp/magi_final}"
mkdir -p "$final_out"
export OUT=/tmp/magi_out
source "$(dirname "$0")/env.sh"
phases="build"
[[ "${TESTS:-0}" == 1 ]] && phases="build tests"
bash scripts/gpu/run_gpu.sh $phases || exit 1
echo "== bandwidth.py at the defaults"
timeout 240 python benchmarks/bandwidth.py --device cuda --out "$OUT/bandwidth.json" 2>&1 |
  tee "$OUT/bandwidth.log" | tail -14

# Each sweep runs its settings (';'-separated, in its script's form); an empty one is skipped.
sweep() {
  local script=$1 settings=$2 items
  IFS=';' read -r -a items <<<"$settings"
  ((${#items[@]})) && bash "scripts/gpu/$script" "${items[@]}" >>"$OUT/sweeps.log" 2>&1
  return 0
}
sweep sweep_rows.sh "${ROW_SWEEP-late 4 256 all;late 4 256 wave;row 4 256 all;late 2 512 all}"
sweep sweep_pointwise.sh "${POINTWISE_SWEEP-1 all silu_mul,x*y+z;1 wave silu_mul,x*y+z}"
# Other row lengths: many short rows (hidden 2048) and long rows that do not fit in registers.
shapes="${SHAPE_SWEEP-late 4 256 all;late 2 512 all}"
SWEEP_ARGS="--rows 65536 --cols 2048" SWEEP_TAG=_2048 sweep sweep_rows.sh "$shapes"
SWEEP_ARGS="--rows 4096 --cols 32768" SWEEP_TAG=_32768 sweep sweep_rows.sh "$shapes"
python scripts/gpu/summarize_sweeps.py "$OUT" | tee "$OUT/summary.txt"
tar czf "$final_out/tune.tgz" -C "$OUT" .
