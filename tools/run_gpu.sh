#!/usr/bin/env bash
# Usage: bash tools/run_gpu.sh [phase ...]   phases: build tests quickstart bench zoo profile prefill
#   decode attention
# (default: the first four). On the GPU machine: builds into build/gpu, runs the CUDA tests,
# the quick start and the benchmarks, writing logs and result JSON to $OUT. Needs .deps/
# (tools/stage_deps.sh). The other tools call `tools/run_gpu.sh build` first.
# zoo: benchmarks/zoo.py one family per process (ZOO_MODELS, default all six; ZOO_ARGS more
# options, ZOO_DEADLINE: no family starts later than that many seconds after this script did,
# default 540; each family ends by then too), each appended to $OUT/zoo.json as
# it finishes, which starts as a copy of benchmarks/results/cuda_<gpu>_zoo.json when one exists
# for this GPU: a run cut short keeps the families done, and the next one adds the rest.
# profile: tools/kernel_profile.py --zoo over ZOO_PROFILE (family:scenario:batch,...; default the
# rows where magi was slower) into $OUT/zoo_profile.json, kept as cuda_<gpu>_zoo_profile.json.
# prefill: benchmarks/long_prefill.py (PREFILL_ARGS more options, e.g. --models llama --tokens
# 100000) appended to $OUT/long_prefill.json, which starts as a copy of
# benchmarks/results/cuda_<gpu>_long_prefill.json when one exists; at most 540 s.
# decode: benchmarks/decode.py (DECODE_ARGS more options, e.g. --batches 1 --contexts 1024)
# appended to $OUT/decode.json, likewise started from cuda_<gpu>_decode.json; at most 540 s.
# attention: benchmarks/attention.py (ATTENTION_ARGS, e.g. --tokens 8192 --masks causal), likewise.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
phases="${*:-build tests quickstart bench}"
t0=$(date +%s)
has() { [[ " $phases " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/device.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/device.txt"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/NVIDIA //; s/ .*//' | tr 'A-Z' 'a-z')

if has build || [[ ! -e build/gpu/build.ninja ]]; then
  echo "== build"
  start=$(date +%s)
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAGI_DEPS_DIR="$PWD/.deps" \
    -DPython3_EXECUTABLE="$(which python)" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C build/gpu >"$OUT/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$OUT/build.log" | head -60; exit 1; }
  echo "built in $(( $(date +%s) - start )) s"
fi
ln -sf "$PWD"/build/gpu/python/csrc/_C*.so python/magi_compiler/

if has tests; then
  echo "== pytest tests/gpu"
  timeout 360 python -m pytest tests/gpu -q -ra -p no:cacheprovider --durations=8 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
fi
if has quickstart; then
  echo "== quick start"
  timeout 180 python examples/quickstart.py 2>&1 | tee "$OUT/quickstart.log" | tail -12
fi
if has bench; then
  for b in bandwidth host_overhead; do
    echo "== benchmarks/$b.py"
    timeout 240 python benchmarks/$b.py --device cuda --out "$OUT/$b.json" 2>&1 | tee "$OUT/$b.log" | tail -25
  done
  echo "== benchmarks/run.py"
  timeout 480 python benchmarks/run.py --device cuda --out "$OUT/suite.json" 2>&1 | tee "$OUT/suite.log" | tail -40
fi
if has zoo; then
  kept="benchmarks/results/cuda_${gpu}_zoo.json"
  [[ -e "$kept" && ! -e "$OUT/zoo.json" ]] && cp "$kept" "$OUT/zoo.json"
  for m in ${ZOO_MODELS:-llama qwen3 gpt2 bert vit t5}; do
    left=$(( ${ZOO_DEADLINE:-540} - ($(date +%s) - t0) ))
    (( left < 60 )) && { echo "== zoo: $m not run ($left s left)"; continue; }
    echo "== zoo $m ($left s left)"
    timeout "$left" python benchmarks/zoo.py --device cuda --models "$m" ${ZOO_ARGS:-} \
      --out "$OUT/zoo.json" --append 2>&1 | tee -a "$OUT/zoo.log" | grep "^| $m "
  done
fi
if has profile; then
  specs=${ZOO_PROFILE:-gpt2:whole:8,vit:whole:8,t5:whole:1,llama:layers:1}
  echo "== zoo profile $specs"
  timeout 540 python tools/kernel_profile.py --zoo "$specs" --variants inductor,magi,inductor_ro,magi_cg \
    --json "$OUT/zoo_profile.json" >"$OUT/zoo_profile.log" 2>&1 || tail -20 "$OUT/zoo_profile.log"
fi
# run_kept NAME ARGS...: benchmarks/NAME.py appended to $OUT/NAME.json, started from the kept
# results of this GPU.
run_kept() {
  local name=$1 kept="benchmarks/results/cuda_${gpu}_$1.json"
  shift
  [[ -e "$kept" && ! -e "$OUT/$name.json" ]] && cp "$kept" "$OUT/$name.json"
  echo "== $name $*"
  timeout 540 python "benchmarks/$name.py" --device cuda "$@" --out "$OUT/$name.json" --append \
    2>&1 | tee "$OUT/$name.log" | grep "^\["
}
if has prefill; then run_kept long_prefill ${PREFILL_ARGS:-}; fi
if has decode; then run_kept decode ${DECODE_ARGS:-}; fi
if has attention; then run_kept attention ${ATTENTION_ARGS:-}; fi
