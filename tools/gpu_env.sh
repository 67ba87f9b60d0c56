# Sourced by the scripts in scripts/gpu: moves to the repository root and sets the environment
# every run on the GPU machine shares. $OUT (default /tmp/magi_out) receives logs and JSON.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-/tmp/magi_out}"
mkdir -p "$OUT"
# The GPU machine's default CXX wraps g++ with a static libstdc++; an extension built that way
# carries a second libstdc++ beside torch's, and iostreams crash. Use the system compiler, also
# for generated CPU kernels.
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAGI_CXX=/usr/bin/g++
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python"
export MAGI_CACHE_DIR="${MAGI_CACHE_DIR:-/tmp/magi_kernel_cache}"

# gpu_pytest LOG SECONDS ARGS...: pytest ARGS under a time limit, the log (debug lines dropped)
# in $OUT/LOG, and its summary lines printed.
gpu_pytest() {
  local log="$1" limit="$2"
  shift 2
  timeout "$limit" python -m pytest "$@" -q -p no:cacheprovider --tb=short 2>&1 |
    grep -v "^DEBUG\|^\[magi" > "$OUT/$log"
  grep -E "passed|failed|^E |^FAILED" "$OUT/$log" | tail -12
}

# gpu_profile WORKLOADS ROWS SECONDS: a kernel-level profile of WORKLOADS (comma-separated)
# under torch.compile and magi_compile, ROWS kernels per variant, into $OUT/profile.{json,log};
# the filtered log on stdout.
gpu_profile() {
  timeout "$3" python scripts/gpu/profile_workloads.py --only "$1" --variants inductor,magi \
    --rows "$2" --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log" | grep -v "^\[magi"
}

# gpu_build SUMMARY LINES: builds (run_gpu.sh build) and appends the first LINES lines of its
# output (the device and torch) to SUMMARY; on a failed build prints the output and exits.
gpu_build() {
  bash scripts/gpu/run_gpu.sh build > /tmp/build_summary.txt 2>&1 || { cat /tmp/build_summary.txt; exit 1; }
  head -"$2" /tmp/build_summary.txt | tee -a "$1"
}

# gpu_row_run SUMMARY LABEL ROWS COLS [VAR=VALUE ...]: bandwidth.py's four row kernels
# (RMSNorm, add+RMSNorm, LayerNorm, softmax) at ROWS x COLS beside torch.compile, in a process
# of their own with the settings given (and the caller's environment), into
# ${ROW_JSON_DIR:-$OUT}/band_LABEL.json, in the element type ${ROW_DTYPE:-bfloat16}; the table
# appended to SUMMARY.
gpu_row_run() {
  local summary="$1" label="$2" rows="$3" cols="$4"
  shift 4
  echo "== $label ($rows x $cols ${ROW_DTYPE:-bfloat16}) $*" | tee -a "$summary"
  env "$@" timeout 100 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
    --variants torch.compile,magi_compile --only rmsnorm,add_rmsnorm,layer_norm,softmax \
    --rows "$rows" --cols "$cols" --dtype "${ROW_DTYPE:-bfloat16}" --out "${ROW_JSON_DIR:-$OUT}/band_$label.json" 2>&1 |
    grep -v "^\[magi" | grep -E "%|copy" | tail -6 | tee -a "$summary"
}

# gpu_row_bandwidth SUMMARY LABEL: gpu_row_run at bandwidth.py's full size, 16384 x 8192.
gpu_row_bandwidth() { gpu_row_run "$1" "$2" 16384 8192; }

# gpu_host_time SUMMARY: the 4-layer stack's host time per call in both guard modes beside
# reduce-overhead (host_overhead.py, $OUT/host_overhead.json; the variants and their order from
# $HOST_VARIANTS, default "magi_cg,magi_cg_args,inductor_ro"), then host_floor.py's stage
# breakdown ($OUT/host_floor.json; guard modes in the order $HOST_FLOOR_MODES lists, default
# "default,arguments"), each summarised into SUMMARY.
gpu_host_time() {
  echo "== host overhead" | tee -a "$1"
  timeout 200 python benchmarks/host_overhead.py --device cuda \
    --variants "${HOST_VARIANTS:-magi_cg,magi_cg_args,inductor_ro}" \
    --out "$OUT/host_overhead.json" 2>&1 | grep -v "^\[magi" | tail -12 | tee -a "$1"
  echo "== host floor" | tee -a "$1"
  timeout 240 python scripts/gpu/host_floor.py --modes "${HOST_FLOOR_MODES:-default,arguments}" \
    --json "$OUT/host_floor.json" > /dev/null 2>&1
  python - "$OUT/host_floor.json" <<'PY' | tee -a "$1"
import json, sys
d = json.load(open(sys.argv[1]))
short = lambda v: round(v, 2) if isinstance(v, float) else v
print({k: short(v) for k, v in d.items() if not isinstance(v, dict)})
for mode, v in d.items():
    if isinstance(v, dict):
        print(mode, {k: short(x) for k, x in v.items()})
PY
}
