#!/usr/bin/env bash
# One call on the GPU machine: build, run the CUDA tests and the quick start, write logs to
# $OUT. Needs .deps/ (scripts/gpu/stage_deps.sh) carried along. Usage on the device:
#   bash scripts/gpu/run_gpu.sh [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/magi_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/device.txt"

echo "== build"
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMAGI_DEPS_DIR="$PWD/.deps" \
  -DPython3_EXECUTABLE="$(which python)" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build/gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
ln -sf "$PWD"/build/gpu/python/csrc/_C*.so python/magi_compiler/
export PYTHONPATH="$PWD/python"

echo "== pytest (tests/gpu and tests/python)"
python -m pytest tests/gpu tests/python -q -ra "$@" 2>&1 | tee "$OUT/pytest.log" | tail -25

echo "== quick start"
python examples/quickstart.py 2>&1 | tee "$OUT/quickstart.log" | tail -12
